"""``answer_early`` (``service/engine/run_ahead.py``, SPEC §3 running ahead): a compiled step's program is
answered once its fetched loss is known, its backward and optimizer run after the answer. Each test runs
the same program in order (without the flag) in a session of its own, and checks the answers and the
tensors left agree: the values of the early answer, the error of a step run after it (on the next
program), a template that may write what the fetch reads (the answer waits), a failing fetch (the middle
runs first, as in order)."""

from __future__ import annotations

import pytest
import torch

from remote_autograd.proto import decode_tensor

from ..wire import Wire, call_step, decode, new_id, put_step, ref

pytestmark = pytest.mark.backends("inprocess", "tenants")

P0 = torch.tensor([1.0, -2.0, 3.0])
X = torch.tensor([0.5, 0.25, -1.0])

# the forward (loss = sum(p * x)) and an optimizer step (p -= 0.1 * grad), as torch.compile sends them
FORWARD = {"kind": "template", "id": "fwd",
           "inputs": [{"id": "p", "dtype": "float32", "shape": [3], "requires_grad": True},
                      {"id": "x", "dtype": "float32", "shape": [3]}],
           "steps": [call_step("mul", ref("p"), ref("x"), out=["px"]), call_step("sum", ref("px"), out=["loss"])],
           "outputs": ["loss"]}
SGD = {"kind": "template", "id": "sgd",
       "inputs": [{"id": "p", "dtype": "float32", "shape": [3], "requires_grad": True},
                  {"id": "g", "dtype": "float32", "shape": [3]}],
       "steps": [call_step("mul", ref("g"), 0.1, out=["d"]),
                 {**call_step("Tensor.sub_", ref("p"), ref("d")), "grad_enabled": False}]}


def _session(wire: Wire) -> str:
    """A session holding parameter ``p`` and both templates."""
    sid = wire.session()
    wire.ok(sid, [put_step("p", wire.tensor(P0), True), FORWARD, SGD])
    return sid


def _step(wire: Wire, fetched: str = "l", middle: list | None = None) -> list:
    """A compiled training step's program: batch, forward, zero_grad, backward, optimizer, the loss read."""
    middle = middle if middle is not None else [
        {"kind": "clear_grads", "ids": ["p"]}, {"kind": "backward", "tensors": ["loss"]},
        {"kind": "run_template", "template": "sgd", "inputs": [ref("p"), {"grad_of": "p"}]}]
    return [put_step("x", wire.tensor(X)),
            {"kind": "run_template", "template": "fwd", "inputs": [ref("p"), ref("x")], "out": ["loss"]},
            *middle,
            call_step("detach", ref("loss"), out=["l"]),
            {"kind": "fetch", "id": fetched, "grad": False},
            {"kind": "free", "ids": ["x", "loss", "l"]}]


def _run(wire: Wire, sid: str, steps: list, early: bool, pid: str | None = None) -> tuple[int, dict]:
    body = {"id": pid or new_id(), "steps": steps, "omit_known_meta": True, **({"answer_early": True} if early else {})}
    r = wire.post_raw(f"/v1/sessions/{sid}/programs", wire.encode(body))
    return r.status_code, decode(r)


def _p(wire: Wire, sid: str) -> tuple[list, list | None]:
    status, body = _run(wire, sid, [{"kind": "fetch", "id": "p"}], early=False)
    assert status == 200, body
    message = body["results"][0]["tensor"]
    grad = message["grad"]
    return _values(message["value"]), None if grad is None else _values(grad)


def _values(data: dict) -> list:
    return decode_tensor(data).tolist()


def _but_id(body: dict) -> dict:
    return {k: v for k, v in body.items() if k != "id"}


def _both(wire: Wire, steps_of) -> tuple[tuple, tuple, str, str]:
    """The program ``steps_of(wire)`` run early in one session, in order in another: (status, body) of each,
    and the two sessions."""
    ahead, in_order = _session(wire), _session(wire)
    return _run(wire, ahead, steps_of(wire), True), _run(wire, in_order, steps_of(wire), False), ahead, in_order


def test_a_compiled_step_is_answered_before_its_backward_and_optimizer_with_the_values_of_its_order(wire: Wire):
    ahead, in_order = _session(wire), _session(wire)
    for _ in range(3):
        (status, early), (status_in_order, plain) = _run(wire, ahead, _step(wire), True), \
            _run(wire, in_order, _step(wire), False)
        assert status == status_in_order == 200
        assert early["pending"] == [2, 3, 4, 7] and "pending" not in plain  # zero_grad, backward, sgd, free
        assert early["results"] == plain["results"]  # the loss, and null for the rest either way
        read = wire.get(f"/v1/sessions/{ahead}/tensors/p")  # a read comes after the pending steps
        assert _values(decode(read)["value"]) == _p(wire, in_order)[0]
        assert _p(wire, ahead) == _p(wire, in_order)  # and so does the next program
    want = P0.clone()
    for _ in range(3):
        want -= 0.1 * X
    assert _p(wire, ahead)[0] == pytest.approx(want.tolist())


def test_a_step_that_fails_after_the_answer_fails_the_next_program(wire: Wire):
    """An unknown id in the middle's zero_grad: 404 on the next program, at its step of the first; then
    the session goes on, as after that program failing in order (nothing from the failed step on ran)."""
    bad = [{"kind": "clear_grads", "ids": ["p", "ghost"]}, {"kind": "backward", "tensors": ["loss"]},
           {"kind": "run_template", "template": "sgd", "inputs": [ref("p"), {"grad_of": "p"}]}]
    (status, early), (status_in_order, plain), ahead, in_order = _both(wire, lambda w: _step(w, middle=bad))
    assert status == 200 and early["pending"] == [2, 3, 4, 7]
    assert status_in_order == 404 and plain["error"]["step"] == 2
    pid = early["id"]
    status, body = _run(wire, ahead, [{"kind": "fetch", "id": "p"}], early=False)
    assert status == 404, body
    assert body["error"] == {**plain["error"], "program": pid} and body["results"] == []
    assert _p(wire, ahead) == _p(wire, in_order)  # told once; p as the failed program in order left it


def test_a_backward_result_the_client_could_not_apply_fails_the_next_program(wire: Wire):
    """A leaf the backward reaches gets no grad (``vector_norm(x, 0)``): in order, the answer's ``no_grad``
    says so; after an early answer it cannot, so the next program fails saying why."""
    def steps_of(w: Wire) -> list:
        return [put_step("q", w.tensor(X), True), call_step("linalg.vector_norm", ref("q"), 0, out=["n"]),
                {"kind": "backward", "tensors": ["n"]}, {"kind": "fetch", "id": "n", "grad": False}]

    (status, early), (_, plain), ahead, _ = _both(wire, steps_of)
    assert status == 200 and early["pending"] == [2], early
    assert plain["results"][2] == {"no_grad": ["q"]}
    status, body = _run(wire, ahead, [], early=False)
    assert status == 422 and body["error"]["program"] == early["id"] and body["error"]["step"] == 2, body
    assert "no_grad" in body["error"]["message"] and "answer_early" in body["error"]["message"]


def test_a_template_that_may_write_what_the_fetch_reads_makes_the_answer_wait(wire: Wire):
    """The fetch reads ``p`` itself, which the optimizer template writes into: the answer comes after it,
    with the value of the program's order."""
    (status, early), (_, plain), ahead, in_order = _both(wire, lambda w: _step(w, fetched="p"))
    assert status == 200 and "pending" not in early
    assert early["results"] == plain["results"]
    assert _values(early["results"][6]["tensor"]["value"]) == pytest.approx((P0 - 0.1 * X).tolist())


def test_a_failing_fetch_fails_after_the_middle_ran_as_in_order(wire: Wire):
    (status, early), (status_in_order, plain), ahead, in_order = _both(wire, lambda w: _step(w, fetched="ghost"))
    assert status == status_in_order == 404
    assert _but_id(early) == _but_id(plain) and early["error"]["step"] == 6
    assert _p(wire, ahead) == _p(wire, in_order)  # the optimizer ran: it comes before the fetch


def test_a_program_whose_middle_may_not_be_passed_runs_in_order(wire: Wire):
    """An eager optimizer (a call writing in place) between the backward and the fetch: no early answer;
    nor without ``omit_known_meta`` (every step of the middle would answer)."""
    eager = [{"kind": "clear_grads", "ids": ["p"]}, {"kind": "backward", "tensors": ["loss"]},
             {**call_step("Tensor.sub_", ref("p"), 0.5), "grad_enabled": False}]
    (status, early), (_, plain), _, _ = _both(wire, lambda w: _step(w, middle=eager))
    assert status == 200 and "pending" not in early and _but_id(early) == _but_id(plain)
    sid = _session(wire)
    r = wire.post_raw(f"/v1/sessions/{sid}/programs", wire.encode({"id": new_id(), "steps": _step(wire),
                                                                   "answer_early": True}))
    assert r.status_code == 200 and "pending" not in decode(r)


def test_a_retried_early_program_gets_its_first_answer_and_runs_once(wire: Wire):
    sid = _session(wire)
    pid = new_id()
    first = _run(wire, sid, _step(wire), True, pid)
    assert first[0] == 200 and first[1]["pending"]
    assert _run(wire, sid, _step(wire), True, pid) == first
    assert _p(wire, sid)[0] == pytest.approx((P0 - 0.1 * X).tolist())


def test_an_empty_program_answers_once_the_pending_steps_ran(wire: Wire):
    sid = _session(wire)
    assert _run(wire, sid, _step(wire), True)[0] == 200
    status, body = _run(wire, sid, [], early=True)
    assert status == 200 and body["results"] == [] and "pending" not in body
    r = wire.get(f"/v1/sessions/{sid}/tensors/p")  # a read, too, comes after them
    assert r.status_code == 200
