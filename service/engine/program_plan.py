"""``PlanRun``: a repeated program's calls checked by their pattern, not argument by argument.

The plain path it replaces: before each call, ``meta_check.check_call`` builds its memo's key
from every argument's layout (shape, strides, offset, dtype, storage and its sharing: a few
torch calls per tensor), for every call of every program. A training loop sends the same
program each step with new ids and new values, so those keys come out the same each time.

A session keeps the plans of its last few programs that succeeded (``PLANS_PER_SESSION``,
least recently used first out), keyed by the program's step kinds and ops, in its ``Caches``
(``speed_caches``, outside the session itself). A plan is recorded only for a repeat: the first
sighting of a key is remembered (``Caches.seen``) and runs plainly, the second records, the
third and later are checked against it. A plan holds, per
call step, its *pattern* and what its layouts answered (``meta_check.Needs``: its bytes, its
largest output and its cost, which the runner holds to the limits each time). The pattern
names every tensor argument by its origin instead of its id: ``("p", step, k)`` for the k-th
output of an earlier call of this program, ``("s", n)`` for the n-th tensor taken from the
session (its value, or its grad), with every other argument as its type and value (an
arithmetic op's floats by type only: its entry's ``floats_keep_layout``). A session tensor's layout is taken
once, at its first use in the program (the plan's ``layouts``).

A template's runs (``templates.run_plainly``) have plans of their own, kept by the template
(recorded from its first run: a template exists to repeat): a number a run binds
(``{scalar: name}``) is part of a pattern by its value, as a literal is. A template's steps are
fixed, so a run whose bound inputs have the layouts (and grads' layouts, and storage sharing) and
numbers of a run the plan vouched for call by call (``Plan.inputs``) is vouched for whole
(``Vouched``): its per-call pattern check is skipped; any other inputs take the pattern check.

A call is *planned* (``check_planned``: only the checks that read values run again) when its
pattern equals the plan's, and each of its tensor arguments is *known*: a session tensor whose
layout equals the plan's for its origin, or an output of a planned call. Layouts of outputs are
a function of the op and its arguments' layouts and scalars, so equal patterns of known
tensors give equal memo keys. Anything else (a changed int or a changed float of an op not
in that list, a call whose check read a 0-d tensor's value, an op that answered a
data-dependent bound) runs the plain check; its outputs are then not known, so what uses them
is checked the plain way too. An in-place call keeps its target's layout, except the few that
change it, a call with ``out=`` tensors (torch resizes them) and an op of our own: after those,
every layout is taken afresh at its next use. Steps that are not calls make tensors of their
own (puts, grads, loads) or change grads: those are taken afresh from the session at their
next use. A plan changes no answer, error or step: it is one check skipped.

How a program's calls are checked is chosen once, when it starts (``for_program``, ``for_template``): ``PLAIN`` (the
meta check of every call), a ``PlanRun`` (a repeat: the pattern check), a ``Vouched`` template
run; a capture (``graph_steps``) runs plainly. The runner asks the one chosen: ``check_call``
before each call, ``ran`` after it, ``other`` after any other step, ``finish`` at the end (all but the
first do nothing on the plain path: the runner asks them only of a checker that is not ``PLAIN``).
``tests/service/engine/test_program_plan.py`` runs the training tests' programs with and without it;
``python -m bench runner`` and ``model`` print its rows beside ``REMOTE_AUTOGRAD_REPLAY=off``.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch

from remote_autograd.proto.messages import (BackwardStep, CallStep, CheckpointEndStep, CheckpointStep, ClearGradsStep,
                                            FetchStep, FreeStep, PutStep, RetainGradStep, SetGradStep,
                                            SetRequiresGradStep)

from .. import ops as _ops
from . import meta_check, speed_caches
from .meta_check import layout

PLANS_PER_SESSION = 4  # a training loop's step, its evaluation step, a few more
# A plan of a one-call program (an eager op: a call, then a free) costs more bookkeeping than the
# memoized check it stands in for: such programs take the plain path.
PLAN_MIN_CALLS = 2
SEEN_PER_SESSION = 16  # program keys sighted once, remembered to know their second sighting
# change no layout, no grad (a checkpoint region's steps, open and close: nor do they)
_KEEPS_TENSORS = (FetchStep, FreeStep, RetainGradStep, SetRequiresGradStep, CheckpointStep, CheckpointEndStep)
_CHANGES_GRADS = (BackwardStep, SetGradStep, ClearGradsStep)
_relayouts: dict[str, bool] = {}  # a name the table resolved -> whether its calls take every layout afresh


class Plan:
    """What one run of a program recorded: per call step, its pattern and what its layouts answered
    (``None``: not plannable); per session origin, its layout."""

    __slots__ = ("calls", "layouts", "inputs")

    def __init__(self) -> None:
        self.calls: dict[int, tuple[tuple, Any]] = {}
        self.layouts: list[tuple] = []
        # a template's: its bound inputs' layouts and numbers (``inputs_key``) when this run was
        # vouched for call by call by the plan before it, else None
        self.inputs: tuple | None = None


class PlainCheck:
    """The plain path: every call meta-checked (``meta_check.check_call``), nothing recorded."""

    __slots__ = ()

    def check_call(self, index: int, step: CallStep, call, args: list, kwargs: dict) -> meta_check.Needs:
        return meta_check.checked(call, args, kwargs, step.grad_enabled)[0]

    def ran(self, index: int, step: CallStep, call, ids) -> None:
        pass

    def other(self, step) -> None:
        pass

    def finish(self) -> None:
        pass


PLAIN = PlainCheck()


class Vouched(PlainCheck):
    """A template's run whose bound inputs and numbers are those of a run its plan vouched for call by
    call: every call's layouts are what the plan recorded, so each call's answer is the plan's (its
    contract, which may read values, runs again: ``check_planned``) without matching its pattern."""

    __slots__ = ("plans", "key", "plan")

    def __init__(self, plans: OrderedDict, key: tuple, plan: Plan) -> None:
        self.plans, self.key, self.plan = plans, key, plan

    def check_call(self, index: int, step: CallStep, call, args: list, kwargs: dict) -> meta_check.Needs:
        known = self.plan.calls[index][1]
        return meta_check.check_planned(call.entry, args, kwargs, known=known)

    def finish(self) -> None:
        self.plans.move_to_end(self.key)


def for_program(session, steps: list, state: tuple | None = None):
    """How a program's calls are checked: ``PLAIN`` for a program seen once (its key is remembered in
    the session's ``Caches.seen``) or too short to plan, else a ``PlanRun`` against its plan.
    ``state``: its torch settings when they are not torch's defaults (``runner.TURNS``): what the memo
    answered under one does not hold under another."""
    key = _key(steps, state)
    if key is None:
        return PLAIN
    caches = session.caches or speed_caches.of(session)
    plan, seen = caches.plans.get(key), caches.seen
    if plan is None and key not in seen:  # a first sighting records nothing
        seen[key] = None
        while len(seen) > SEEN_PER_SESSION:
            seen.popitem(last=False)
        return PLAIN
    return PlanRun(caches.plans, key)


def for_template(plans: OrderedDict, steps: list, state: tuple | None, inputs: tuple):
    """How a template run's calls are checked: a ``Vouched`` run when its ``inputs`` (``inputs_key``) are
    those of a run its plan vouched for call by call, else a ``PlanRun`` (recording from its first run: a
    template exists to repeat); ``PLAIN`` for a template too short to plan."""
    key = _key(steps, state)
    if key is None:
        return PLAIN
    plan = plans.get(key)
    if plan is not None and plan.inputs == inputs:
        return Vouched(plans, key, plan)
    return PlanRun(plans, key, inputs)


def _key(steps: list, state: tuple | None) -> tuple | None:
    """A program's key (its steps' kinds, a call by its op name, and its torch settings), or None when it
    has too few calls to plan."""
    key = tuple(s.op if type(s) is CallStep else type(s) for s in steps)
    if sum(isinstance(k, str) for k in key) < PLAN_MIN_CALLS:
        return None
    return key if state is None else (state, key)


def inputs_key(bound: list, scalars: dict, loose: frozenset) -> tuple:
    """A template run's bound tensors (each value's and grad's layout, which ones share a storage)
    and its numbers (by type, and by value unless ``loose``: ``loose_scalars``): equal keys, equal
    patterns at every step of a template."""
    slots: dict[int, int] = {}
    parts = []
    for ct in bound:
        grad = ct.grad
        parts.append((layout(ct.value, slots), None if grad is None else layout(grad, slots)))
    return tuple(parts), tuple([(name, type(v), None if name in loose else v) for name, v in scalars.items()])


def loose_scalars(steps: list) -> frozenset:
    """The names of a template's numbers that every call reading them takes by type only (a float of
    an arithmetic op whose entry says ``floats_keep_layout``: a learning rate), as a pattern does (``PlanRun._part``)."""
    loose: set[str] = set()
    strict: set[str] = set()
    for step in steps:
        if type(step) is not CallStep:
            continue  # a backward's or grad's numbers are not part of a pattern
        found = _ops.OP_TABLE.resolve(step.op)
        into = loose if found is not None and found.entry.floats_keep_layout else strict
        _scalar_names([*step.args, *step.kwargs.values()], into)
    return frozenset(loose - strict)


def _scalar_names(values: list, into: set) -> None:
    for value in values:
        if type(value) is dict and "scalar" in value:
            into.add(value["scalar"])
        elif type(value) is list:
            _scalar_names(value, into)


class PlanRun:
    """One program's run against the session's plan for it (``for_program``), recording the next plan."""

    __slots__ = ("plans", "key", "plan", "record", "origins", "known", "grads", "slots", "_made", "_all_known",
                 "_float_type", "inputs", "whole")

    def __init__(self, plans: OrderedDict, key: tuple, inputs: tuple | None = None) -> None:
        self.plans, self.key, self.inputs = plans, key, inputs
        self.plan: Plan | None = plans.get(key)
        if self.plan is not None:
            plans.move_to_end(key)
        self.whole = self.plan is not None  # every call so far planned (``Plan.inputs``)
        self.record = Plan()
        # a tensor's value by its id, its grad by ("g", id) (a str is never equal to a tuple)
        self.origins: dict[str | tuple, tuple] = {}  # -> origin
        self.known: set[str | tuple] = set()  # those whose layout the plan vouches for
        self.grads: set[tuple] = set()  # the ("g", id) in origins
        self.slots: dict[int, int] = {}  # a session tensor's storage -> its number (which ones share)
        self._made = self._all_known = self._float_type = False

    # -- calls -----------------------------------------------------------------------------

    def check_call(self, index: int, step: CallStep, call, args: list, kwargs: dict) -> meta_check.Needs:
        """``meta_check.check_call`` of call ``index`` (its wire ``step``, its resolved arguments): what
        it needs, its cost too (a function of its layouts and scalars, as its bytes are)."""
        self._all_known = True
        self._float_type = call.entry.floats_keep_layout
        planned = self.plan.calls.get(index) if self.plan is not None else None
        self._made = planned is not None and planned[1] is not None and self._matches(step, args, kwargs, planned[0])
        if self._made:
            self.record.calls[index] = planned
            return meta_check.check_planned(call.entry, args, kwargs, known=planned[1])
        self.whole = False
        pattern = (step.op, step.grad_enabled, step.autocast, step.out_many, len(step.out),
                   self._parts(step.args, args),
                   self._parts_kw(step.kwargs, kwargs) if step.kwargs else None)
        needs, answer = meta_check.checked(call, args, kwargs, step.grad_enabled)
        # an answer keyed by a 0-d tensor's value is not plannable: it holds for that value only
        usable = meta_check.plannable(answer) and not call.entry.data_dependent
        self.record.calls[index] = (pattern, answer if usable else None)
        return needs

    def ran(self, index: int, step: CallStep, call, ids) -> None:
        """Call ``index`` ran, planned or not, and stored its outputs under ``ids`` (none in place).
        An in-place op of torch's keeps its target's layout, except those that exist to change it
        (and, with them, a shared storage's size); a call writes no other argument's layout, except
        into its ``out=`` tensors, which torch resizes to fit. After one of those, or a call of an op
        of our own, every tensor's layout is taken afresh at its next use."""
        relayout = _relayouts.get(step.op)
        if relayout is None:  # a fact of the name (what it resolves to): once per name
            relayout = _relayouts[step.op] = ((call.inplace and call.entry.relayout)
                                              or not call.entry.variants)
        if relayout or (step.kwargs and "out" in step.kwargs):
            self._forget_all()
        for k, tid in enumerate(ids):
            self.origins[tid] = ("p", index, k)
            if self._made:
                self.known.add(tid)
            else:
                self.known.discard(tid)

    # -- other steps -----------------------------------------------------------------------

    def other(self, step) -> None:
        """A step that is not a call ran: the tensors it made or changed are the session's again.
        (A free needs nothing: an id it freed is used again only once a put or a call makes it anew.)"""
        kind = type(step)
        if kind in _KEEPS_TENSORS:
            return
        if kind is PutStep:
            self._forget(step.id)
            self._forget(("g", step.id))
        elif kind in _CHANGES_GRADS:
            for ref in self.grads:
                self._forget(ref)
            self.grads.clear()
        else:  # grads as outputs, loads into tensors: rare in a loop, and forgetting all is safe
            self._forget_all()

    def finish(self) -> None:
        """Keep this run's record as the session's plan for the program (it ran to its end)."""
        if self.whole and self.inputs is not None:
            self.record.inputs = self.inputs
        self.plans[self.key] = self.record
        self.plans.move_to_end(self.key)
        while len(self.plans) > PLANS_PER_SESSION:
            self.plans.popitem(last=False)

    # -- patterns --------------------------------------------------------------------------

    def _matches(self, step: CallStep, args: list, kwargs: dict, pattern: tuple) -> bool:
        """Whether ``step`` has ``pattern`` with every tensor known: ``_parts`` compared as they are
        walked, without building them (a replayed call's usual case)."""
        op, grad_enabled, autocast, out_many, outs, parts, parts_kw = pattern
        if (op != step.op or grad_enabled != step.grad_enabled or autocast != step.autocast
                or out_many != step.out_many or outs != len(step.out) or len(parts) != len(step.args)):
            return False
        for w, v, r in zip(step.args, args, parts):
            if not self._same(w, v, r):
                return False
        if not step.kwargs:
            return parts_kw is None
        if parts_kw is None or len(parts_kw) != len(step.kwargs):
            return False
        for (k, w), (name, r) in zip(step.kwargs.items(), parts_kw):
            if k != name or not self._same(w, kwargs[k], r):
                return False
        return True

    def _same(self, wire: Any, value: Any, part: Any) -> bool:
        """Whether ``_part(wire, value)`` is ``part`` and names only known tensors."""
        kind = type(wire)
        if kind is int or kind is str or wire is None:
            return type(part) is kind and part == wire
        if kind is dict:
            ref = wire.get("ref")
            if ref is None:  # a grad, a dtype, a slice
                return self._part(wire, value) == part and self._all_known
            # ``_part`` of a tensor reference, inlined: a foreach step names a whole group's tensors
            origin = self.origins.get(ref)
            if origin is None:
                origin = self._first_use(ref, value)
            if ref not in self.known:
                self._all_known = False
            return origin == part and self._all_known
        if kind is list:
            if not (type(part) is tuple and len(part) == 2 and part[0] == "l" and len(part[1]) == len(wire)):
                return False
            same = self._same
            for w, v, r in zip(wire, value, part[1]):
                if not same(w, v, r):
                    return False
            return True
        return self._part(wire, value) == part

    def _parts(self, wire: list, values: list) -> tuple:
        return tuple([self._part(w, v) for w, v in zip(wire, values)])

    def _parts_kw(self, wire: dict, values: dict) -> tuple:
        return tuple([(k, self._part(w, values[k])) for k, w in wire.items()])

    def _part(self, wire: Any, value: Any) -> Any:
        kind = type(wire)
        if kind is dict:
            ref = wire.get("ref")
            if ref is None:
                if "scalar" in wire:  # a template's number (``templates``): by its value this run, as a literal
                    return self._part(value, value)
                if "grad_of" not in wire:  # a dtype, a slice, an ellipsis
                    (tag, payload), = wire.items()
                    return tag, tuple(payload) if type(payload) is list else payload
                ref = ("g", wire["grad_of"])
            origin = self.origins.get(ref)
            if origin is None:
                origin = self._first_use(ref, value)
            if ref not in self.known:
                self._all_known = False
            return origin
        if kind is int or kind is str or wire is None:  # as they are: the usual case
            return wire
        if kind is list:
            return "l", tuple([self._part(w, v) for w, v in zip(wire, value)])
        if kind is float and self._float_type:
            return float
        return kind, wire  # a float or a bool: 1, 1.0 and True are equal, but not as arguments

    def _first_use(self, ref: str | tuple, tensor: torch.Tensor) -> tuple:
        """A tensor this program did not make: the session's, its layout taken now."""
        number = len(self.record.layouts)
        origin = self.origins[ref] = ("s", number)
        if type(ref) is tuple:
            self.grads.add(ref)
        found = layout(tensor, self.slots)
        self.record.layouts.append(found)
        plan = self.plan
        if plan is not None and number < len(plan.layouts) and plan.layouts[number] == found:
            self.known.add(ref)
        return origin

    def _forget(self, ref: str | tuple) -> None:
        self.origins.pop(ref, None)
        self.known.discard(ref)

    def _forget_all(self) -> None:
        self.origins.clear()
        self.known.clear()
        self.grads.clear()

