"""``ProgramRun``: what each step handler of a running program is given besides its step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..sessions.store import Session
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

    ``forward``: ``anomaly.Forwards`` when the program was sent with ``detect_anomaly`` (its call
    steps mark the autograd nodes they make), else ``None``.

    ``watch``: the program's ``ProgramWatch`` (its time limit, its time left and cancel; ``None`` when
    nothing watches it), asked between the steps of a template too (``templates``); ``untimed``: the
    work up to which a call needs no ``step_cost.hold`` (``step_cost.untimed``); ``flops``: the work
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
