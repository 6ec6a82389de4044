"""The runner's handlers of the step kinds besides ``call``, ``fetch`` and ``free``, and a call's in-place run.

Puts, a grad set, grads cleared, ``requires_grad`` set, ``retain_grad``: each a small function given the step and the
program's ``ProgramRun`` (``runner._HANDLERS``). An in-place call (``x.add_(y)``, an optimizer's update)
runs through ``run_inplace``, and the tensors it named are counted again after it (``remeasure``) unless
its op keeps their storages (``kept_storages``). Apart from ``runner``: the walk of one op enters none of it.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from remote_autograd.proto import ErrorCode, ProtocolError, dtype_name
from remote_autograd.proto.messages import (CallStep, ClearGradsStep, PutStep, RetainGradStep, SetGradStep,
                                            SetRequiresGradStep)
from remote_autograd.proto.codec import decode_tensor_data

from ..sessions.store import CustomTensor, Session
from .values import ProgramRun, check_new_ids, meta_message, resolve_value, step_refs, store_tensors


def put(run: ProgramRun, step: PutStep, staged: torch.Tensor | None = None) -> dict | None:
    """``staged``: the value, decoded already (a capture decodes its puts before it begins: ``graph_steps``)."""
    session = run.session
    check_new_ids(session, [step.id])
    # validated with the program, its shapes within max_tensor_elements (guards.check_limits)
    value = staged if staged is not None else decode_tensor_data(
        step.value, field="value", device=session.device, copy=False)  # a framed body's bytes become the tensor
    grad = None
    if step.grad is not None:
        grad = decode_tensor_data(step.grad, field="grad", device=session.device)
        if grad.shape != value.shape or grad.dtype != value.dtype:
            raise ProtocolError(ErrorCode.BAD_REQUEST, "grad: must have the value's shape and dtype")
    if step.requires_grad:
        value.requires_grad_(True)  # torch's own error for integer dtypes
    store_tensors(session, run.settings, [(step.id, CustomTensor(value, grad))])
    return None if run.omit_known_meta else {"tensors": [meta_message(step.id, value)]}


def remeasure(session: Session, step: CallStep) -> None:
    """Count again the tensors an in-place step named: ``resize_`` may have grown a storage,
    ``set_data`` or ``as_strided_`` pointed a tensor at another (``storage_ledger``)."""
    tids = step_refs(step.args, set())
    if step.kwargs:
        step_refs(step.kwargs.values(), tids)
    tensors = session.tensors
    session.storages.remeasure([tensors[t] for t in tids if t in tensors])


def apply(fn, grad_enabled: bool, args: list, kwargs: dict) -> Any:
    """``fn(*args, **kwargs)`` (the resolved callable) in the step's grad mode."""
    with grad_mode(grad_enabled):
        return fn(*args, **kwargs)


def _requires_grad(args: list, kwargs: dict) -> bool:
    """Whether a tensor argument requires grad: only then can an op record a graph."""
    for a in args:
        if isinstance(a, torch.Tensor) and a.requires_grad:
            return True
    for a in kwargs.values():
        if isinstance(a, torch.Tensor) and a.requires_grad:
            return True
    return False


_SAME_MODE = contextlib.nullcontext()


def grad_mode(enabled: bool, *, matters: bool = True):
    """``torch.set_grad_enabled(enabled)`` as a context, or a no-op one when the mode already is ``enabled``
    or cannot ``matter`` (autograd looks at it only when a tensor requires grad). Most steps switch
    nothing: switching and restoring costs more than many small ops."""
    return _SAME_MODE if not matters or torch.is_grad_enabled() == enabled else torch.set_grad_enabled(enabled)


def run_inplace(call, step: CallStep, args: list, kwargs: dict) -> None:
    """``x.op_(...)``: torch's own in-place callable when the name spells one (``Tensor.add_``), or when no
    graph is recorded (optimizer updates: the same result, without an out-of-place value and a
    copy); else ``_inplace_by_copy``."""
    entry = call.entry
    if args and isinstance(args[0], list) and call.inplace and (call.writes or entry.inplace):
        with grad_mode(step.grad_enabled):  # torch._foreach_X_(tensors, ...): torch's kernel
            call.fn(*args, **kwargs)
        return None
    if not args or not isinstance(args[0], torch.Tensor):
        raise ProtocolError(ErrorCode.OP_ERROR, f"{step.op}: the first argument must be a tensor")
    target = args[0]
    needs_grad = _requires_grad(args, kwargs)
    recording = step.grad_enabled and needs_grad
    if entry.relayout or (call.writes and not call.by_copy):
        # torch's own in-place op on the stored tensor: its own checks (a leaf that requires grad,
        # shapes, dtypes) come before any change, and its derivative is torch's
        with grad_mode(step.grad_enabled, matters=needs_grad):
            call.fn(*args, **kwargs)
        return None
    if recording and target.is_leaf and target.requires_grad:
        raise ProtocolError(ErrorCode.OP_ERROR,
                            "a leaf Variable that requires grad is being used in an in-place operation.")
    if "inplace" in kwargs:
        del kwargs["inplace"]
    with grad_mode(step.grad_enabled, matters=needs_grad):
        if call.writes:  # torch's in-place op on a copy: a failure midway leaves the target as it was
            work = target.clone()
            call.fn(work, *args[1:], **kwargs)
            target.copy_(work)
        elif recording or entry.native_inplace is None or entry.kind == "native":
            _inplace_by_copy(call.fn, args, kwargs, recording, entry.inplace)
        else:
            entry.native_inplace(*args, **kwargs)


def _inplace_by_copy(fn, args: list, kwargs: dict, recording: bool, inplace_only: bool = False) -> None:
    """Compute out of place, check it fits ``x``, then write it in with ``copy_``.

    Writing through ``copy_`` bumps ``x``'s version counter, so a backward that saved
    the old ``x`` fails with torch's own error, as it would after a native in-place op.
    When a graph is recorded we compute from a clone, so our own Function never holds
    the tensor we are about to overwrite. When ``x`` is a view (the view ops are torch's
    own), ``copy_`` writes through to its base and torch rebases the base's graph.
    """
    target = args[0]
    value = fn(target.clone() if recording else target, *args[1:], **kwargs)
    if isinstance(value, (tuple, list)):
        value = value[0]
    if value is target:
        return
    if value.shape != target.shape:
        raise ProtocolError(ErrorCode.OP_ERROR,
                            f"output with shape {list(target.shape)} doesn't match the broadcast shape {list(value.shape)}")
    if not torch.can_cast(value.dtype, target.dtype) and not inplace_only:
        raise ProtocolError(ErrorCode.OP_ERROR,
                            f"result type {dtype_name(value.dtype)} can't be cast to the desired output type "
                            f"{dtype_name(target.dtype)}")
    target.copy_(value)  # a view a custom op's Function returned: torch's own refusal, as locally


def set_grad(run: ProgramRun, step: SetGradStep) -> None:
    session = run.session
    ct = session.tensor(step.id)
    grad = resolve_value(step.grad, session)
    if grad is not None:
        if not isinstance(grad, torch.Tensor):
            raise ProtocolError(ErrorCode.OP_ERROR, "assigned grad expected to be a Tensor or None")
        if grad.shape != ct.shape:
            raise ProtocolError(ErrorCode.OP_ERROR, "assigned grad has data of a different size")
        if grad.dtype != ct.dtype:
            raise ProtocolError(ErrorCode.OP_ERROR, "assigned grad has data of a different type")
    ct.grad = grad  # aliasing, as `p.grad = g` does in torch: a session tensor's storage, counted already
    session.storages.remeasure([ct])
    return None


def clear_grads(run: ProgramRun, step: ClearGradsStep) -> None:
    """Each tensor's ``.grad`` to None (``set_grad`` with null for each): all of them, or none where an id is
    unknown (its 404 first)."""
    session = run.session
    cts = [session.tensor(tid) for tid in step.ids]
    for ct in cts:
        ct.grad = None
    session.storages.remeasure(cts)
    return None


def set_requires_grad(run: ProgramRun, step: SetRequiresGradStep) -> dict | None:
    ct = run.session.tensor(step.id)
    ct.value.requires_grad_(step.requires_grad)  # torch's own errors for non-leaves and int dtypes
    return None if run.omit_known_meta else {"tensors": [meta_message(step.id, ct.value)]}


def retain_grad(run: ProgramRun, step: RetainGradStep) -> None:
    ct = run.session.tensor(step.id)
    if not ct.requires_grad:
        raise ProtocolError(ErrorCode.OP_ERROR, "can't retain_grad on Tensor that has requires_grad=False")
    if not ct.is_leaf:
        ct.retains_grad = True
    return None
