"""A repeated program's plan (``service/engine/program_plan.py``) changes no answer, error or state.

The training tests' loops are run through the SDK once and the bodies of every program it sent
are kept; then each body is run, in order, against two fresh stores, one with
``REMOTE_AUTOGRAD_REPLAY=off``: every answer must be the same bytes and every tensor, grad and
byte count the same at the end. The other tests build programs by hand: a change of shape,
dtype, op or ids pattern falls back to the plain check, and a program that fails midway answers
the same error and leaves the same partial state both ways.
"""

from __future__ import annotations

import pytest
import torch

from bench import _hot
from remote_autograd import client
from remote_autograd.proto import encode_body, encode_tensor
from remote_autograd.service.engine import meta_check
from remote_autograd.service.engine.guards import decode_program
from remote_autograd.service.settings import Settings
from remote_autograd.service.engine.runner import run_program
from remote_autograd.service.sessions.store import SessionStore
from remote_autograd.proto.messages import validate_program

from ...e2e.test_training import OPTIMIZERS, _data, _mlp, _train
from ...models.gpt import GPT, GPTConfig, cosine_with_warmup, get_batch, train_step
from ...servers import call, put, ref
from .template_cases import variants_of_its_own


class Counted:
    """How many calls ``check_planned`` vouched for (``monkeypatch``ed around the real one)."""

    def __init__(self, monkeypatch) -> None:
        self.planned = 0
        real = meta_check.check_planned

        def counting(*args, **kwargs):
            self.planned += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(meta_check, "check_planned", counting)


def _record(loop) -> list[tuple[bytes, str | None]]:
    """The bodies of every program the SDK sends while ``loop(sess)`` runs."""
    tap = _hot.Tap(client.InProcessTransport())
    with client.connect(transport=tap) as sess:
        tap.recorded = []
        loop(sess)
        return [(bytes(body), ctype) for body, ctype in tap.recorded]


def _state(session) -> dict:
    out = {"bytes": session.bytes_held}
    for tid, ct in session.tensors.items():
        out[tid] = (ct.value.detach().cpu().clone(), None if ct.grad is None else ct.grad.detach().cpu().clone())
    return out


def _run_both(bodies: list) -> tuple[list, list]:
    """Each body (wire bytes and content type, or a program dict) run in order on a store with the
    plan and on one without: (answers, final state) of each."""
    answers, states = [], []
    for replay in ("on", "off"):
        got, session = run_bodies(bodies, Settings.from_env({}, replay=replay))
        answers.append(got)
        states.append(_state(session))
    return answers, states


def run_bodies(bodies: list, settings: Settings) -> tuple[list, object]:
    """Each body run in order on a fresh store's session, whose templates find no variant another store's
    runs made (as in a server of its own): ([(status, answer bytes)], the session)."""
    store = SessionStore(settings)
    session = store.create()
    session.generator.manual_seed(0)
    answers = []
    with variants_of_its_own():
        for body in bodies:
            if isinstance(body, dict):
                program, key = validate_program(body), encode_body(body, True)
            else:
                program, key = decode_program(body[0], body[1], settings)
            outcome = run_program(session, program, key, False, store.settings)
            answers.append((outcome.status, encode_body(outcome.body, True)))
    return answers, session


def _assert_same(answers: list, states: list) -> None:
    on, off = answers
    for i, (a, b) in enumerate(zip(on, off)):
        assert a == b, f"program {i} answered differently with the plan"
    s_on, s_off = states
    assert s_on.keys() == s_off.keys() and s_on["bytes"] == s_off["bytes"]
    for tid in s_on:
        if tid == "bytes":
            continue
        (v1, g1), (v2, g2) = s_on[tid], s_off[tid]
        assert v1.dtype == v2.dtype and torch.equal(v1, v2), tid
        assert (g1 is None) == (g2 is None) and (g1 is None or torch.equal(g1, g2)), tid


# -- the training tests' programs, both ways ------------------------------------------------------


def _mlp_loop(name: str, clip=None, sched=None):
    def loop(sess):
        X, Y = _data()
        remote = sess.module(_mlp())
        opt = OPTIMIZERS[name](remote.parameters())
        _train(remote, opt, sess.tensor(X), sess.tensor(Y), steps=6, clip=clip,
               sched=sched(opt) if sched else None)
    return loop


def _gpt_loop(sess):
    torch.manual_seed(0)
    model = sess.module(GPT(GPTConfig(vocab_size=32, block_size=16, n_layer=1, n_head=2, n_embd=16, dropout=0.1)))
    optimizer = model.configure_optimizers(weight_decay=0.1, lr=3e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, cosine_with_warmup(warmup=2, total=20))
    data = torch.randint(0, 32, (512,), generator=torch.Generator().manual_seed(1))
    batches = torch.Generator().manual_seed(0)
    for _ in range(5):
        train_step(model, optimizer, scheduler, *get_batch(data, 16, 4, batches, sess.device))


LOOPS = {**{f"mlp-{name}-clip": _mlp_loop(name, clip=1.0) for name in OPTIMIZERS},
         "mlp-sgd-step-lr": _mlp_loop("sgd-momentum-nesterov-wd",
                                      sched=lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5)),
         "gpt-adamw-cosine-dropout": _gpt_loop}


@pytest.mark.parametrize("name", list(LOOPS))
def test_training_programs_answer_the_same_bytes_with_and_without_the_plan(name, monkeypatch):
    bodies = _record(LOOPS[name])
    counted = Counted(monkeypatch)
    answers, states = _run_both(bodies)
    _assert_same(answers, states)
    assert all(status == 200 for status, _ in answers[0])
    assert counted.planned > 0, "the plan never served a call: the test compares the plain path with itself"


# -- falling back -----------------------------------------------------------------------------------


def _put(tid: str, t: torch.Tensor, **kw) -> dict:
    return {"kind": "put", "id": tid, "value": encode_tensor(t), **kw}


def _call(op: str, args: list, out: list, **kw) -> dict:
    return {"kind": "call", "op": op, "args": args, "out": out, **kw}


def _step_program(n: int, *, op: str = "Tensor.mul", swap: bool = False, scale: float = 2.0, add: int = 1) -> dict:
    """One "training step" on the session's ``w`` and ``b``: new ids each time, as the SDK's."""
    a, c = f"a{n}", f"c{n}"
    first, second = ({"ref": "b"}, {"ref": a}) if swap else ({"ref": a}, {"ref": "b"})
    return {"id": f"p{n}", "steps": [
        _call("Tensor.add", [{"ref": "w"}, add], [a]),
        _call(op, [first, second], [c]),
        _call("Tensor.mul_", [{"ref": c}, scale], []),
        _call("sum", [{"ref": c}], [f"s{n}"]),
        {"kind": "fetch", "id": f"s{n}"},
        {"kind": "free", "ids": [a, c, f"s{n}"]},
    ]}


def _setup(w: torch.Tensor, b: torch.Tensor) -> dict:
    return {"id": "setup", "steps": [_put("w", w), _put("b", b)]}


def test_a_repeated_step_is_served_by_its_plan(monkeypatch):
    w, b = torch.randn(4), torch.randn(4)
    counted = Counted(monkeypatch)
    answers, states = _run_both([_setup(w, b), _step_program(1), _step_program(2), _step_program(3),
                                 _step_program(4)])
    _assert_same(answers, states)
    # step 1 is a first sighting (no plan recorded), step 2 records, steps 3 and 4 are served: all
    # four calls each (with the plan on only)
    assert counted.planned == 2 * 4


def test_a_program_seen_once_records_no_plan():
    """Only a repeat is planned: the first sighting of a program runs plainly and records nothing."""
    store = SessionStore(Settings.from_env({}))
    session = store.create()
    run_program(session, validate_program(_setup(torch.randn(4), torch.randn(4))), b"s", False, store.settings)
    for n, recorded in ((1, 0), (2, 1), (3, 1)):
        body = _step_program(n)
        run_program(session, validate_program(body), encode_body(body, True), False, store.settings)
        assert len(session.caches.plans) == recorded


@pytest.mark.parametrize("change", ["shape", "dtype", "op", "ids-pattern", "scalar"])
def test_a_changed_program_falls_back_to_the_plain_check(change, monkeypatch):
    w, b = torch.randn(4), torch.randn(4)
    programs = [_setup(w, b), _step_program(0), _step_program(1), _step_program(2)]
    if change == "shape":  # the session's tensors change layout between two steps
        programs.append({"id": "re", "steps": [{"kind": "free", "ids": ["w", "b"]},
                                               _put("w", torch.randn(5)), _put("b", torch.randn(5))]})
        programs.append(_step_program(3))
    elif change == "dtype":
        programs.append({"id": "re", "steps": [{"kind": "free", "ids": ["w", "b"]},
                                               _put("w", torch.randn(4, dtype=torch.float64)), _put("b", b.double())]})
        programs.append(_step_program(3))
    elif change == "op":
        programs.append(_step_program(3, op="Tensor.sub"))
    elif change == "ids-pattern":
        programs.append(_step_program(3, swap=True))
    else:  # an int is part of the pattern by value (a float of an op's arithmetic only by type)
        programs.append(_step_program(3, add=2, scale=3.5))
    counted = Counted(monkeypatch)
    answers, states = _run_both(programs)
    _assert_same(answers, states)
    served = counted.planned
    # step 2 is served whole (4 calls); the changed step 3 only in the calls before the change (a
    # changed op is another program: no plan at all)
    assert served == 4 + {"shape": 0, "dtype": 0, "op": 0, "ids-pattern": 1, "scalar": 0}[change]


def test_an_error_midway_answers_the_same_and_leaves_the_same_state(monkeypatch):
    weight = torch.randn(8, 3)

    def step(n: int, index: list) -> dict:
        return {"id": f"e{n}", "steps": [
            _put(f"i{n}", torch.tensor(index)),
            _call("Tensor.mul", [{"ref": "w"}, 2.0], [f"m{n}"]),
            _call("nn.functional.embedding", [{"ref": f"i{n}"}, {"ref": f"m{n}"}], [f"e{n}"]),  # reads the values
            _call("Tensor.add_", [{"ref": "w"}, 1.0], []),
            {"kind": "fetch", "id": f"e{n}"},
        ]}

    programs = [{"id": "setup", "steps": [_put("w", weight)]}, step(0, [1, 0]), step(1, [0, 1]), step(2, [2, 3]),
                step(3, [4, 99]), step(4, [5, 6])]
    counted = Counted(monkeypatch)
    answers, states = _run_both(programs)
    _assert_same(answers, states)
    assert answers[0][4][0] == 422 and b"index out of range" in answers[0][4][1]
    assert counted.planned == 3 + 2 + 3  # step 3: its two calls up to the failing kernel


def test_a_session_limit_is_met_the_same_way(monkeypatch):
    w = torch.randn(256)
    programs = [{"id": "setup", "steps": [_put("w", w)]}]
    for n in range(4):
        programs.append({"id": f"g{n}", "steps": [_call("Tensor.mul", [{"ref": "w"}, 2.0], [f"k{n}"])]})  # kept
    limit = w.nbytes * 3  # the third kept output passes it
    answers, states = [], []
    for replay in ("on", "off"):
        settings = Settings.from_env({}, replay=replay, max_session_bytes=limit)
        store = SessionStore(settings)
        session = store.create()
        got = [run_program(session, validate_program(p), encode_body(p, True), False, store.settings) for p in programs]
        answers.append([(o.status, encode_body(o.body, True)) for o in got])
        states.append(_state(session))
    _assert_same(answers, states)
    assert [status for status, _ in answers[0]] == [200, 200, 200, 413, 413]


def test_the_plans_a_session_keeps_are_bounded():
    from remote_autograd.service.engine.program_plan import PLANS_PER_SESSION

    store = SessionStore(Settings.from_env({}))
    session = store.create()
    setup = _setup(torch.randn(4), torch.randn(4))
    run_program(session, validate_program(setup), b"s", False, store.settings)
    for n in range(PLANS_PER_SESSION + 3):
        for seen in range(2):  # a plan is recorded at a program's second sighting
            body = {"id": f"q{n}.{seen}", "steps": [_call("Tensor.add", [{"ref": "w"}, n], [f"x{n}.{seen}"])] +
                    [_call("Tensor.mul", [{"ref": "b"}, 1], [f"y{n}.{seen}.{k}"]) for k in range(n)]}
            run_program(session, validate_program(body), encode_body(body, True), False, store.settings)
    assert len(session.caches.plans) == PLANS_PER_SESSION


def test_replay_off_keeps_no_plans():
    store = SessionStore(Settings.from_env({"REMOTE_AUTOGRAD_REPLAY": "off"}))
    session = store.create()
    for n in range(3):
        body = {"id": f"r{n}", "steps": [_call("ones", [3], [f"o{n}"])]}
        run_program(session, validate_program(body), encode_body(body, True), False, store.settings)
    assert session.caches is None


def test_an_in_place_op_that_changes_a_layout_is_followed(monkeypatch):
    def step(n: int) -> dict:
        a = f"a{n}"
        return {"id": f"t{n}", "steps": [
            _call("Tensor.add", [{"ref": "w"}, 1], [a]),
            _call("Tensor.t_", [{"ref": a}], []),  # a is 3x2 from here on
            _call("Tensor.matmul", [{"ref": a}, {"ref": "w"}], [f"m{n}"]),
            _call("sum", [{"ref": f"m{n}"}], [f"s{n}"]),
            {"kind": "fetch", "id": f"s{n}"},
            {"kind": "free", "ids": [a, f"m{n}", f"s{n}"]},
        ]}

    counted = Counted(monkeypatch)
    answers, states = _run_both([{"id": "setup", "steps": [_put("w", torch.randn(2, 3))]}, step(0), step(1), step(2),
                                 step(3)])
    _assert_same(answers, states)
    assert all(status == 200 for status, _ in answers[0])
    assert counted.planned == 2 * 4  # after t_, a's new layout is taken again and matches the plan's


def test_a_misspelt_replay_setting_stops_the_server_at_its_start():
    from remote_autograd.service.http.app import make_backend

    with pytest.raises(ValueError, match="REMOTE_AUTOGRAD_REPLAY='of': use on or off"):
        make_backend(Settings.from_env({"REMOTE_AUTOGRAD_REPLAY": "of"}))


def test_a_call_that_resizes_its_out_tensor_is_followed(monkeypatch):
    def step(n: int, size: int) -> dict:  # torch resizes the out= tensor to the result's shape
        return {"id": f"o{n}", "steps": [
            _put(f"c{n}", torch.zeros(0)),
            _call("add", [{"ref": "w"}, size], [f"d{n}"], kwargs={"out": {"ref": f"c{n}"}}),
            _call("Tensor.mul", [{"ref": f"c{n}"}, 2.0], [f"m{n}"]),
            _call("Tensor.expand", [{"ref": f"m{n}"}, [2, 4]], [f"x{n}"]),
            {"kind": "fetch", "id": f"x{n}"},
            {"kind": "free", "ids": [f"c{n}", f"d{n}", f"m{n}", f"x{n}"]},
        ]}

    counted = Counted(monkeypatch)
    answers, states = _run_both([{"id": "setup", "steps": [_put("w", torch.randn(4))]},
                                 step(0, 0), step(1, 1), step(2, 2), step(3, 3)])
    _assert_same(answers, states)
    assert all(status == 200 for status, _ in answers[0])
    # add's int differs each step (the plain check); after it, c's new layout is taken again and
    # matches the plan's: mul and expand are the plan's in steps 2 and 3
    assert counted.planned == 2 * 2


def test_a_program_repeated_under_other_torch_settings_has_a_plan_of_its_own():
    """The same program, sent under float32 and then under float64 (``torch_globals``): an integer
    ``sqrt`` holds 4 or 8 bytes an element, so what a plan recorded under one does not hold for
    the other (the meta check's memo is per state too: ``test_globals_turns``)."""
    def body(n: int, globals_: dict | None) -> dict:
        steps = [put(f"i{n}", list(range(100)), dtype="int64"), call("sqrt", ref(f"i{n}"), out=[f"s{n}"]),
                 call("sqrt", ref(f"i{n}"), out=[f"r{n}"])]
        return {"id": f"p{n}", "steps": steps, **({"torch_globals": globals_} if globals_ else {})}

    wide = {"default_dtype": "float64"}
    bodies = [body(0, None), body(1, None), body(2, wide), body(3, wide), body(4, None)]
    _assert_same(*_run_both(bodies))
    _, session = run_bodies(bodies, Settings.from_env({}))
    assert len(session.caches.plans) == 2
    assert [session.tensors[f"r{n}"].dtype for n in range(5)] == [torch.float32] * 2 + [torch.float64] * 2 + \
        [torch.float32]


# -- a template's runs -------------------------------------------------------------------------------


def _expand_template() -> dict:
    """z = x.expand(n, 3).clone() * scale: an int that sizes an output, a float of arithmetic, numbers of a run."""
    return {"kind": "template", "id": "R", "inputs": [{"id": "x", "dtype": "float32", "shape": [1, 3]}],
            "scalars": [{"id": "n", "kind": "int"}, {"id": "scale", "kind": "float"}],
            "steps": [_call("expand", [{"ref": "x"}, [{"scalar": "n"}, 3]], ["e"]), _call("clone", [{"ref": "e"}], ["r"]),
                      _call("mul", [{"ref": "r"}, {"scalar": "scale"}], ["z"])],
            "outputs": ["z"]}


def _template_run(k: int, n: int, scale: float) -> dict:
    return {"id": f"t{k}", "steps": [{"kind": "run_template", "template": "R", "inputs": [{"ref": "x"}],
                                      "scalars": [n, scale], "out": [f"z{k}"]}, {"kind": "fetch", "id": f"z{k}"}]}


def test_a_templates_repeated_runs_are_served_by_its_plan_and_a_number_by_its_value(monkeypatch):
    # a template's run has a plan of its own (templates.run_plainly), as a repeated program does; a
    # number bound by a run is part of the pattern by its value (an int that sizes an output: checked again)
    setup = {"id": "setup", "steps": [_put("x", torch.arange(3.0).reshape(1, 3)), _expand_template()]}
    counted = Counted(monkeypatch)
    answers, states = _run_both([setup, _template_run(1, 1, 2.0), _template_run(2, 1, 3.0), _template_run(3, 4, 0.5)])
    _assert_same(answers, states)
    assert all(status == 200 for status, _ in answers[0])
    assert torch.equal(states[0]["z3"][0], torch.arange(3.0).expand(4, 3) * 0.5)
    assert counted.planned == 3  # run 2 whole (the float by type); run 3's changed int: none of its calls


def _written_template() -> dict:
    """x.add_(lr); z = x * 2: a template that writes its input, with a number of arithmetic (by type)."""
    return {"kind": "template", "id": "W", "inputs": [{"id": "x", "dtype": "float32", "shape": [2, 3]}],
            "scalars": [{"id": "lr", "kind": "float"}],
            "steps": [_call("Tensor.add_", [{"ref": "x"}, {"scalar": "lr"}], []),
                      _call("Tensor.mul", [{"ref": "x"}, 2.0], ["z"])],
            "outputs": ["z"]}


def _written_run(k: int, x: str, lr: float) -> dict:
    return {"id": f"w{k}", "steps": [{"kind": "run_template", "template": "W", "inputs": [{"ref": x}],
                                      "scalars": [lr], "out": [f"z{k}"]}, {"kind": "fetch", "id": f"z{k}"}]}


def test_a_template_run_with_a_vouched_runs_inputs_skips_the_pattern_check_and_a_changed_layout_does_not(
        monkeypatch):
    """A template run whose bound layouts and numbers are those of a run its plan vouched for call by
    call skips the per-call pattern check (``program_plan.Vouched``; a learning rate of arithmetic by
    type only); a bound tensor of another layout (the same shape and dtype, its rows one storage:
    an in-place write must refuse it) takes the pattern check and meets the meta check's own error,
    as with the plan off."""
    from remote_autograd.service.engine.program_plan import PlanRun

    matched = []
    real = PlanRun._matches
    monkeypatch.setattr(PlanRun, "_matches", lambda self, *a: matched.append(1) or real(self, *a))
    setup = {"id": "setup", "steps": [_put("x", torch.randn(2, 3)), _put("row", torch.randn(1, 3)),
                                      _call("Tensor.expand", [{"ref": "row"}, [2, 3]], ["wide"]),
                                      _written_template()]}
    runs = [_written_run(1, "x", 0.1), _written_run(2, "x", 0.2)]
    answers, states = _run_both([setup, *runs])
    assert len(matched) == 2  # run 1 recorded its plan; run 2 matched both calls (with the plan on only)
    matched.clear()
    runs += [_written_run(3, "x", 0.3), _written_run(4, "wide", 0.4)]
    answers, states = _run_both([setup, *runs])
    _assert_same(answers, states)
    assert [status for status, _ in answers[0]] == [200, 200, 200, 200, 422]
    assert b"add: unsupported operation: more than one element of the written-to tensor" in answers[0][4][1]
    assert len(matched) == 2 + 1  # run 2 both calls, run 3 none (vouched), run 4 up to its refused call
