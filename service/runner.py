"""``run_program``: execute a program's steps in order against one session.

Each step is atomic: it computes everything first and commits (stores outputs,
writes in place, accumulates grads) only at its end, so a failing step leaves
no trace while earlier steps stay done, as in eager torch.
"""

from __future__ import annotations

import logging
import math
from time import perf_counter
from typing import Any, Callable

import torch

from proto import ErrorCode, ProtocolError, decode_tensor, dtype_from_name, dtype_name, encode_tensor
from proto.messages import (
    BackwardStep,
    CallStep,
    FetchStep,
    FreeStep,
    GradStep,
    Program,
    PutStep,
    RetainGradStep,
    SetGradStep,
    SetRequiresGradStep,
)

from . import ops as _ops
from .custom_tensor import CustomTensor
from .ops._context import RunContext, reset, set_current
from .settings import Settings
from .store import Outcome, Session

log = logging.getLogger("service.runner")
OP_TABLE = _ops.OP_TABLE
_MAX_VALUE_DEPTH = 8


def run_program(session: Session, program: Program, settings: Settings, *, as_json: bool = False,
                observe: Callable[[str, float], None] | None = None) -> Outcome:
    """Run every step or stop at the first failure; the caller holds the session lock.

    ``observe(op, seconds)`` is told how long each step that succeeded took (metrics).
    """
    if len(program.steps) > settings.max_steps_per_program:
        raise ProtocolError(
            ErrorCode.TOO_LARGE,
            f"program has {len(program.steps)} steps, over the limit max_steps_per_program={settings.max_steps_per_program}",
        )
    results: list[Any] = []
    token = set_current(RunContext(session.generator, session.device))
    try:
        for index, step in enumerate(program.steps):
            start = perf_counter()
            try:
                results.append(_HANDLERS[type(step)](session, step, settings, as_json))
            except Exception as exc:  # every failure becomes data: see _as_protocol_error
                err = _as_protocol_error(exc, index, _step_op(step))
                return Outcome(err.status, {"id": program.id, "error": err.to_wire(), "results": results})
            if observe is not None:
                observe(_step_op(step), perf_counter() - start)
    finally:
        reset(token)
    return Outcome(200, {"id": program.id, "results": results})


def check_limits(body: Any, settings: Settings) -> None:
    """Limits answer before anything else about a body: step count and claimed tensor sizes (413).

    Runs on the raw decoded body, before validation, so a huge claimed shape is a 413
    even when something else about the message is also wrong.
    """
    steps = body.get("steps") if isinstance(body, dict) else None
    if not isinstance(steps, list):
        return
    if len(steps) > settings.max_steps_per_program:
        raise ProtocolError(
            ErrorCode.TOO_LARGE,
            f"program has {len(steps)} steps, over the limit max_steps_per_program={settings.max_steps_per_program}",
        )
    for index, step in enumerate(steps):
        if not (isinstance(step, dict) and step.get("kind") == "put"):
            continue
        for key in ("value", "grad"):
            shape = step.get(key, {}).get("shape") if isinstance(step.get(key), dict) else None
            if isinstance(shape, list) and all(type(d) is int for d in shape):
                numel = math.prod(shape)
                if numel > settings.max_tensor_elements:
                    raise ProtocolError(
                        ErrorCode.TOO_LARGE,
                        f"steps.{index}.{key}: shape {shape} has {numel} elements, over the limit "
                        f"max_tensor_elements={settings.max_tensor_elements}",
                        step=index, op="put",
                    )


def _as_protocol_error(exc: Exception, step: int, op: str) -> ProtocolError:
    if isinstance(exc, ProtocolError):
        err = exc
    elif isinstance(exc, torch.OutOfMemoryError):
        err = ProtocolError(ErrorCode.OUT_OF_MEMORY, f"device out of memory in {op}: {_first_line(exc)}")
    elif isinstance(exc, (RuntimeError, TypeError, ValueError, IndexError, NotImplementedError, ZeroDivisionError,
                          OverflowError, AssertionError)):
        err = ProtocolError(ErrorCode.OP_ERROR, _first_line(exc) or type(exc).__name__)
    else:  # a bug of ours, but the client still gets data, never a 500
        log.exception("unexpected error in step %d (%s)", step, op)
        err = ProtocolError(ErrorCode.OP_ERROR, f"{type(exc).__name__}: {_first_line(exc)}")
    err.step, err.op = step, op
    return err


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text[:2000]


def _step_op(step) -> str:
    return step.op if isinstance(step, CallStep) else step.kind


# -- values -------------------------------------------------------------------------------


def _resolve(value: Any, session: Session, depth: int = 0) -> Any:
    """A wire value as an op argument: refs become tensors, tagged objects their Python values."""
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    if depth > _MAX_VALUE_DEPTH:
        raise ProtocolError(ErrorCode.BAD_REQUEST, f"argument nested deeper than {_MAX_VALUE_DEPTH} levels")
    if isinstance(value, list):
        return [_resolve(v, session, depth + 1) for v in value]
    if isinstance(value, dict) and len(value) == 1:
        (tag, payload), = value.items()
        if tag == "ref":
            return session.tensor(payload)._custom_data
        if tag == "grad_of":
            grad = session.tensor(payload)._custom_grad
            if grad is None:
                raise ProtocolError(ErrorCode.OP_ERROR, f"tensor {payload!r} has no grad (it is None)")
            return grad
        if tag == "dtype":
            return dtype_from_name(payload, "argument dtype")
        if tag == "slice":
            if not (isinstance(payload, list) and len(payload) == 3
                    and all(p is None or (isinstance(p, int) and not isinstance(p, bool)) for p in payload)):
                raise ProtocolError(ErrorCode.BAD_REQUEST, "slice: expected [start, stop, step] of integers or null")
            return slice(*payload)
        if tag == "ellipsis":
            return Ellipsis
    raise ProtocolError(ErrorCode.BAD_REQUEST, f"unknown argument object {_short(value)}")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) < 80 else text[:77] + "..."


def _meta(tid: str, t: torch.Tensor) -> dict:
    return {"id": tid, "dtype": dtype_name(t.dtype), "shape": list(t.shape), "requires_grad": t.requires_grad}


def _store(session: Session, settings: Settings, pairs: list[tuple[str, CustomTensor]]) -> None:
    """Keep new tensors under their ids, all or none: every limit is checked before the first is kept."""
    if len(session.tensors) + len(pairs) > settings.max_tensors_per_session:
        raise ProtocolError(
            ErrorCode.TOO_LARGE,
            f"session would hold {len(session.tensors) + len(pairs)} tensors: "
            f"limit max_tensors_per_session={settings.max_tensors_per_session}",
        )
    for tid, ct in pairs:
        numel = ct._custom_data.numel()
        if numel > settings.max_tensor_elements:
            raise ProtocolError(
                ErrorCode.TOO_LARGE,
                f"{tid!r} would have {numel} elements: limit max_tensor_elements={settings.max_tensor_elements}",
            )
    session.charge(sum(ct.nbytes for _, ct in pairs), settings.max_session_bytes)
    session.tensors.update(pairs)


def _data_bytes(ct: CustomTensor) -> int:
    """The bytes of ``ct``'s value, which are also the bytes its grad takes once it has one."""
    return ct._custom_data.numel() * ct._custom_data.element_size()


def _grad_bytes(grad: torch.Tensor | None) -> int:
    return 0 if grad is None else grad.numel() * grad.element_size()


def _check_new_ids(session: Session, ids: list[str]) -> None:
    for tid in ids:
        if tid in session.tensors:
            raise ProtocolError(ErrorCode.CONFLICT, f"tensor id {tid!r} is already used in this session")
    if len(set(ids)) != len(ids):
        raise ProtocolError(ErrorCode.CONFLICT, f"output ids repeat: {ids}")


def reencode(outcome: Outcome, as_json: bool) -> Outcome:
    """A stored answer re-encoded for a retry that asks for the other format (JSON vs msgpack)."""
    results = []
    for r in outcome.body.get("results", []):
        if r and r.get("tensor"):
            msg = dict(r["tensor"])
            for key in ("value", "grad"):
                if msg.get(key) is not None:
                    msg[key] = encode_tensor(decode_tensor(msg[key]), as_json=as_json)
            r = {**r, "tensor": msg}
        results.append(r)
    return Outcome(outcome.status, {**outcome.body, "results": results})


def tensor_message(tid: str, ct: CustomTensor, *, value: bool, grad: bool, as_json: bool) -> dict:
    """A fetched tensor. Binary data is a view of the tensor's bytes (no copy); it is encoded
    (msgpack) or streamed (frames) right after the program, before this session runs another."""
    view = not as_json
    return {
        "id": tid,
        "value": encode_tensor(ct._custom_data, as_json=as_json, as_view=view) if value else None,
        "grad": (encode_tensor(ct._custom_grad, as_json=as_json, as_view=view)
                 if grad and ct._custom_grad is not None else None),
        "requires_grad": ct.requires_grad,
    }


_KEEP_FETCHED_BYTES = 1 << 20


def keepable(outcome: Outcome, program_id: str) -> Outcome:
    """What the retry cache may hold: fetched values are copied out of the live tensors,
    and an answer with more than 1 MiB of them is replaced by a 409 (fetch again)."""
    results = outcome.body.get("results", [])
    fetched = [r["tensor"] for r in results if r and r.get("tensor")]
    views = [m[k] for m in fetched for k in ("value", "grad")
             if m.get(k) is not None and isinstance(m[k].get("data"), memoryview)]
    if not views:
        return outcome
    if sum(v["data"].nbytes for v in views) > _KEEP_FETCHED_BYTES:
        err = ProtocolError(ErrorCode.CONFLICT, f"program {program_id!r} already ran; its answer held too much "
                            "fetched data to keep for a retry: fetch the tensors again")
        return Outcome(err.status, {"id": program_id, "error": err.to_wire(), "results": []})
    return Outcome(outcome.status, _copy_views(outcome.body))


def _copy_views(value: Any) -> Any:
    if isinstance(value, memoryview):
        return value.tobytes()
    if isinstance(value, dict):
        return {k: _copy_views(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy_views(v) for v in value]
    return value


# -- steps --------------------------------------------------------------------------------


def _put(session: Session, step: PutStep, settings: Settings, as_json: bool) -> dict:
    _check_new_ids(session, [step.id])
    value = decode_tensor(step.value.model_dump(), field="value", max_elements=settings.max_tensor_elements,
                          device=session.device, copy=False)  # a framed body's bytes become the tensor
    grad = None
    if step.grad is not None:
        grad = decode_tensor(step.grad.model_dump(), field="grad", max_elements=settings.max_tensor_elements,
                             device=session.device)
        if grad.shape != value.shape or grad.dtype != value.dtype:
            raise ProtocolError(ErrorCode.BAD_REQUEST, "grad: must have the value's shape and dtype")
    if step.requires_grad:
        value.requires_grad_(True)  # torch's own error for integer dtypes
    _store(session, settings, [(step.id, CustomTensor(value, grad))])
    return {"tensors": [_meta(step.id, value)]}


def _lookup(name: str):
    """The entry for ``name`` and whether the call is in place (``add_`` runs ``add`` then writes)."""
    entry = OP_TABLE.get(name)
    if entry is not None:
        return entry, entry.inplace
    if name.endswith("_") and not name.startswith("_"):
        entry = OP_TABLE.get(name[:-1])
        if entry is not None and entry.shape_rule != "none":
            return entry, True
    raise ProtocolError(ErrorCode.UNKNOWN_OP, f"unknown op {name!r}; GET /v1/ops lists the op table")


def _call(session: Session, step: CallStep, settings: Settings, as_json: bool) -> dict:
    entry, inplace = _lookup(step.op)
    args = [_resolve(a, session) for a in step.args]
    kwargs = {k: _resolve(v, session) for k, v in step.kwargs.items()}
    if not inplace:
        _check_new_ids(session, step.out)
    with torch.set_grad_enabled(step.grad_enabled):
        if inplace:
            rebound = _run_inplace(entry, step.op, args, kwargs)
            first = step.args[0] if step.args else None
            if rebound is not None and isinstance(first, dict) and "ref" in first:
                session.tensor(first["ref"])._custom_data = rebound
            return {"tensors": []}
        result = entry.fn(*args, **kwargs)
    is_tuple = isinstance(result, (tuple, list))
    outputs = tuple(result) if is_tuple else (result,)
    outputs = _no_aliases(outputs, args, kwargs)
    ids = step.out
    if step.out_many:
        if len(step.out) != 1:
            raise ProtocolError(ErrorCode.BAD_REQUEST, "out: with out_many, give exactly one id prefix")
        ids = [f"{step.out[0]}.{i}" for i in range(len(outputs))]
        _check_new_ids(session, ids)
    if len(outputs) != len(ids):
        raise ProtocolError(ErrorCode.OP_ERROR, f"{step.op} returns {len(outputs)} tensor(s) but out names {len(ids)}")
    _store(session, settings, [(tid, CustomTensor(t)) for tid, t in zip(ids, outputs)])
    metas = [_meta(tid, t) for tid, t in zip(ids, outputs)]
    return {"tensors": metas, "tuple": True} if is_tuple else {"tensors": metas}


def _no_aliases(outputs: tuple, args: list, kwargs: dict) -> tuple:
    """Outputs that are an input object itself (``contiguous()``, ``dropout(training=False)``) become views.

    Two ids must never share one tensor object: leaves are found by object identity
    in backward, and the client already treats the result as a new non-leaf.
    """
    inputs = {id(a) for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)}
    if not any(id(o) in inputs for o in outputs):
        return outputs
    return tuple(o.view_as(o) if id(o) in inputs else o for o in outputs)


def _run_inplace(entry, name: str, args: list, kwargs: dict) -> torch.Tensor | None:
    """``x.op_(...)``: compute out of place, check it fits ``x``, then write it in with ``copy_``.

    Writing through ``copy_`` bumps ``x``'s version counter, so a backward that saved
    the old ``x`` fails with torch's own error, as it would after a native in-place op.
    When a graph is recorded we compute from a clone, so our own Function never holds
    the tensor we are about to overwrite.
    """
    if not args or not isinstance(args[0], torch.Tensor):
        raise ProtocolError(ErrorCode.OP_ERROR, f"{name}: the first argument must be a tensor")
    target = args[0]
    recording = torch.is_grad_enabled() and any(
        isinstance(a, torch.Tensor) and a.requires_grad for a in (*args, *kwargs.values())
    )
    if recording and target.is_leaf and target.requires_grad:
        raise ProtocolError(ErrorCode.OP_ERROR,
                            "a leaf Variable that requires grad is being used in an in-place operation.")
    kwargs.pop("inplace", None)
    value = entry.fn(target.clone() if recording else target, *args[1:], **kwargs)
    if isinstance(value, (tuple, list)):
        value = value[0]
    if value is target:
        return
    if value.shape != target.shape:
        raise ProtocolError(ErrorCode.OP_ERROR,
                            f"output with shape {list(target.shape)} doesn't match the broadcast shape {list(value.shape)}")
    if not torch.can_cast(value.dtype, target.dtype) and not entry.inplace:
        raise ProtocolError(ErrorCode.OP_ERROR,
                            f"result type {dtype_name(value.dtype)} can't be cast to the desired output type "
                            f"{dtype_name(target.dtype)}")
    try:
        target.copy_(value)
    except RuntimeError as exc:
        # In place on a view one of our Functions returned, while grad is recorded
        # (``t = y[0]; t += 1``): torch forbids the write (it could not keep the gradient
        # right), so the caller rebinds the id to the new value instead. ``y[i] += 1``
        # (getitem, add_, setitem) stays exact; the write does not reach the view's base.
        if "created inside a custom Function" not in str(exc):
            raise
        return value.to(target.dtype)
    return None


def _grad_targets(session: Session, roots: list[torch.Tensor]) -> list[CustomTensor]:
    """The session's leaves (and retained non-leaves) that a backward from ``roots`` reaches."""
    leaves: dict[int, CustomTensor] = {}
    retained: list[CustomTensor] = []
    for ct in session.tensors.values():
        data = ct._custom_data
        # Views are never leaves; asking a stale view (its base changed in place) for
        # is_leaf would make autograd raise, so skip them before looking further.
        if (data._base is not None and data._base.requires_grad and not ct.retains_grad) or not data.requires_grad:
            continue
        if data.is_leaf:
            leaves[id(data)] = ct
        elif ct.retains_grad:
            retained.append(ct)
    found: dict[int, CustomTensor] = {}
    seen: set = set()
    stack = []
    for r in roots:
        if r.grad_fn is None and id(r) in leaves:
            found[id(r)] = leaves[id(r)]
        stack.append(r.grad_fn)
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        var = getattr(node, "variable", None)  # AccumulateGrad nodes hold their leaf
        if var is not None and id(var) in leaves:
            found[id(var)] = leaves[id(var)]
        stack.extend(n for n, _ in node.next_functions)
    targets = list(found.values())
    targets.extend(ct for ct in retained if ct._custom_data.grad_fn in seen)
    return targets


def _grad_outputs(values, session: Session) -> list | None:
    if values is None:
        return None
    return [_resolve(v, session) for v in values]


def _backward(session: Session, step: BackwardStep, settings: Settings, as_json: bool) -> dict:
    roots = [session.tensor(t)._custom_data for t in step.tensors]
    grad_tensors = _grad_outputs(step.grad_tensors, session)
    if step.inputs is not None:
        targets = [session.tensor(t) for t in step.inputs]
    else:
        targets = _grad_targets(session, roots)
    retain = step.create_graph if step.retain_graph is None else step.retain_graph
    if not targets:  # nothing of ours to fill: still run it, for its errors and its graph freeing
        torch.autograd.backward(roots, grad_tensors, retain_graph=retain, create_graph=step.create_graph)
        return {"tensors": []}
    # Room for the new grads first (a 413 leaves the graph intact for a retry), then
    # temporaries, then commit: a failing backward leaves every .grad untouched.
    reserved = sum(_data_bytes(ct) for ct in targets if ct._custom_grad is None)
    session.charge(reserved, settings.max_session_bytes)
    try:
        grads = torch.autograd.grad(roots, [ct._custom_data for ct in targets], grad_tensors,
                                    retain_graph=retain, create_graph=step.create_graph, allow_unused=True)
    except BaseException:
        session.release(reserved)
        raise
    used = 0
    for ct, g in zip(targets, grads):
        if g is not None:
            used += _data_bytes(ct) if ct._custom_grad is None else 0
            _accumulate(ct, g, step.create_graph)
    session.release(reserved - used)
    missing = _still_without_grad(session, targets)
    return {"tensors": [], "no_grad": missing} if missing else {"tensors": []}


def _still_without_grad(session: Session, targets: list[CustomTensor]) -> list[str]:
    """Ids of reached tensors that still have no grad (their inputs' gradients were None).

    The client predicts ``.grad is not None`` for every leaf a backward reaches; this
    corrects that prediction where an op gave no gradient (e.g. ``vector_norm(x, 0)``).
    """
    missing = {id(ct) for ct in targets if ct._custom_grad is None}
    if not missing:
        return []
    return [tid for tid, ct in session.tensors.items() if id(ct) in missing]


def _accumulate(ct: CustomTensor, g: torch.Tensor, create_graph: bool) -> None:
    # A fresh grad is cloned: autograd may hand the same tensor to several inputs (add's
    # backward returns its grad twice) or an expanded one, and in-place ops on one .grad
    # must never show up in another.
    if not create_graph:
        g = g.detach()
    if ct._custom_grad is None:
        ct._custom_grad = g.clone(memory_format=torch.contiguous_format)
    elif create_graph or ct._custom_grad.requires_grad:
        ct._custom_grad = ct._custom_grad + g
    else:
        with torch.no_grad():
            ct._custom_grad.add_(g)


def _grad(session: Session, step: GradStep, settings: Settings, as_json: bool) -> dict:
    if len(step.out) != len(step.inputs):
        raise ProtocolError(ErrorCode.BAD_REQUEST, "out: needs one id per input")
    _check_new_ids(session, step.out)
    outputs = [session.tensor(t)._custom_data for t in step.outputs]
    inputs = [session.tensor(t)._custom_data for t in step.inputs]
    retain = step.create_graph if step.retain_graph is None else step.retain_graph
    grads = torch.autograd.grad(outputs, inputs, _grad_outputs(step.grad_outputs, session), retain_graph=retain,
                                create_graph=step.create_graph, allow_unused=step.allow_unused)
    _store(session, settings, [(tid, CustomTensor(g)) for tid, g in zip(step.out, grads) if g is not None])
    return {"tensors": [None if g is None else _meta(tid, g) for tid, g in zip(step.out, grads)]}


def _set_grad(session: Session, step: SetGradStep, settings: Settings, as_json: bool) -> dict:
    ct = session.tensor(step.id)
    grad = _resolve(step.grad, session)
    if grad is not None:
        if not isinstance(grad, torch.Tensor):
            raise ProtocolError(ErrorCode.OP_ERROR, "assigned grad expected to be a Tensor or None")
        if grad.shape != ct.shape:
            raise ProtocolError(ErrorCode.OP_ERROR, "assigned grad has data of a different size")
        if grad.dtype != ct.dtype:
            raise ProtocolError(ErrorCode.OP_ERROR, "assigned grad has data of a different type")
    # Counted as its own bytes even when it aliases another tensor: the bound stays safe.
    session.charge(_grad_bytes(grad) - _grad_bytes(ct._custom_grad), settings.max_session_bytes)
    ct._custom_grad = grad  # aliasing, as `p.grad = g` does in torch
    return None


def _set_requires_grad(session: Session, step: SetRequiresGradStep, settings: Settings, as_json: bool) -> dict:
    ct = session.tensor(step.id)
    ct._custom_data.requires_grad_(step.requires_grad)  # torch's own errors for non-leaves and int dtypes
    return {"tensors": [_meta(step.id, ct._custom_data)]}


def _retain_grad(session: Session, step: RetainGradStep, settings: Settings, as_json: bool) -> None:
    ct = session.tensor(step.id)
    if not ct.requires_grad:
        raise ProtocolError(ErrorCode.OP_ERROR, "can't retain_grad on Tensor that has requires_grad=False")
    if not ct.is_leaf:
        ct.retains_grad = True
    return None


def _free(session: Session, step: FreeStep, settings: Settings, as_json: bool) -> None:
    for tid in step.ids:
        ct = session.tensors.pop(tid, None)
        if ct is not None:
            session.release(ct.nbytes)
    return None


def _fetch(session: Session, step: FetchStep, settings: Settings, as_json: bool) -> dict:
    return {"tensor": tensor_message(step.id, session.tensor(step.id), value=step.value, grad=step.grad,
                                     as_json=as_json)}


_HANDLERS: dict[type, Callable[..., Any]] = {
    PutStep: _put,
    CallStep: _call,
    BackwardStep: _backward,
    GradStep: _grad,
    SetGradStep: _set_grad,
    SetRequiresGradStep: _set_requires_grad,
    RetainGradStep: _retain_grad,
    FreeStep: _free,
    FetchStep: _fetch,
}
