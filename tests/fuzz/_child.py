"""One case of the value fuzz, run in a forked child through the server's own path, with canaries.

The path is a ``call`` step's: the case's tensors are stored in a fresh session of a real
``SessionStore`` and a program of one call step runs through ``engine.runner.run_program`` (the
op table's resolution, the meta check and the value checks, the kernel, the error conversion), then,
when it answered 200 and made tensors that require grad, a backward through them (a kernel's
backward reads the same values).

Out-of-range reads are seen with canaries: before the case, tensors filled with a 4-byte pattern are
allocated around it, some kept (neighbours) and some freed (a just-freed secret of another tensor).
Each case runs twice, with two patterns. A read is flagged when an output (any tensor or grad the
session holds afterwards) contains the pattern's bytes, or when the two runs' outputs or error
messages differ: with the same arguments and the same seed, torch's kernels give the same bits
(one thread), so a difference is memory outside the arguments showing through. An error message
with a heap address in it (``0x`` and 8 or more hex digits) is a leak too.
"""

from __future__ import annotations

import hashlib
import logging
import re
from typing import Any

import torch

from remote_autograd.proto import dtype_name
from remote_autograd.proto.messages import validate_program
from remote_autograd.service.engine.runner import run_program
from remote_autograd.service.engine.values import store_tensors
from remote_autograd.service.sessions.store import CustomTensor, SessionStore
from remote_autograd.service.settings import Settings

from ._calls import BaseCall, Case, applied

PATTERNS = (0x7A11CA7E, 0x79BADBAD)  # as float32 about 1.9e35 and 1.2e35: no sample computes either
CANARY_ELEMENTS = (4, 16, 64, 256, 1024, 4096, 16384, 60000)  # a few of each size class of the allocator
ADDRESS = re.compile(r"0x[0-9a-fA-F]{8,}")
SETTINGS = Settings.from_env({}, max_session_bytes=512 << 20, max_total_bytes=1 << 30, max_tensor_elements=1 << 26)


class _Unexpected(logging.Handler):
    """The runner's log of an exception it did not expect (a bug of ours, answered as a 422 anyway)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append(record.getMessage() + (f": {record.exc_info[1]!r}" if record.exc_info else ""))


_unexpected = _Unexpected()
logging.getLogger("remote_autograd.service.engine.runner").addHandler(_unexpected)


def plant(pattern: int) -> list[torch.Tensor]:
    """Canaries filled with ``pattern``: the neighbours it returns, and as many freed already."""
    kept, freed = [], []
    for n in CANARY_ELEMENTS:
        for into in (kept, freed, kept, freed):
            into.append(torch.full((n,), pattern, dtype=torch.int32))
    del freed
    return kept


def run(call: BaseCall, case: Case, differentiable: bool, pattern: int) -> dict[str, Any]:
    """The answer to ``case`` and a digest of every tensor the session holds afterwards."""
    canaries = plant(pattern)
    args, kwargs = applied(call, case)
    store = SessionStore(SETTINGS)
    session = store.create()
    session.generator.manual_seed(0)
    tensors: list[tuple[str, CustomTensor]] = []
    inplace = call.spelling.endswith("_") and not call.spelling.endswith("__")
    wire_args = [_wire(a, tensors, differentiable and not inplace) for a in args]
    wire_kwargs = {k: _wire(v, tensors, differentiable and not inplace) for k, v in kwargs.items()}
    store_tensors(session, SETTINGS, tensors)
    del _unexpected.seen[:]
    step = {"kind": "call", "op": call.spelling, "args": wire_args, "kwargs": wire_kwargs,
            "out": [] if inplace else ["out"], "out_many": not inplace}
    answer = _program(session, [step])
    if answer["status"] == 200 and not inplace:
        answer["backward"] = _backward(session)
    found = _found(session, pattern)
    answer.update(found)
    if _unexpected.seen:
        answer["unexpected"] = _unexpected.seen[0][:300]
    del canaries
    return answer


def _program(session, steps: list) -> dict[str, Any]:
    program = validate_program({"id": "p" + str(len(session.programs)), "steps": steps})
    outcome = run_program(session, program, program.id.encode(), True, SETTINGS)
    if outcome.status == 200:
        return {"status": 200}
    error = outcome.body["error"]
    return {"status": outcome.status, "code": error["code"], "message": error["message"][:500]}


def _backward(session) -> dict[str, Any] | None:
    """A backward through the outputs that require grad (their sum), or None when none does."""
    outs = [tid for tid, ct in session.tensors.items() if tid.startswith("out.") and ct.value.requires_grad
            and ct.value.is_floating_point()]
    if not outs:
        return None
    steps = [{"kind": "call", "op": "sum", "args": [{"ref": tid}], "out": [f"sum.{tid}"]} for tid in outs]
    steps.append({"kind": "backward", "tensors": [f"sum.{tid}" for tid in outs]})
    return _program(session, steps)


def _wire(value: Any, tensors: list, requires_grad: bool) -> Any:
    """``value`` as a call step carries it; its tensors joined to ``tensors`` under new ids."""
    if isinstance(value, torch.Tensor):
        tid = f"t{len(tensors)}"
        if requires_grad and value.is_floating_point():
            value.requires_grad_(True)
        tensors.append((tid, CustomTensor(value)))
        return {"ref": tid}
    if isinstance(value, torch.dtype):
        return {"dtype": dtype_name(value)}
    if isinstance(value, slice):
        return {"slice": [value.start, value.stop, value.step]}
    if value is Ellipsis:
        return {"ellipsis": None}
    if isinstance(value, (list, tuple)):
        return [_wire(v, tensors, requires_grad) for v in value]
    return value


def _found(session, pattern: int) -> dict[str, Any]:
    """A digest of the session's tensors and grads, and whether the canaries' pattern is among their bytes."""
    digest = hashlib.blake2b(digest_size=16)
    needle = pattern.to_bytes(4, "little")
    seen = False
    for tid in sorted(session.tensors):
        ct = session.tensors[tid]
        for t in (ct.value, ct.grad):
            if t is None or t.layout != torch.strided:
                continue
            past = _past_storage(t)
            if past:
                return {"digest": "", "pattern": False, "past": f"{tid}: {past}"}
            raw = _bytes(t)
            digest.update(tid.encode() + str(t.dtype).encode() + str(list(t.shape)).encode() + raw)
            seen = seen or needle in raw
    return {"digest": digest.hexdigest(), "pattern": seen}


def _past_storage(t: torch.Tensor) -> str:
    """Whether ``t``'s view reaches past its storage, reckoned in Python ints: torch's own reckoning
    is int64 and wraps around (``as_strided_`` to 2^62 elements of a 4-byte storage passes it)."""
    sizes, strides = list(t.shape), list(t.stride())
    numel = 1
    for size in sizes:
        numel *= size
    if numel != t.numel():
        return f"{numel} elements, which torch counts as {t.numel()}"
    if not numel:
        return ""
    end = (t.storage_offset() + sum((size - 1) * stride for size, stride in zip(sizes, strides)) + 1) * t.element_size()
    held = t.untyped_storage().nbytes()
    return f"a view of sizes {sizes} and strides {strides} needs {end} bytes of a {held}-byte storage" if end > held else ""


def _bytes(t: torch.Tensor) -> bytes:
    """The values' bytes, C-contiguous (a copy resolves what a view only marks: conjugation, expansion, zeros)."""
    if not t.numel():
        return b""
    plain = torch.empty(t.shape, dtype=t.dtype)
    plain.copy_(t.detach())
    return plain.reshape(-1).view(torch.uint8).numpy().tobytes()
