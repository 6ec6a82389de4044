"""Session-level ops: ``Tensor.data`` (read and assigned) and the session generator's seed and state.

The generator's state crosses the wire as torch's own: a uint8 tensor (``torch.get_rng_state``'s
layout for a CPU generator, ``torch.cuda.get_rng_state``'s for a CUDA one), held on the session's
device like every tensor of the session, and given back to ``Generator.set_state`` on the CPU.
"""

from __future__ import annotations

import torch

from ._context import current
from ._registry import op
from ._samples import S, T


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


@op("get_rng_state", samples=(S(),), reference=None, differentiable=False, exact=False, shape_rule="none")
def get_rng_state():
    """the session generator's state, a uint8 tensor (what torch.cuda.get_rng_state gives for a GPU)"""
    ctx = current()
    return ctx.generator.get_state().to(ctx.device)


def _a_state_for_the_sessions_generator(new_state) -> None:
    """set_rng_state's contract (meta has no values to give ``Generator.set_state``): a 1-d uint8 tensor of
    the size of the session generator's own state."""
    if not isinstance(new_state, torch.Tensor) or new_state.dtype != torch.uint8 or new_state.dim() != 1:
        raise RuntimeError("set_rng_state: the state must be a 1-d uint8 tensor (what get_rng_state returned)")
    size = current().generator.get_state().numel()
    if new_state.numel() != size:
        raise RuntimeError(f"set_rng_state: the state has {new_state.numel()} bytes, the session's generator's "
                           f"has {size}")


@op("set_rng_state", samples=(S(T((5056,), dtype="uint8", requires_grad=False)),), reference=None,
    differentiable=False, exact=False, shape_rule="none", check=_a_state_for_the_sessions_generator)
def set_rng_state(new_state):
    """give the session's generator a state that get_rng_state returned"""
    current().generator.set_state(new_state.detach().cpu())
    return ()
