"""RemoteTensor while ``torch.compile`` traces it: a traceable wrapper subclass whose inner tensor is
its meta stand-in (DESIGN principle 10).

Dynamo fakeifies a RemoteTensor through ``__tensor_flatten__`` (the inner stand-in, and a context of
the one fact the C++ tensor cannot say: whether it is a leaf; anything per handle there would
recompile per handle, and a Session there cannot be copied into a guard) and ``unflatten`` (a *traced
wrapper*: a RemoteTensor holding the fake stand-in, no session, no id). While it propagates fake
tensors through the graph, torch calls on traced wrappers pass through ``__torch_function__`` to
the dispatcher and ``dispatch`` runs each op on the inner fakes and wraps the results, so the
backend gets torch-level FX nodes whose ``example_value`` is a traced wrapper with the output's
metadata. Real handles take the SDK's eager path during a compile too (dynamo reads their facts, and
runs some code for real: an optimizer's state made at its first step), so a computed remote tensor
is no leaf to dynamo either, though its C++ tensor is one.

Another backend (inductor, the default) traces the graph again below autograd with functional
tensors as the inner tensors; ``unflatten`` refuses that at once, naming ``backend="remote"``: no
kernel of this process can compute a remote tensor's values.

``Module._apply`` swaps a traceable subclass's parameters with ``torch.utils.swap_tensors``, which
refuses a tensor that anything holds weakly (the SDK tracks handles weakly) where the SDK's own
moves convert a parameter in place (``handlers/_moves``); ``HiddenFromApply`` keeps the protocol out
of ``_apply``'s sight alone, so a module move takes its ``param.data =`` path as before.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._pytree import tree_leaves, tree_map
from torch.utils._python_dispatch import return_and_correct_aliasing

from ..device._device import DEVICE_TYPE
from . import _func_transforms

_MAKE_WRAPPER = torch.Tensor._make_wrapper_subclass
_APPLY_CODE = torch.nn.Module._apply.__code__
_IS_LEAF = torch.Tensor.is_leaf.__get__

DEFAULT_BACKEND_REFUSED = (
    "torch.compile traced remote tensors for a backend that compiles kernels for this machine (inductor, "
    "torch.compile's default, or another below autograd): the values of remote tensors live on the server. "
    "Use torch.compile(model, backend=\"remote\"): the graph runs on the server, one small request per call")


def through(func, args: tuple, kwargs: dict):
    """``__torch_function__`` of traced wrappers (and of a real handle's facts torch.compile reads that the
    SDK does not answer itself): the call goes on to the C++ tensor and the dispatcher (``dispatch``)."""
    if _func_transforms.forward_mode():
        raise _func_transforms.forward_mode_refused(func)
    with torch._C.DisableTorchFunctionSubclass():
        return func(*args, **kwargs)


class HiddenFromApply:
    """A class attribute that ``nn.Module._apply`` cannot see (``hasattr`` is False there), and every
    other reader can: see the module's docstring for why."""

    def __init__(self, fn: Callable) -> None:
        self.fn = fn

    def __get__(self, obj: Any, cls: type | None = None) -> Any:
        # _apply -> is_traceable_wrapper_subclass -> _has_traceable_wrapper_subclass_protocol -> hasattr(): 3 up
        try:
            caller = sys._getframe(3).f_code
        except ValueError:
            caller = None
        if caller is _APPLY_CODE:
            raise AttributeError("__tensor_flatten__")
        return self.fn if obj is None else self.fn.__get__(obj, cls)


def flatten(t) -> tuple[list[str], tuple]:
    """``__tensor_flatten__``: the stand-in's attribute; its device and whether it is a leaf for autograd."""
    if t._fake is not None:
        with torch._C.DisableTorchFunctionSubclass():
            return ["_stand_in"], (t.device, _IS_LEAF(t))
    return ["_stand_in"], (t._session.device, t._is_leaf or not t._rg)


def stand_in(t) -> torch.Tensor:
    """The inner tensor: a traced wrapper's fake, or a handle's meta stand-in."""
    traced = t._fake
    return traced if traced is not None else t._meta()


def unflatten(cls: type, inner: dict, ctx: tuple, outer_size, outer_stride):
    """A traced wrapper around the fake ``inner["_stand_in"]`` (``__tensor_unflatten__``)."""
    fake = inner["_stand_in"]
    if not isinstance(fake, FakeTensor):  # functional tensors, proxies: a backend tracing below autograd
        raise RuntimeError(DEFAULT_BACKEND_REFUSED)
    _keep_eager_arithmetic()
    device, is_leaf = ctx
    return wrap(cls, fake, device, outer_size, outer_stride, requires_grad=fake.requires_grad)


def wrap(cls: type, fake: torch.Tensor, device: torch.device, size=None, stride=None, requires_grad: bool = False):
    """A traced wrapper of ``cls`` on ``device`` holding ``fake``."""
    size = fake.shape if size is None else size
    r = _MAKE_WRAPPER(cls, size, strides=fake.stride() if stride is None else stride, dtype=fake.dtype,
                      device=device, requires_grad=requires_grad)
    r._fake, r._shape, r._dtype, r._id = fake, tuple(size), fake.dtype, None
    return r


def is_traced(args: tuple, kwargs: dict | None) -> bool:
    """Whether a traced wrapper is among the arguments (asked only while torch.compile traces)."""
    for x in tree_leaves((args, kwargs or {})):
        if getattr(x, "_fake", None) is not None:
            return True
    return False


def dispatch(cls: type, func, args: tuple, kwargs: dict):
    """``__torch_dispatch__`` on traced wrappers: the op on the inner fakes, the results wrapped.

    A factory's fake made on the remote device (``torch.arange(T, device=idx.device)``) meets the
    stand-ins as a tensor of the meta device, as they are."""
    if _func_transforms.forward_mode():
        raise _func_transforms.forward_mode_refused(func)
    device = None

    def unwrap(x):
        nonlocal device
        traced = getattr(x, "_fake", None)
        if traced is not None:
            device, x = x.device, traced  # (a factory's fake wrapped by an op before: of the remote device too)
        if isinstance(x, FakeTensor) and x.device.type == DEVICE_TYPE:
            return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
        return x

    out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs))
    if func is torch.ops.aten._to_copy.default and kwargs.get("device") is not None \
            and torch.device(kwargs["device"]).type != DEVICE_TYPE:  # x.cpu(): a local tensor
        return torch.empty_strided(out.shape, out.stride(), dtype=out.dtype, device=kwargs["device"])

    def rewrap(o):
        if isinstance(o, torch.Tensor) and not isinstance(o, cls):
            return wrap(cls, o, device)
        return o

    return return_and_correct_aliasing(func, args, kwargs, tree_map(rewrap, out))




def _keep_eager_arithmetic() -> None:
    """Turn off dynamo's own rewrites of ``addcmul_``, ``addcdiv_``, ``add_(alpha=tensor)`` and ``lerp`` into
    fused multiply-adds for the rest of this compile (its end puts them back): a graph of remote tensors
    runs on the server call by call as eager torch would, and those rewrites round differently
    (``torch._dynamo.config.enable_dynamo_decompositions``: "can affect numerics for non-inductor backends")."""
    from torch._dynamo import callback, config

    if not config.enable_dynamo_decompositions:
        return
    config.enable_dynamo_decompositions = False

    def put_back(args) -> None:
        config.enable_dynamo_decompositions = True
        callback.callback_handler.remove_end_callback(put_back)

    callback.on_compile_end(put_back)
