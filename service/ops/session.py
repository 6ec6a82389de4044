"""Session-level ops: detach, ``Tensor.data`` (read and assigned) and the session generator's seed."""

from __future__ import annotations

from ._context import current
from ._registry import op
from ._samples import S, T


@op("detach", torch_names=("torch.detach", "torch.Tensor.detach"), samples=(S(T((2, 3))),),
    reference=lambda x: x.detach(), differentiable=False, exact=False)
def detach(input):
    """a new tensor sharing the values, cut from the graph"""
    return input.detach()


@op("data", samples=(S(T((2, 3))),), reference=lambda x: x.detach(), differentiable=False, exact=False)
def data(input):
    """``Tensor.data``: shares the values, cut from the graph, with a version counter of its own"""
    return input.data


def _set_data(input, value):
    input.data = value
    return input


@op("set_data", samples=(S(T((2, 3)), T((4,))), S(T((2,)), T((2, 2), dtype="float64", requires_grad=False))),
    reference=lambda input, value: value.detach().clone().requires_grad_(input.requires_grad), differentiable=False, exact=False, inplace=True,
    shape_rule="none", native_inplace=_set_data)
def set_data(input, value):
    """``input.data = value``: the handle keeps its identity and now holds ``value``'s tensor (shape and dtype too)"""
    return _set_data(input, value)


@op("manual_seed", samples=(S(0),), reference=None, differentiable=False, exact=False, shape_rule="none")
def manual_seed(seed):
    """seed the session's own generator (dropout and random factories draw from it)"""
    current().generator.manual_seed(int(seed))
    return ()
