"""The ``checkpoint`` and ``checkpoint_end`` steps over raw HTTP (``proto/SPEC.md`` §4), as a non-Python client
would send them: a region spanning two programs, whose saved tensors are dropped (the session holds less) and
recomputed at the backward (torch's gradients), and the steps' refusals."""

from __future__ import annotations

import torch

from remote_autograd.proto import decode_tensor, encode_tensor
from remote_autograd.proto.messages import validate_program
from remote_autograd.service.engine.runner import run_steps
from remote_autograd.service.sessions.store import SessionStore
from remote_autograd.service.settings import Settings

from ..wire import Wire, call_step, decode, expect_error, put_step, ref

_N = 1024


def _forward(wire: Wire, sid: str, checkpointed: bool) -> int:
    """``loss = sin(x * w).sum()``, its region (when ``checkpointed``) closed in a second program, ``h = x * w``
    freed by the client: the bytes the session holds then."""
    x = torch.linspace(-1, 1, _N, dtype=torch.float64)
    w = torch.linspace(0, 2, _N, dtype=torch.float64)
    region = [{"kind": "checkpoint", "region": "r", "inputs": ["x"]}] if checkpointed else []
    wire.ok(sid, [put_step("x", wire.tensor(x), True), put_step("w", wire.tensor(w), True), *region,
                  call_step("mul", ref("x"), ref("w"), out=["h"]), call_step("sin", ref("h"), out=["s"])])
    end = [{"kind": "checkpoint_end", "region": "r"}] if checkpointed else []
    wire.ok(sid, [*end, call_step("sum", ref("s"), out=["loss"]), {"kind": "free", "ids": ["h"]}])
    return decode(wire.get(f"/v1/sessions/{sid}"))["bytes"]


def _grad(wire: Wire, sid: str, tid: str) -> torch.Tensor:
    return decode_tensor(decode(wire.get(f"/v1/sessions/{sid}/tensors/{tid}"))["grad"])


def test_a_region_across_two_programs_holds_less_and_gives_torchs_gradients(wire: Wire):
    held = {}
    for checkpointed in (False, True):
        sid = wire.session()
        held[checkpointed] = _forward(wire, sid, checkpointed)
        wire.ok(sid, [{"kind": "backward", "tensors": ["loss"]}])
        x = torch.linspace(-1, 1, _N, dtype=torch.float64, requires_grad=True)
        w = torch.linspace(0, 2, _N, dtype=torch.float64, requires_grad=True)
        (x * w).sin().sum().backward()
        assert torch.equal(_grad(wire, sid, "x"), x.grad) and torch.equal(_grad(wire, sid, "w"), w.grad)
        wire.c.delete(f"/v1/sessions/{sid}")
    # sin's saved input (h, freed by the client) is dropped; the generator's state at the open is kept
    assert held[False] - held[True] == _N * 8 - torch.Generator().get_state().numel()


def test_the_checkpoint_steps_refusals(wire: Wire, sid: str):
    x = torch.ones(4, dtype=torch.float64)
    wire.ok(sid, [put_step("x", wire.tensor(x), True), {"kind": "checkpoint_end", "region": "never"}])  # ignored
    status, body = wire.program(sid, [{"kind": "checkpoint", "region": "r", "inputs": ["nope"]}])
    assert status == 404 and body["error"]["code"] == "unknown_tensor"
    wire.ok(sid, [{"kind": "checkpoint", "region": "r", "inputs": ["x"]}])
    r = wire.post_raw(f"/v1/sessions/{sid}/programs", wire.encode({"id": "p-twice", "steps": [
        {"kind": "checkpoint", "region": "r"}]}))
    expect_error(r, 409, "conflict", "region 'r' is open already")
    r = wire.post_raw(f"/v1/sessions/{sid}/programs", wire.encode({"id": "p-inside", "steps": [
        call_step("sum", ref("x"), out=["s"]), {"kind": "backward", "tensors": ["s"]}]}))
    expect_error(r, 422, "op_error", "a backward inside the function of torch.utils.checkpoint")
    wire.ok(sid, [{"kind": "checkpoint_end", "region": "r"}, {"kind": "backward", "tensors": ["s"]}])
    assert torch.equal(_grad(wire, sid, "x"), torch.ones(4, dtype=torch.float64))


def test_a_program_leaves_the_threads_saved_tensor_hooks_as_it_found_them():
    """torch's hooks are a stack per thread: a program that opens a region, one inside it, one that closes it and
    one that fails inside it each pop what they pushed (the program's own hooks among them)."""
    settings = Settings()
    session = SessionStore(settings).create()
    x = {"kind": "put", "id": "x", "value": encode_tensor(torch.ones(4)), "requires_grad": True}
    programs = [[x, {"kind": "checkpoint", "region": "r", "inputs": ["x"]}, call_step("sin", ref("x"), out=["s"])],
                [call_step("cos", ref("s"), out=["c"])],
                [call_step("nope_not_an_op", ref("c"), out=["d"])],
                [{"kind": "checkpoint_end", "region": "r"}, call_step("sum", ref("c"), out=["loss"]),
                 {"kind": "backward", "tensors": ["loss"]}]]
    for k, steps in enumerate(programs):
        run_steps(session, validate_program({"id": f"p{k}", "steps": steps}), settings)
        assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None
    assert torch.equal(session.tensors["x"].grad, -torch.sin(torch.sin(torch.ones(4))) * torch.cos(torch.ones(4)))


def test_regions_are_bounded_in_number_and_in_steps():
    """At most 32 open at once; a region holds at most 16 x max_steps_per_program steps (the next one is refused
    before it runs: its output never made)."""
    settings = Settings(max_steps_per_program=2)
    for many in (True, False):
        session = SessionStore(settings).create()
        programs = iter(range(1000))

        def run(*steps):
            return run_steps(session, validate_program({"id": f"p{next(programs)}", "steps": list(steps)}), settings)

        assert run({"kind": "put", "id": "x", "value": encode_tensor(torch.ones(2))}).status == 200
        if many:
            for k in range(32):
                assert run({"kind": "checkpoint", "region": f"r{k}"}).status == 200
            refused = run({"kind": "checkpoint", "region": "r32"})
            assert refused.status == 413 and "at most 32" in refused.body["error"]["message"]
            continue
        assert run({"kind": "checkpoint", "region": "r"}).status == 200
        for k in range(32):
            assert run(call_step("neg", ref("x"), out=[f"n{k}"])).status == 200
        refused = run(call_step("neg", ref("x"), out=["n32"]))
        assert refused.status == 413 and "16 x max_steps_per_program=2" in refused.body["error"]["message"]
        assert "n32" not in session.tensors and "n31" in session.tensors
