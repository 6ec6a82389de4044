"""``nn.init.*`` on RemoteTensors: torch's own Python bodies, run so their tensor calls reach us.

torch lets a tensor subclass override ``nn.init.kaiming_uniform_`` and friends as a whole
(``handle_torch_function``), but what they do is a few tensor calls (``size``,
``uniform_``, ``fill_``) that the server has. Each handler below is a copy of torch's
function whose ``torch.overrides`` check answers "no override", so the body runs
unchanged and every call in it is queued like any other (random fills draw from the
session's generator). A body needing an op the server lacks fails loudly at that op.
"""

from __future__ import annotations

import types

import torch
from torch.nn import init

from ._handler_table import HandlerTable

_INIT_FUNCTIONS = ("uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_",
                   "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_",
                   "sparse_")


class _OverridesSayNo:
    """``torch.overrides`` as the copied bodies see it: no argument has an override."""

    @staticmethod
    def has_torch_function_variadic(*args) -> bool:
        return False

    def __getattr__(self, name):
        return getattr(torch.overrides, name)


class _TorchForBodies:
    overrides = _OverridesSayNo()

    def __getattr__(self, name):
        return getattr(torch, name)


def _body(func: types.FunctionType) -> types.FunctionType:
    namespace = {**func.__globals__, "torch": _TorchForBodies()}
    copy = types.FunctionType(func.__code__, namespace, func.__name__, func.__defaults__, func.__closure__)
    copy.__kwdefaults__ = func.__kwdefaults__
    return copy


HANDLERS = HandlerTable()
for _name in _INIT_FUNCTIONS:
    _fn = getattr(init, _name, None)
    if isinstance(_fn, types.FunctionType):
        HANDLERS[_fn] = _body(_fn)
