"""Where ``torch.utils.checkpoint(fn, *args, use_reentrant=False)``'s function runs, told to the server.

torch runs ``fn`` under its ``_checkpoint_hook`` (saved-tensor hooks whose pack closes over the call's
``_CheckpointFrame``); on the client no autograd node packs anything (the server does the autograd), so
those hooks save nothing by themselves. Instead, as each step is queued (``SessionCore.enqueue``), the top
of torch's saved-tensor hooks says which checkpoint call the step belongs to: when it changes, ``sync``
queues a ``checkpoint`` step before it (a region opens: the call's tensor arguments, read from the
``checkpoint`` call's own frame on the stack, and its options) or a ``checkpoint_end`` step (the function
returned: its frame says ``forward_completed``, or the hooks show an enclosing region or none). The server
then drops what the region's ops save and recomputes it at the backward
(``service/engine/checkpoint_regions.py``). An outer checkpoint whose function runs no op before an inner
one's is found on the stack too, and opened first (its hooks are below the inner's).

torch's ``context_fn`` (selective checkpointing) and ``debug`` change what the function runs under; they
are refused at the function's first op.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

import torch
from torch.utils import checkpoint as _torch_checkpoint

from remote_autograd.proto.messages import CheckpointEndStep, CheckpointStep

from ._steps import Origin, make_step, where

TOP_HOOKS = torch._C._autograd._top_saved_tensors_default_hooks  # (pack, unpack) or None
_PACK = "_checkpoint_hook.__init__.<locals>.pack_hook"
_CALL = inspect.unwrap(_torch_checkpoint.checkpoint).__code__  # checkpoint(...)'s own frame holds ``gen``


class Regions:
    """A session's open regions, outermost first: ``(frame, region id)``; ``pack``: the pack hook on
    top when the regions were last made those of the hooks (None: look again at the next step)."""

    __slots__ = ("open", "pack")

    def __init__(self) -> None:
        self.open: list[tuple[Any, str]] = []
        self.pack = None


def sync(session: Any, hooks: tuple | None) -> None:
    """Queue the ``checkpoint_end`` and ``checkpoint`` steps that make the session's regions those of the
    hooks now on top (see the module's docstring)."""
    regions: Regions = session._regions
    pack = None if hooks is None else hooks[0]
    frame = _frame_of(pack)
    depth = next((k for k, (f, _) in enumerate(regions.open) if f is frame), None) if frame is not None else None
    regions.pack = pack  # first: the steps queued below find the regions in sync (a save_on_cpu's pack too)
    if frame is None:
        _close(session, 0)
    elif depth is not None:
        _close(session, depth + 1)
    else:
        done = next((k for k, (f, _) in enumerate(regions.open) if f.forward_completed), len(regions.open))
        _close(session, done)
        try:
            for outer_first, gen in _unopened(frame, regions):
                _open(session, outer_first, gen)
        except BaseException:  # refused: each later op of the function is refused too, none runs unrecorded
            regions.pack = None
            raise


def _frame_of(pack: Any) -> Any:
    """The ``_CheckpointFrame`` a pack hook of torch's checkpoint closes over; None for any other hook."""
    if pack is None or getattr(pack, "__qualname__", None) != _PACK or pack.__module__ != _torch_checkpoint.__name__:
        return None
    return pack.__closure__[pack.__code__.co_freevars.index("frame")].cell_contents


def _close(session: Any, depth: int) -> None:
    """Close the regions from ``depth`` in (the server closes those inside the one it is told of)."""
    regions: Regions = session._regions
    if depth >= len(regions.open):
        return
    rid = regions.open[depth][1]
    del regions.open[depth:]
    step = make_step(CheckpointEndStep, region=rid)

    def undo() -> None:  # its program failed before it: the server may hold the region open, so say it again
        session._queue.append(step)
        session._origins.append(None)

    session.enqueue(step, Origin("checkpoint_end", where(), undo=undo))


def _open(session: Any, frame: Any, gen: Any) -> None:
    locals_ = gen.gi_frame.f_locals
    if locals_["context_fn"] is not _torch_checkpoint.noop_context_fn or frame.unpack_error_cb is not None:
        raise RuntimeError("torch.utils.checkpoint(..., use_reentrant=False) with context_fn (selective "
                           "checkpointing) or debug=True is not supported on remote tensors: the server recomputes "
                           f"the function's steps as they were recorded. Leave both out ({where() or '?'})")
    check = locals_["determinism_check"]
    rid = session.new_id()
    inputs = [a._id for a in locals_["args"]
              if getattr(a, "_session", None) is session and a._grad_owner is None and a._error is None]
    step = make_step(CheckpointStep, region=rid, inputs=inputs, preserve_rng_state=bool(locals_["preserve_rng_state"]),
                     determinism_check=check if check in ("default", "none") else "default",
                     early_stop=bool(frame.early_stop))
    regions: Regions = session._regions
    regions.open.append((frame, rid))

    def undo() -> None:  # it never ran: a later op of the function opens the region again
        for k, (_, r) in enumerate(regions.open):
            if r == rid:
                del regions.open[k:]
                break
        regions.pack = None  # the next step queued under any hooks looks again

    session.enqueue(step, Origin("checkpoint", where(), undo=undo))


def _unopened(frame: Any, regions: Regions) -> list[tuple[Any, Any]]:
    """``frame`` and the checkpoint calls around it whose regions are not open yet (an outer function that ran
    no op before its inner checkpoint), outermost first: ``(frame, torch's generator that made it)``, read from
    the frames of the ``checkpoint`` calls on the stack (the call's arguments and options are its locals)."""
    chain: list[tuple[Any, Any]] = []
    f = sys._getframe(1)
    while f is not None:
        gen = f.f_locals.get("gen") if f.f_code is _CALL else None
        made = None if gen is None or gen.gi_frame is None else gen.gi_frame.f_locals.get("new_frame")
        if made is frame:
            chain.append((made, gen))
        elif made is not None and chain:
            if any(made is open_frame for open_frame, _ in regions.open):
                break
            args = gen.gi_frame.f_locals["args"]
            if args and len(made.saved_args) == len(args) and not made.forward_completed:  # its hooks pushed
                chain.append((made, gen))
        f = f.f_back
    if not chain:
        raise RuntimeError("an op on remote tensors runs under torch.utils.checkpoint's saved-tensor hooks, but not "
                           "inside a call of torch.utils.checkpoint.checkpoint(..., use_reentrant=False) the SDK can "
                           f"read its arguments from: call checkpoint itself ({where() or '?'})")
    return chain[::-1]
