"""What the SDK and the server agree on about ops, written once and read by both (torch-only imports).

The server's op table (``GET /v1/ops``) says per op what only it can know (its torch names, whether
it is differentiable, its ``shape_rule``, and its facts: ``relayout``, ``cpu_args``, ``maybe_view``,
...); the SDK caches it per server. What follows are the rules both sides apply to any op by its
name or kind, so neither keeps a copy:

- ``FACTORIES``: the ops without a tensor argument that make a new tensor on the session's device
  (the SDK's device kernels and ``sess.zeros(...)`` call them by name; the server registers exactly
  these, ``service/ops/factories.py``). ``RANDOM_FACTORIES`` draw from the session's generator.
- ``is_inplace_name``: a spelling that writes its first argument (``Tensor.add_``, ``__iadd__``).
- ``SHAPE_RULES``: the names of the rules by which the SDK may infer an op's outputs itself.
- ``autocast_applies``: whether a step runs under the caller's ``torch.autocast``.
"""

from __future__ import annotations

from typing import Callable

import torch

FACTORIES: dict[str, Callable] = {  # op name -> the torch factory whose meta run gives its outputs
    "zeros": torch.zeros, "ones": torch.ones, "full": torch.full, "empty": torch.empty, "arange": torch.arange,
    "linspace": torch.linspace, "eye": torch.eye, "rand": torch.rand, "randn": torch.randn,
    "randint": torch.randint, "randperm": torch.randperm,
}
RANDOM_FACTORIES = frozenset({"rand", "randn", "randint", "randperm"})


def is_inplace_name(name: str) -> bool:
    """``Tensor.add_``, ``torch._foreach_add_``, ``Tensor.__iadd__``: the spelling writes its first argument."""
    short = name.rsplit(".", 1)[-1]
    return (short.endswith("_") and not short.endswith("__")) or (  # __iadd__, not __invert__ or __index__
        short.startswith("__i") and short.endswith("__") and hasattr(torch.Tensor, f"__{short[3:]}"))


#   elementwise:       broadcast shapes, torch's type promotion
#   elementwise_float: the same, but integer results become the default float dtype (sqrt, exp, ...)
#   like_input:        the first argument's shape and dtype (normalisations, softmax without dtype=)
#   linear:            input[..., in] x weight[out, in] -> [..., out] (meta for anything unusual)
#   loss:              a 0-d tensor of the input's dtype unless reduction='none' (then meta)
#   meta:              run the torch function on the meta device
#   none:              ask the server (the client flushes and waits)
SHAPE_RULES = ("elementwise", "elementwise_float", "like_input", "linear", "loss", "meta", "none")


def autocast_applies(inplace: bool) -> bool:
    """Torch's autocast leaves in-place ops alone: such a step carries no autocast dtype and the
    server runs it as it is; any other step runs under the caller's autocast."""
    return not inplace
