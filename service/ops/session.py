"""Session-level ops: detach and the session generator's seed."""

from __future__ import annotations

from ._context import current
from ._registry import op
from ._samples import S, T


@op("detach", torch_names=("torch.detach", "torch.Tensor.detach"), samples=(S(T((2, 3))),),
    reference=lambda x: x.detach(), differentiable=False, exact=False)
def detach(input):
    """a new tensor sharing the values, cut from the graph"""
    return input.detach()


@op("manual_seed", samples=(S(0),), reference=None, differentiable=False, exact=False, shape_rule="none")
def manual_seed(seed):
    """seed the session's own generator (dropout and random factories draw from it)"""
    current().generator.manual_seed(int(seed))
    return ()
