"""The client's one builder of a step, from ``proto/messages``' step types: ``make_step(CallStep, op=..., args=...)``;
and a queued step's ``Origin`` (the user's line, what it makes, how to undo what was predicted of it).

A step goes on the wire as a dict: ``{"kind": <the type's kind>, **fields}``, its fields in the order
given and only those given (a field left out takes its default on the server). The kind is read from
the message type, never spelled by hand, and a field the type lacks raises ``TypeError`` at the line
that builds the step (not in the server's validation of the whole program, far from it). ``OMIT``
leaves a field out, so that a step whose optional fields depend on the call is still built in one
expression. Values are not validated here: the server validates every program it is sent
(``proto.messages.validate_program``), and a pydantic model per op would cost more than the op's
whole path on the client.
"""

from __future__ import annotations

import typing
from typing import Any, Callable

from remote_autograd.proto import messages



class _Omit:
    """A field left out of the step (the server takes its default)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "OMIT"


OMIT: Any = _Omit()

# the types of Step (a program's) and TemplateBodyStep (a template's, functorch's among them): the unions inside
_STEP_TYPES = {m for union in (messages.Step, messages.TemplateBodyStep)
               for m in typing.get_args(typing.get_args(union)[0])}
# message type -> (its kind, its other fields)
_SHAPES = {m: (typing.get_args(m.model_fields["kind"].annotation)[0], frozenset(m.model_fields) - {"kind"})
           for m in _STEP_TYPES}


def make_step(message: type, /, **fields: Any) -> dict:
    """The step ``message`` with ``fields`` (``OMIT``: a field left out), as the wire carries it."""
    kind, known = _SHAPES[message]
    made = {"kind": kind}
    for name, value in fields.items():  # a loop, not a comprehension: no frame of its own per step
        if value is OMIT:
            continue
        if name not in known:
            raise TypeError(f"{message.__name__} has no field {name!r}")
        made[name] = value
    return made


class Origin:
    """Where a queued step came from, what it makes, and how to undo local predictions."""

    __slots__ = ("op", "where", "outputs", "undo", "on_result")

    def __init__(self, op: str, where: str | None, outputs: list | tuple = (),
                 undo: Callable[[], None] | None = None, on_result: Callable[[Any], None] | None = None) -> None:
        self.op, self.where = op, where
        self.outputs = outputs  # weakrefs to RemoteTensors this step creates
        self.undo = undo
        self.on_result = on_result  # corrects local predictions from the step's result
