"""In-place random fills (``uniform_``, ``normal_``): what ``nn.init`` runs, from the session's generator.

A module built under ``with torch.device(sess.device):`` is initialised by these on the
server; with the generator seeded like the client's (``torch.manual_seed`` seeds both),
the values equal a local build's.
"""

from __future__ import annotations

import torch

from ._context import current
from ._registry import op
from ._samples import S, T

_TARGET = T((3, 4), requires_grad=False)


def _uniform_(input, a=0.0, b=1.0, *, generator=None):
    return input.uniform_(a, b, generator=current().generator)


def _normal_(input, mean=0.0, std=1.0, *, generator=None):
    return input.normal_(mean, std, generator=current().generator)


@op("uniform_", torch_names=("torch.Tensor.uniform_",), inplace=True, differentiable=False, exact=False,
    shape_rule="none", native_inplace=_uniform_, samples=(S(_TARGET), S(_TARGET, -0.5, 0.5), S(_TARGET, 1.0, 3.0)),
    reference=lambda input, *args, **kwargs: input.clone().uniform_(*args, **kwargs))
def uniform_(input, a=0.0, b=1.0, *, generator=None):
    """values uniform in [a, b), in place, from the session's generator"""
    return _uniform_(input, a, b)


@op("normal_", torch_names=("torch.Tensor.normal_",), inplace=True, differentiable=False, exact=False,
    shape_rule="none", native_inplace=_normal_, samples=(S(_TARGET), S(_TARGET, 1.0, 0.02), S(_TARGET, std=2.0)),
    reference=lambda input, *args, **kwargs: input.clone().normal_(*args, **kwargs))
def normal_(input, mean=0.0, std=1.0, *, generator=None):
    """values from N(mean, std^2), in place, from the session's generator"""
    return _normal_(input, mean, std)
