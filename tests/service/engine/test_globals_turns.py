"""``GlobalsTurns``: programs run under their client's torch settings, and never change another's.

Threads stand in for the server's worker threads; each ``enter`` is a program's first step, each
``leave`` its end. What a program sees is torch's own state read inside its turn.
"""

from __future__ import annotations

import threading

import pytest
import torch

from remote_autograd.proto import ProtocolError, torch_globals
from remote_autograd.service.engine import meta_check
from remote_autograd.service.engine.runner import GlobalsTurns
from remote_autograd.service.ops import OP_TABLE

DEFAULT = torch_globals.DEFAULT
FLOAT64 = (torch.float64, *DEFAULT[1:])
DETERMINISTIC = (torch.float32, True, *DEFAULT[2:])


class _Program(threading.Thread):
    """A program that enters its turn, says what torch held, and leaves when told."""

    def __init__(self, turns: GlobalsTurns, state: tuple) -> None:
        super().__init__(daemon=True)
        self.turns, self.state = turns, state
        self.inside, self.done = threading.Event(), threading.Event()
        self.seen: tuple | None = None

    def run(self) -> None:
        self.turns.enter(self.state)
        self.seen = torch_globals.read()
        self.inside.set()
        self.done.wait(10)
        self.turns.leave()


def test_programs_of_one_state_share_a_turn_and_another_waits_its_own():
    turns = GlobalsTurns()
    first, second = _Program(turns, DEFAULT), _Program(turns, DEFAULT)
    other = _Program(turns, FLOAT64)
    late = _Program(turns, DEFAULT)  # comes after one waits for another state: it waits too (none waits for ever)
    for p in (first, second):
        p.start()
        assert p.inside.wait(5)
    other.start()
    assert not other.inside.wait(0.2)
    late.start()
    assert not late.inside.wait(0.2)
    first.done.set(), second.done.set()
    assert other.inside.wait(5) and other.seen == FLOAT64
    assert not late.inside.wait(0.2)  # the float64 turn is running
    other.done.set()
    assert late.inside.wait(5) and late.seen == DEFAULT
    late.done.set()
    for p in (first, second, other, late):
        p.join(5)
    assert torch_globals.read() == DEFAULT  # the process holds its own state again


def test_the_process_gets_its_own_state_back_after_a_switched_turn():
    """Inside a client's own process (``InProcessTransport``) the user's settings are the process's own."""
    turns = GlobalsTurns()
    torch_globals.apply(DETERMINISTIC)
    try:
        program = _Program(turns, FLOAT64)
        program.start()
        assert program.inside.wait(5) and program.seen == FLOAT64
        program.done.set()
        program.join(5)
        assert torch_globals.read() == DETERMINISTIC
    finally:
        torch_globals.apply(DEFAULT)


def test_a_state_torch_refuses_is_a_422_and_changes_nothing():
    """The wire admits no such state; a server's torch that refuses one still answers, and holds nothing."""
    turns = GlobalsTurns()
    refused = (torch.int64, *DEFAULT[1:])  # torch: "only floating-point types are supported as the default type"
    with pytest.raises(ProtocolError, match="torch_globals: the server's torch refused them") as raised:
        turns.enter(refused)
    assert raised.value.status == 422 and torch_globals.read() == DEFAULT
    turns.enter(DEFAULT)  # nothing left held
    turns.leave()


def test_the_meta_checks_memo_answers_under_each_state():
    """An integer ``sqrt``'s outputs are 4 or 8 bytes an element: a memo shared by the states would
    charge a float64 program what its float32 twin allocated (then find out after the kernel)."""
    turns, entry, ints = GlobalsTurns(), OP_TABLE.resolve("sqrt").entry, torch.arange(1000)
    for state, nbytes in ((DEFAULT, 4000), (FLOAT64, 8000), (DEFAULT, 4000), (FLOAT64, 8000)):
        turns.enter(state)
        try:
            assert meta_check.check_call(entry, [ints], {}, inplace=False, grad_enabled=True).bytes == nbytes
        finally:
            turns.leave()
