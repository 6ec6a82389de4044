"""``signature``: which programs a CUDA graph can replay exactly, and the key that tells two runs of one apart.

A program is keyed by everything but its ids and its put values: every step's kind, op and
arguments, floats by value (a learning rate baked into a kernel is replayed as it was), and
every session tensor it names by address and layout (the graph reads and writes those
addresses). Only what a graph can replay exactly takes part (``graph_steps`` says why each).
"""

from __future__ import annotations

from typing import Any

import torch

from remote_autograd.proto.messages import (BackwardStep, CallStep, ClearGradsStep, FetchStep, FreeStep, PutStep,
                                            SetGradStep)

from .. import ops as _ops
from ..sessions.store import CustomTensor
from .replayable import replayable_call


class Unfit(Exception):
    """The program cannot be replayed as a graph."""


def signature(session, steps: list, head: int, omit_known_meta: bool) -> tuple[tuple, list[CustomTensor]]:
    """(key, the session tensors named, in their order of first use); ``Unfit`` when no graph can
    replay the program (see the module's docstring)."""
    if not omit_known_meta:
        raise Unfit
    walk = _Walk(session)
    parts: list = []
    for index, step in enumerate(steps):
        kind = type(step)
        if index >= head:  # the fetches and frees after the last step that computes
            parts.append(("fetch", walk.ref(step.id), step.value, step.grad) if kind is FetchStep else ("free",))
        elif kind is CallStep:
            parts.append(walk.call(index, step))
        elif kind is PutStep:
            if step.grad is not None:
                raise Unfit
            walk.origins[step.id] = ("u", index)
            parts.append(("put", step.value.dtype, tuple(step.value.shape), step.requires_grad))
        elif kind is SetGradStep:
            if step.grad is not None:
                raise Unfit
            origin = walk.ref(step.id)
            walk.reset.add(origin)
            parts.append(("set_grad", origin))
        elif kind is ClearGradsStep:
            origins = tuple(walk.ref(tid) for tid in step.ids)
            walk.reset.update(origins)
            parts.append(("clear_grads", origins))
        elif kind is BackwardStep:
            parts.append(walk.backward(step))
        elif kind is FreeStep:
            parts.append(("free",))
        else:  # a fetch before the last computing step, grad, retain_grad, requires_grad_, load
            raise Unfit
    return (tuple(parts), tuple(walk.layouts)), walk.inputs


class _Walk:
    """The origins of a program's tensors as ``signature`` walks it: ``("s", n)`` the session's n-th
    (its address and layout in ``layouts``), ``("u", step)`` a put's, ``("p", step, k)`` a call's."""

    def __init__(self, session) -> None:
        self.session = session
        self.origins: dict[str, tuple] = {}
        self.inputs: list[CustomTensor] = []
        self.layouts: list[tuple] = []
        self.reset: set[tuple] = set()  # origins whose grad the program set to None
        self.grads_named: set[tuple] = set()  # inputs whose grad's address is in ``layouts``

    def ref(self, tid: str) -> tuple:
        origin = self.origins.get(tid)
        if origin is None:
            ct = self.session.tensors.get(tid)
            if ct is None:
                raise Unfit  # the plain path answers the unknown id
            value = ct.value
            if value.requires_grad and not value.is_leaf:
                raise Unfit
            origin = self.origins[tid] = ("s", len(self.inputs))
            self.inputs.append(ct)
            self.layouts.append(_layout(value) + (value.requires_grad,))
        return origin

    def grad_ref(self, tid: str) -> tuple:
        origin = self.ref(tid)
        self._name_grad(origin)
        return ("g", origin)

    def _name_grad(self, origin: tuple) -> None:
        """A session tensor's grad the program reads or adds to as it was: its address is keyed too."""
        if origin[0] == "s" and origin not in self.reset and origin not in self.grads_named:
            self.grads_named.add(origin)
            grad = self.inputs[origin[1]].grad
            self.layouts.append(("g", origin[1], None if grad is None else _layout(grad)))

    def call(self, index: int, step: CallStep) -> tuple:
        found = _ops.OP_TABLE.resolve(step.op)
        if found is None:
            raise Unfit
        # a graph replays no contract of ours: the kernels it checks read values on the host
        if found.entry.check is not None or not replayable_call(found, step, step.args, step.kwargs or {}):
            raise Unfit
        part = ("call", step.op, step.grad_enabled, self._value(step.args),
                self._value(step.kwargs) if step.kwargs else None, len(step.out))
        for k, tid in enumerate(step.out):
            self.origins[tid] = ("p", index, k)
        return part

    def backward(self, step: BackwardStep) -> tuple:
        if (step.grad_tensors is not None or step.inputs is not None or step.retain_graph or step.create_graph
                or step.hooks):
            raise Unfit
        roots = tuple(self.ref(t) for t in step.tensors)
        if any(r[0] == "s" for r in roots):
            raise Unfit
        for n, ct in enumerate(self.inputs):  # grads added to as they are: their addresses count
            if ct.value.requires_grad:
                self._name_grad(("s", n))
        return ("backward", roots)

    def _value(self, wire: Any) -> Any:
        kind = type(wire)
        if kind is dict:
            ref = wire.get("ref")
            if ref is not None:
                return self.ref(ref)
            if "grad_of" in wire:
                return self.grad_ref(wire["grad_of"])
            return tuple((k, self._value(v)) for k, v in wire.items())  # a dtype, a slice
        if kind is list:
            return "l", tuple(self._value(w) for w in wire)
        return kind, wire  # floats by value: 0.1 and 0.2 are two kernels


def _layout(t: torch.Tensor) -> tuple:
    return t.data_ptr(), t.shape, t.stride(), t.storage_offset(), t.dtype, t.device
