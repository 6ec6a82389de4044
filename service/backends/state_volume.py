"""The state volume (``REMOTE_AUTOGRAD_STATE_DIR``): sessions written on a graceful stop, restored at the next start.

On SIGTERM uvicorn lets running requests finish, then the app's lifespan ends: each
tenant's sessions are written (by the process that holds them: this one, or each
tenant's worker process) and the next server started on the same directory restores
them, ids, tokens and all, so a client's next request just works. ``kill -9`` writes
nothing: its sessions are lost (``410``/``404``, the SDK's ``SessionLost``).

Layout: one directory per tenant, ``tenant-<tag>`` (``sessions.store.tenant_tag``: a digest of the
token, ``open`` without tokens: no token is ever written), holding ``sessions.raf``. Its format is the
wire's framed encoding (``proto/codec.py``): a msgpack header, then raw bytes. The
header lists each session: its id, its generator's state, the ids and digests of the
programs it ran (its retry memory), and its tensors' layouts (``tensor_snapshot``); each
distinct storage's bytes are one frame. Nothing is pickled; reading it back decodes
plain values and copies each frame once, onto the device.

What is kept: values as stored (strides, storage offsets, which ids share memory),
grads, ``requires_grad``, retained-grad marks, generator state, and which program ids ran.
What is not: autograd graphs (a backward through a tensor computed before the restart
raises), the answers the retry cache held (a retried program id that ran before the
restart answers ``409 conflict`` and never runs twice), expiry clocks (restarted).

A directory is written whole and then renamed into place, and removed once restored,
so a later crash never brings back stale state.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from remote_autograd.proto import ErrorCode, ProtocolError
from remote_autograd.proto.codec import pack_frames, unpack_frames

from ..engine import run_ahead
from ..engine.values import store_tensors
from ..logs import LIFECYCLE
from ..sessions.store import ProgramAnswer, tenant_tag
from ..sessions.tensor_snapshot import rebuild, snapshot

if TYPE_CHECKING:
    from .local_sessions import LocalSessions
    from ..settings import Settings

log = logging.getLogger("remote_autograd.service")
lifecycle = logging.getLogger(LIFECYCLE)

FORMAT = 1
_FILE = "sessions.raf"


def tenant_dir(root: Path, owner: str | None) -> Path:
    """Where ``owner``'s sessions are kept: named by a digest of the token, never the token."""
    return root / f"tenant-{tenant_tag(owner)}"


# -- writing --------------------------------------------------------------------------------


def save(local: "LocalSessions", directory: Path, owner: str | None) -> int:
    """Write every session of ``owner`` to ``directory``; how many. Each session is held (its lock)
    from its snapshot until the file is written: nothing changes what is being saved."""
    with contextlib.ExitStack() as held:
        sessions = []
        for session in local.store.sessions():
            if session.owner == owner:
                held.enter_context(session.lock)
                if not session.closed:
                    run_ahead.settle(session)  # a program answered early: its last steps are part of the state
                    sessions.append(session)
        if not sessions:
            return 0
        messages, frames = [], []
        for session in sessions:
            layout, storages = snapshot(session.tensors)
            messages.append({"id": session.id, "generator": session.generator.get_state().numpy().tobytes(),
                             "programs": [[pid, entry[0]] for pid, entry in session.programs.items()],
                             "late_failure": session.late_failure,
                             "storages": [{"frame": len(frames) + i} for i in range(len(storages))], **layout})
            frames += storages
        # uint8 tensors stand in for the frames: pack_frames reads only their sizes, and each is
        # copied to the host (from a GPU) only as it is written
        parts, _ = pack_frames({"format": FORMAT, "sessions": messages}, frames)
        _write_whole(directory, parts)
    return len(sessions)


def _write_whole(directory: Path, parts: list) -> None:
    """``parts`` as ``directory``/sessions.raf, appearing all at once (a temporary directory renamed)."""
    temporary = directory.with_name(directory.name + ".writing")
    shutil.rmtree(temporary, ignore_errors=True)
    temporary.mkdir(parents=True)
    with open(temporary / _FILE, "wb") as out:
        for part in parts:
            out.write(memoryview(part.cpu().numpy()) if isinstance(part, torch.Tensor) else part)
        out.flush()
        os.fsync(out.fileno())
    shutil.rmtree(directory, ignore_errors=True)
    temporary.rename(directory)
    _sync_dir(directory.parent)


def _sync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# -- reading --------------------------------------------------------------------------------


def restore(local: "LocalSessions", directory: Path, owner: str | None) -> list[str]:
    """Make again the sessions saved in ``directory`` as ``owner``'s, then remove it; the id prefixes
    of those sessions (the part before the first ``.``). A session that no longer fits the
    settings' limits is left out (logged): its id answers as unknown."""
    path = directory / _FILE
    if not path.is_file():
        return []
    try:
        ids = _restore_file(local, path, owner)
    except (ProtocolError, OSError, KeyError, TypeError, ValueError, RuntimeError) as exc:
        kept = directory.with_name(f"{directory.name}.unreadable-{int(time.time())}")
        directory.rename(kept)
        log.error("state %s could not be restored (%s): kept as %s; its sessions are lost", directory, exc, kept)
        return []
    shutil.rmtree(directory, ignore_errors=True)
    _sync_dir(directory.parent)
    lifecycle.info("%d session(s) restored from %s", len(ids), directory)
    return sorted({sid.partition(".")[0] for sid in ids})


def _restore_file(local: "LocalSessions", path: Path, owner: str | None) -> list[str]:
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    message = None
    try:
        message = unpack_frames(mapped)
        if message.get("format") != FORMAT:
            raise ValueError(f"format {message.get('format')!r}, this server reads {FORMAT}")
        return [sid for saved in message["sessions"] if (sid := _restore_session(local, saved, owner))]
    finally:
        message = None  # its frames view the mapping
        with contextlib.suppress(BufferError):  # a traceback still holding a frame: closed when it goes
            mapped.close()


def _restore_session(local: "LocalSessions", saved: dict, owner: str | None) -> str | None:
    store = local.store
    try:
        session = store.create(owner, sid=saved["id"])
    except ProtocolError as exc:
        log.error("session %s not restored: %s", saved["id"], exc.message)
        return None
    session.worker = local.workers.least_loaded(s.worker for s in store.sessions() if s is not session)
    with session.lock:
        try:
            pairs = rebuild(saved, [_on_device(data, session.device) for data in saved["storages"]], session.lost_graphs)
            store_tensors(session, local.settings, pairs)  # charged as any new tensor: the limits hold
        except ProtocolError as exc:
            refused = exc.message
        else:
            refused = None
            session.generator.set_state(torch.frombuffer(bytearray(saved["generator"]), dtype=torch.uint8))
            for pid, digest in saved["programs"]:
                session.programs[pid] = (digest, _ran_before_restart(pid), False)
            session.late_failure = saved.get("late_failure")  # the next program still hears of it
    if refused is not None:
        log.error("session %s not restored: %s", saved["id"], refused)
        store.delete(session.id, owner)
        return None
    return session.id


def _on_device(data: memoryview, device: torch.device) -> torch.Tensor:
    if not data.nbytes:
        return torch.empty(0, dtype=torch.uint8, device=device)
    return torch.frombuffer(data, dtype=torch.uint8).to(device, copy=True)


def _ran_before_restart(pid: str) -> ProgramAnswer:
    """What a retry of a program that ran before the restart answers: it never runs twice."""
    err = ProtocolError(ErrorCode.CONFLICT, f"program {pid!r} already ran, before the server restarted; its answer "
                        "was not kept: read the tensors it made or changed again")
    return ProgramAnswer(err.status, err.answer(program_id=pid))


# -- a single server's every tenant ---------------------------------------------------------


def save_all(local: "LocalSessions", settings: "Settings") -> None:
    root = Path(settings.state_dir)
    for owner in {s.owner for s in local.store.sessions()}:
        lifecycle.info("%d session(s) saved for the next start", save(local, tenant_dir(root, owner), owner))


def restore_all(local: "LocalSessions", settings: "Settings") -> None:
    """Every configured tenant's saved sessions (a directory of a token no longer configured stays as it is)."""
    root = Path(settings.state_dir)
    for owner in settings.tokens or (None,):
        restore(local, tenant_dir(root, owner), owner)
