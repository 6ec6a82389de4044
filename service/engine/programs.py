"""``run_program`` and ``read_tensor``: what a backend asks of a session, under the session's lock.

The retry memory lives here, not in the store: a program id seen before gets its first answer
(re-encoded if the client now asks in the other encoding), the same id with other content is a 409.
"""

from __future__ import annotations

import hashlib
import time
from typing import Callable

from remote_autograd.proto import ErrorCode, ProtocolError
from remote_autograd.proto.messages import Program

from ..sessions.store import ProgramAnswer, Session, check_open
from ..settings import Settings
from .answers import keepable, reencode, tensor_message
from .program_watch import ProgramWatch
from .runner import run_steps

StepObserver = Callable[[str, float], None]  # (op or step kind, seconds): the metrics' step histogram


def run_program(session: Session, program: Program, body: bytes, as_json: bool, settings: Settings, *,
                observe: StepObserver | None = None, watch: ProgramWatch | None = None) -> ProgramAnswer:
    """Run ``program`` under the session's lock; a retried program id gets its first answer.

    ``body`` is what identifies the program's content (for a framed body, its header);
    ``watch`` stops the program between steps (time limit, client gone).
    """
    digest = hashlib.blake2b(body, digest_size=16).digest()
    with session.lock:
        check_open(session)
        session.last_used = time.monotonic()
        cached = session.programs.get(program.id)
        if cached is not None:
            if cached[0] != digest:
                raise ProtocolError(
                    ErrorCode.CONFLICT, f"program id {program.id!r} was already used for a different program"
                )
            return cached[1] if cached[2] == as_json else reencode(cached[1], as_json)
        outcome = run_steps(session, program, settings, as_json=as_json, observe=observe, watch=watch)
        session.programs[program.id] = (digest, keepable(outcome, program.id), as_json)
        while len(session.programs) > settings.program_cache_size:
            session.programs.popitem(last=False)
        session.last_used = time.monotonic()
        return outcome


def read_tensor(session: Session, tid: str, *, value: bool, grad: bool, as_json: bool) -> dict:
    """One tensor's message, read under the session's lock."""
    with session.lock:
        check_open(session)
        # copies, never views: the answer is sent after the lock is released, while programs may run
        return tensor_message(tid, session.tensor(tid), value=value, grad=grad, as_json=as_json, views=False)
