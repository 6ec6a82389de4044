"""``torch._foreach_*``: the multi-tensor kernels torch's optimizers pick with ``foreach=True``.

The list is what ``torch/optim`` (Adam, AdamW, SGD, RMSprop, Adamax) calls. Each
is torch's own kernel (kind ``native``): one server step updates every parameter.
Out-of-place forms return a list of new tensors (differentiable, as in torch); in-place
forms (``_foreach_add_``) write every tensor of their first argument and exist only in
place. Optimizers call them under ``no_grad``; the client refuses an in-place form
on tensors that require grad with grad enabled rather than lose that history.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ._contracts import CONTRACTS
from ._native import native_op
from ._samples import S, T


def _xs(*shapes, low=-2.0, high=2.0, requires_grad=True):
    return [T(s, low=low, high=high, requires_grad=requires_grad) for s in shapes]


_SHAPES = ((2, 3), (4,))
_A, _B, _POS = _xs(*_SHAPES), _xs(*_SHAPES), _xs(*_SHAPES, low=0.5, high=2.0)

# name -> out-of-place samples; the in-place form's samples are the same without grads
_FOREACH = {
    "add": (S(_A, _B), S(_A, _B, alpha=-0.5), S(_A, 2.0), S(_A, [1.0, -3.0])),
    "sub": (S(_A, _B), S(_A, 0.5)),
    "mul": (S(_A, _B), S(_A, 0.9), S(_A, [0.5, 2.0])),
    "div": (S(_A, _POS), S(_A, 3.0), S(_A, [2.0, 0.5])),
    "addcmul": (S(_A, _B, _POS), S(_A, _B, _POS, 0.3), S(_A, _B, _POS, [0.1, -0.2])),
    "addcdiv": (S(_A, _B, _POS), S(_A, _B, _POS, -0.01), S(_A, _B, _POS, [0.1, -0.2])),
    "lerp": (S(_A, _B, 0.1), S(_A, _B, _POS)),
    "maximum": (S(_A, _B),),
    "pow": (S(_POS, 2.0), S(_POS, _B)),
    "sqrt": (S(_POS),),
    "neg": (S(_A),),
    "abs": (S(_POS),),
    "reciprocal": (S(_POS),),
}


def _no_grad(sample: S) -> S:
    def plain(v):
        if isinstance(v, T):
            return replace(v, requires_grad=False)
        if isinstance(v, list):
            return [plain(x) for x in v]
        return v
    return S(*(plain(a) for a in sample.args), **{k: plain(v) for k, v in sample.kwargs.items()})


def _writing(torch_fn):
    """An in-place foreach kernel returning the tensors it wrote (torch's returns None), so the
    generated tests can compare them."""
    def run(tensors, *args, **kwargs):
        torch_fn(tensors, *args, **kwargs)
        return tensors
    return run


for _name, _samples in _FOREACH.items():
    _plain = getattr(torch, f"_foreach_{_name}")
    _inplace = getattr(torch, f"_foreach_{_name}_")
    native_op(f"_foreach_{_name}", _plain, torch_names=(f"torch._foreach_{_name}",), samples=_samples,
              double_grad=_name not in ("maximum", "abs"))
    native_op(f"_foreach_{_name}_", _writing(_inplace), torch_names=(f"torch._foreach_{_name}_",),
              samples=tuple(_no_grad(s) for s in _samples), inplace=True, differentiable=False,
              shape_rule="none")


# -- what torch.amp.GradScaler calls: unscale-and-check-for-inf over a list of grads, and the scale update
# GradScaler keeps its scale, inv_scale and found_inf in float32 whatever the grads' dtype
_FOUND_INF = T((1,), low=0.0, high=0.5, integers=True, dtype="float32", requires_grad=False)  # 0: none found yet
_INV_SCALE = T((1,), low=0.25, high=0.75, dtype="float32", requires_grad=False)

native_op("_amp_foreach_non_finite_check_and_unscale_", _writing(torch._amp_foreach_non_finite_check_and_unscale_),
          torch_names=("torch._amp_foreach_non_finite_check_and_unscale_",), inplace=True, differentiable=False,
          shape_rule="none", samples=(S(_xs(*_SHAPES, requires_grad=False), _FOUND_INF, _INV_SCALE),))
_SCALE = T((1,), low=1.0, high=8.0, dtype="float32", requires_grad=False)
native_op("_amp_update_scale_", torch._amp_update_scale_, torch_names=("torch._amp_update_scale_",), inplace=True,
          differentiable=False, shape_rule="none",
          samples=(S(_SCALE, T((1,), dtype="int32", low=0, high=3, requires_grad=False), _FOUND_INF, 2.0, 0.5, 2),
                   S(_SCALE, T((1,), dtype="int32", low=0, high=1, requires_grad=False),
                     T((1,), low=1.0, high=1.5, integers=True, dtype="float32", requires_grad=False), 2.0, 0.5, 2)))


# -- torch._fused_*: what Adam/AdamW/SGD(fused=True) call on a device torch lists as fused-capable;
# torch has CPU and CUDA kernels for all three. Each updates params and state lists in place.
_PARAMS, _STEPS = _xs(*_SHAPES, requires_grad=False), [T((), low=1.0, high=4.0, integers=True, requires_grad=False)] * 2
_ADAM = dict(lr=0.01, beta1=0.9, beta2=0.999, weight_decay=0.01, eps=1e-8, maximize=False)
_ADAM_SAMPLES = (S(_PARAMS, _PARAMS, _PARAMS, _xs(*_SHAPES, low=0.1, requires_grad=False), [], _STEPS, amsgrad=False,
                   **_ADAM),
                 S(_PARAMS, _PARAMS, _PARAMS, _xs(*_SHAPES, low=0.1, requires_grad=False),
                   _xs(*_SHAPES, low=0.1, requires_grad=False), _STEPS, amsgrad=True, **_ADAM))
for _name in ("adam", "adamw"):
    native_op(f"_fused_{_name}_", _writing(getattr(torch, f"_fused_{_name}_")), torch_names=(f"torch._fused_{_name}_",),
              inplace=True, differentiable=False, shape_rule="none", samples=_ADAM_SAMPLES,
              check=CONTRACTS[f"_fused_{_name}_"])
native_op("_fused_sgd_", _writing(torch._fused_sgd_), torch_names=("torch._fused_sgd_",), inplace=True,
          differentiable=False, shape_rule="none", check=CONTRACTS["_fused_sgd_"],
          samples=(S(_PARAMS, _PARAMS, [], weight_decay=0.0, momentum=0.0, lr=0.1, dampening=0.0, nesterov=False,
                     maximize=False, is_first_step=True),
                   S(_PARAMS, _PARAMS, _PARAMS, weight_decay=0.01, momentum=0.9, lr=0.1, dampening=0.0, nesterov=True,
                     maximize=False, is_first_step=False)))
