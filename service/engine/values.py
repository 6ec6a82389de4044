"""Wire values and session tensors: resolving step arguments, storing outputs, byte accounting.

Shared by the step handlers in ``runner`` and ``autograd_steps``.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Iterator

import torch

from remote_autograd.proto import ErrorCode, ProtocolError, dtype_from_name, dtype_name

from ..sessions.store import CustomTensor
from ..sessions.store import Session
from ..settings import Settings

_MAX_VALUE_DEPTH = 8  # lists in lists: [[[[[[[[1]]]]]]]] is the deepest argument (SPEC §5)
# The numbers of the template run under way on this thread: what ``{scalar: name}`` reads (templates.py)
_SCALARS: ContextVar[dict | None] = ContextVar("template_scalars", default=None)


@contextmanager
def bound_scalars(values: dict) -> Iterator[None]:
    """``{scalar: name}`` arguments read ``values`` while a template runs."""
    token = _SCALARS.set(values)
    try:
        yield
    finally:
        _SCALARS.reset(token)


def bound() -> dict | None:
    """The numbers of the template run under way on this thread (``bound_scalars``), or None."""
    return _SCALARS.get()


def resolve_value(value: Any, session: Session, depth: int = 0) -> Any:
    """A wire value as an op argument: refs become tensors, tagged objects their Python values.
    ``depth`` counts the lists around ``value``."""
    if isinstance(value, dict) and len(value) == 1:
        (tag, payload), = value.items()
        if tag == "ref":  # by far the most common argument: first
            return session.tensor(payload).value
        return _resolve_tagged(tag, payload, value, session)
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    if isinstance(value, list):
        if depth == _MAX_VALUE_DEPTH:
            raise ProtocolError(ErrorCode.BAD_REQUEST, f"argument nested deeper than {_MAX_VALUE_DEPTH} levels of lists")
        return [resolve_value(v, session, depth + 1) for v in value]
    raise ProtocolError(ErrorCode.BAD_REQUEST, f"unknown argument object {_short(value)}")


def resolve_args(values: list, session: Session) -> list:
    """``resolve_value`` of each value (plain numbers and flags returned as they are, without a call)."""
    return [v if type(v) in _PLAIN else resolve_value(v, session) for v in values]


def resolve_kwargs(values: dict, session: Session) -> dict:
    """``resolve_value`` of each value (mostly plain numbers and flags, returned as they are)."""
    return {k: v if type(v) in _PLAIN else resolve_value(v, session) for k, v in values.items()}


_PLAIN = frozenset({int, float, str, bool, type(None)})


def _resolve_tagged(tag: str, payload: Any, value: dict, session: Session) -> Any:
    if tag == "grad_of":
        grad = session.tensor(payload).grad
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
    if tag == "scalar":
        scalars = _SCALARS.get()
        if scalars is None or not isinstance(payload, str) or payload not in scalars:
            raise ProtocolError(ErrorCode.BAD_REQUEST, f"{_short(value)}: a scalar is read only inside a template "
                                "that declares it")
        return scalars[payload]
    raise ProtocolError(ErrorCode.BAD_REQUEST, f"unknown argument object {_short(value)}")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) < 80 else text[:77] + "..."


def meta_message(tid: str, t: torch.Tensor) -> dict:
    """The wire's metadata of a new tensor: ``{id, dtype, shape, requires_grad}``."""
    return {"id": tid, "dtype": dtype_name(t.dtype), "shape": list(t.shape), "requires_grad": t.requires_grad}


def store_tensors(session: Session, settings: Settings, pairs: list[tuple[str, CustomTensor]]) -> None:
    """Keep new tensors under their ids, all or none: the session's limits are checked before the first is kept.

    A put's element count was checked at admission (``guards.check_limits``); what steps
    compute goes through ``store_made``, which checks theirs.
    """
    if len(session.tensors) + len(pairs) > settings.max_tensors_per_session:
        raise ProtocolError(
            ErrorCode.TOO_LARGE,
            f"session would hold {len(session.tensors) + len(pairs)} tensors: "
            f"limit max_tensors_per_session={settings.max_tensors_per_session}",
        )
    # by storage: an output that is a view of a tensor the session holds brings no new bytes
    session.storages.hold([ct for _, ct in pairs], settings.max_session_bytes)
    session.tensors.update(pairs)


def store_made(session: Session, settings: Settings, pairs: list[tuple[str, CustomTensor]]) -> None:
    """``store_tensors`` for tensors a step computed (an op's outputs, a grad step's grads), each
    held to ``max_tensor_elements`` first (a call's outputs were held to it on meta already, before
    its kernel ran, except where only the kernel could say their size: ``meta_check.Needs``)."""
    limit = settings.max_tensor_elements
    for tid, ct in pairs:
        if ct.value.numel() > limit:
            check_elements(repr(tid), ct.value.numel(), settings)
    store_tensors(session, settings, pairs)


def check_elements(what: str, numel: int, settings: Settings) -> None:
    """``what``, a tensor of ``numel`` elements, held to ``max_tensor_elements``."""
    if numel > settings.max_tensor_elements:
        raise ProtocolError(ErrorCode.TOO_LARGE, f"{what} would have {numel} elements: limit "
                            f"max_tensor_elements={settings.max_tensor_elements}")


def data_bytes(ct: CustomTensor) -> int:
    """The bytes of ``ct``'s value, which are also the bytes its grad takes once it has one."""
    return ct.value.nbytes


def step_refs(values, found: set[str]) -> set[str]:
    """The ids ``values`` (a step's resolved-before args or kwargs' values) name by ``ref`` or
    ``grad_of``: the tensors an in-place step may have changed. Its nesting was checked by
    ``resolve_value`` before the step ran."""
    for value in values:
        if isinstance(value, dict) and len(value) == 1:
            (tag, payload), = value.items()
            if tag in ("ref", "grad_of") and isinstance(payload, str):
                found.add(payload)
        elif isinstance(value, list):
            step_refs(value, found)
    return found


def check_new_ids(session: Session, ids: list[str]) -> None:
    tensors = session.tensors
    for tid in ids:
        if tid in tensors:
            raise ProtocolError(ErrorCode.CONFLICT, f"tensor id {tid!r} is already used in this session")
    if len(ids) > 1 and len(set(ids)) != len(ids):
        raise ProtocolError(ErrorCode.CONFLICT, f"output ids repeat: {ids}")
