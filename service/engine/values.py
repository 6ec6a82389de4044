"""What every step handler shares: the program's run (``ProgramRun``), its wire values resolved, the
tensors its steps make stored and their bytes counted, the graph's saved tensors too (``counting_saved``).

Shared by the step handlers in ``runner``, ``step_kinds``, ``autograd_steps`` and the templates'. One
module, past the usual size, because the walk of one op passes through each of these at every step:
split, each step went in and out of three files.
"""

from __future__ import annotations

import contextlib
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from remote_autograd.proto import ErrorCode, ProtocolError, dtype_from_name, dtype_name

from ..sessions.store import CustomTensor, Session
from ..settings import Settings
from .program_plan import PLAIN


@dataclass(slots=True)
class ProgramRun:
    """One program's run as its steps see it: the session, the server's settings, and how a fetch
    writes its tensor into the answer.

    ``as_json`` is the answer's format. A fetch encodes its tensor at its own step, in that
    format: the answer then holds the value as it was at the fetch (later steps of the program
    may change the tensor in place), and the encoded form is what goes out, with no copy between.

    ``views``: a fetch may hand out a view of a big tensor's bytes instead of a copy (the answer
    streams it as a frame). Only once no later step of the program can write to a tensor:
    ``run_steps`` turns it on after the program's last step that is not a fetch or a free.

    ``omit_known_meta`` (the program's flag): steps whose result only repeats what the client
    chose or inferred (the metadata of outputs it named) answer ``None`` and do not build it;
    a ``backward`` still answers its ``no_grad``, an ``out_many`` call and an ``allow_unused``
    grad still answer their metadata (only the server knows it).

    ``check``: how its calls are checked (``program_plan.for_program``: ``PLAIN``, the meta check of each, with
    ``REMOTE_AUTOGRAD_REPLAY=off`` and for a program seen once; a repeat's ``PlanRun``);
    ``torch_state``: the program's torch settings where they are not torch's defaults (``None``: the
    defaults), which a template's own plan is keyed by too (``templates.run_plainly``).

    As ``current()`` of ``ops._context`` while its steps run, it is the ops' ``RunContext`` too (the
    session's ``generator`` and ``device``, ``max_elements``): the runner sets it, no object of its own.

    ``forward``: ``anomaly.Forwards`` when the program was sent with ``detect_anomaly`` (its call
    steps mark the autograd nodes they make), else ``None``.

    ``watch``: the program's ``ProgramWatch`` (its time limit, its time left and cancel; ``None`` when
    nothing watches it), asked between the steps of a template too (``templates``); ``untimed``: the
    work up to which a call needs no ``step_cost.hold`` (``runner.run_steps``); ``flops``: the work
    of its calls so far (a CUDA graph's capture keeps it: ``graph_steps``).
    """

    session: Session
    settings: Settings
    as_json: bool = False
    views: bool = False
    omit_known_meta: bool = False
    check: Any = PLAIN
    torch_state: Any = None
    watch: Any = None
    forward: Any = None
    untimed: float = 0.0
    flops: float = 0.0

    @property
    def generator(self) -> torch.Generator:
        return self.session.generator

    @property
    def device(self) -> torch.device:
        return self.session.device

    @property
    def max_elements(self) -> int:
        return self.settings.max_tensor_elements


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
    """``resolve_value`` of each value (plain numbers and flags returned as they are, and a known tensor's
    ``{ref}``, the most common argument, looked up: without a call)."""
    tensors = session.tensors
    resolved = []
    for v in values:
        if type(v) in _PLAIN:
            resolved.append(v)
            continue
        if type(v) is dict and len(v) == 1:
            ref = v.get("ref")
            ct = tensors.get(ref) if type(ref) is str else None
            if ct is not None:
                resolved.append(ct.value)
                continue
        resolved.append(resolve_value(v, session))  # anything else, and an unknown id's error
    return resolved


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


# -- the autograd graph's saved tensors: counted against the session while the graph keeps them ------


class _Saved:
    """What a graph node keeps instead of the tensor: the alias, its version when saved, and the
    ledger key to give back."""

    __slots__ = ("tensor", "version", "key", "unpin")

    def __init__(self, tensor: torch.Tensor, key: object, unpin) -> None:
        self.tensor, self.version, self.key, self.unpin = tensor, tensor._version, key, unpin

    def __del__(self) -> None:  # the node freed it: may run on any thread, so it only queues the key
        self.unpin(self.key)


def pinned(session: Session, t: torch.Tensor, limit: int) -> _Saved:
    """``t``'s storage counted while what is returned lives, as a graph node's saved tensor is (a checkpoint
    region keeps the tensors its function reads: ``checkpoint_regions``)."""
    return _Saved(t.detach(), session.storages.pin(t, limit), session.storages.unpin)


def counting_saved(session: Session, limit: int) -> contextlib.AbstractContextManager:
    """The hooks that charge what the graph saves to ``session``, around a program's steps.

    An op recorded for backward saves tensors (``sin`` its input, ``exp`` its output, a composite op its
    intermediates); the graph keeps them alive after the client frees every id that named them.
    Uncounted, a chain of 150 ``sin`` on 16 MiB tensors that freed each id as it went held 2.4 GB while
    the session was charged 32 MiB. So pack counts one more reference to the saved tensor's storage in
    the session's ``StorageLedger`` (charged, and 413 against ``limit``, only when the session does not
    hold that storage already) and returns a small ``_Saved`` holding a detached alias; unpack hands the
    alias back (autograd gives it the saved node's graph again, so values, gradients and double backward
    are torch's own). The version torch checks at unpack without hooks is checked here (an in-place
    write to a saved tensor is torch's own error at backward). The reference goes when autograd drops
    the ``_Saved`` (a backward without ``retain_graph``, the last id of the graph freed): exactly as
    long as the graph keeps the bytes. Detaching matters: a saved output holding itself (its
    ``grad_fn`` saves it) would be a cycle through C++ that nothing collects.
    """
    ledger = session.storages

    def pack(t: torch.Tensor):
        if t.is_meta:  # the meta check's own graphs hold no memory
            return t
        return _Saved(t.detach(), ledger.pin(t, limit), ledger.unpin)

    def unpack(saved):
        if type(saved) is not _Saved:
            return saved
        t = saved.tensor
        if t._version != saved.version:  # with hooks torch leaves this check to them (the alias shares the counter)
            raise RuntimeError(
                "one of the variables needed for gradient computation has been modified by an inplace operation: "
                f"[{t.type()} {list(t.shape)}], is at version {t._version}; expected version {saved.version} "
                "instead. Hint: the backtrace further above shows the operation that failed to compute its "
                "gradient. The variable in question was changed in there or anywhere later. Good luck!")
        return t

    return torch.autograd.graph.saved_tensors_hooks(pack, unpack)
