"""Fast paths of the server give what the slow paths give, bit for bit.

- ``OpEntry.native`` (an op's own torch kernel when no graph is recorded) against the
  op's Function, and ``native_inplace`` against computing out of place and copying in;
- programs run in process: optimizer-style steps with grad off against the same steps
  recorded in a graph, in-place writes under ``no_grad`` on views and parameters;
- the step-time histogram against prometheus_client's own ``Histogram``;
- fetched small tensors travel as bytes, and still count against the retry cache's limit;
- fetched big tensors as views of their bytes against copies, when later steps write them.
"""

from __future__ import annotations

import re

import pytest
import torch
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from remote_autograd.proto import JSON, MSGPACK, decode_body, decode_tensor, encode_tensor
from remote_autograd.proto.codec import FRAME_MIN_BYTES, FRAMES, unpack_frames
from remote_autograd.proto.messages import validate_program
from remote_autograd.service.engine import autograd_steps
from remote_autograd.service.engine.answers import encode_answer, keepable
from remote_autograd.service.ops import OP_TABLE, OpTable, S, T, op
from remote_autograd.service.engine.runner import run_steps
from remote_autograd.service.settings import Settings
from remote_autograd.service.step_histogram import FOLD_AT, OP_BUCKETS, StepHistogram
from remote_autograd.service.sessions.store import SessionStore

from ...bits import assert_same_bits

def _id(case) -> str:
    entry, i = case
    return f"{entry.name}-{i}"


def _plain(args, kwargs):
    """Sample arguments with every tensor detached: no graph can be recorded."""
    strip = lambda v: v.detach() if isinstance(v, torch.Tensor) else v  # noqa: E731
    return [strip(a) for a in args], {k: strip(v) for k, v in kwargs.items()}


def _fits_in_place(entry, i) -> bool:
    """Whether torch takes this sample in place: a tensor first, and a result of its shape and a dtype it holds."""
    args, kwargs = _plain(*entry.samples[i].materialise(torch.float32, seed=i))
    if not isinstance(args[0], torch.Tensor):
        return False
    value = entry.fn(*args, **kwargs)
    return value.shape == args[0].shape and torch.can_cast(value.dtype, args[0].dtype)


# Only the cases the runner can take: an entry's native in-place kernel only where torch accepts the op in place.
NATIVE_INPLACE = [(e, i) for e in OP_TABLE if e.native_inplace is not None for i in range(len(e.samples))
                  if _fits_in_place(e, i)]


def _sample(case, dtype):
    """The entry of an ``(entry, sample index)`` case, and that sample's plain arguments."""
    entry, i = case
    return (entry, *_plain(*entry.samples[i].materialise(dtype, seed=i)))


@pytest.mark.optable
@pytest.mark.parametrize("case", NATIVE_INPLACE, ids=_id)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_native_inplace_kernel_gives_the_copied_value(case, dtype):
    entry, args, kwargs = _sample(case, dtype)
    target = args[0]
    torch.manual_seed(0)  # random entries (uniform_, normal_) draw the same numbers both ways
    value = entry.fn(target, *args[1:], **kwargs)
    copied, native = target.clone(), target.clone()
    copied.copy_(value)
    torch.manual_seed(0)
    entry.native_inplace(native, *args[1:], **kwargs)
    assert_same_bits(native, copied)


# -- programs in process --------------------------------------------------------------------------

def _session():
    settings = Settings()
    store = SessionStore(settings)
    return store, store.create(), settings


def _run(session, settings, steps, pid):
    outcome = run_steps(session, validate_program({"id": pid, "steps": steps}), settings)
    assert outcome.status == 200, outcome.body
    return outcome


def _put(tid, t, requires_grad=False):
    return {"kind": "put", "id": tid, "value": encode_tensor(t), "requires_grad": requires_grad}


def _adam_like(p, grad_enabled):
    """Adam's update of parameter ``p`` (state m, v; grad g) as the SDK sends it."""
    call = lambda op, args, out=(), **kwargs: {"kind": "call", "op": op, "args": args, "kwargs": kwargs,  # noqa: E731
                                                "out": list(out), "grad_enabled": grad_enabled}
    ref = lambda t: {"ref": t}  # noqa: E731
    return [
        call("lerp_", [ref("m"), ref("g"), 0.1]),
        call("mul_", [ref("v"), 0.999]),
        call("addcmul_", [ref("v"), ref("g"), ref("g")], value=0.001),
        call("sqrt", [ref("v")], out=["s"]),
        call("div", [ref("s"), 0.05], out=["d"]),
        call("add_", [ref("d"), 1e-8]),
        call("addcdiv_", [ref(p), ref("m"), ref("d")], value=-0.004),
        call("mul", [ref("d"), ref("g")], out=["e"]),
        call("sub", [ref("e"), ref("m")], out=["f"], alpha=0.5),
        call("addcmul", [ref("f"), ref("m"), ref("v")], out=["h"], value=2.0),
    ]


def test_optimizer_steps_with_grad_off_match_the_graph_recording_functions():
    gen = torch.Generator().manual_seed(0)
    values = {k: torch.randn(5, 3, generator=gen) for k in ("p", "m", "g")}
    values["v"] = torch.rand(5, 3, generator=gen)
    finals = []
    for grad_enabled in (False, True):
        store, session, settings = _session()
        # with grad on, "p" is a non-leaf that requires grad, so every op records a graph
        _run(session, settings, [_put(k, t, requires_grad=k == "w") for k, t in values.items()]
             + [_put("w", torch.zeros(5, 3), requires_grad=True),
                {"kind": "call", "op": "add", "args": [{"ref": "p"}, {"ref": "w"}], "out": ["q"]}], "setup")
        _run(session, settings, _adam_like("q", grad_enabled), "step")
        finals.append({k: session.tensors[k].value.detach() for k in ("q", "m", "v", "s", "d", "e", "f", "h")})
    for k in finals[0]:
        assert_same_bits(finals[0][k], finals[1][k])


def test_in_place_under_no_grad_on_views_and_parameters():
    store, session, settings = _session()
    _run(session, settings, [_put("w", torch.arange(6.0).reshape(2, 3), requires_grad=True),
                             _put("z", torch.ones(3), requires_grad=True)], "setup")
    no_grad = {"grad_enabled": False, "out": []}
    _run(session, settings, [
        {"kind": "call", "op": "getitem", "args": [{"ref": "w"}, 0], "grad_enabled": False, "out": ["row"]},
        {"kind": "call", "op": "mul_", "args": [{"ref": "row"}, 2.0], **no_grad},  # a view made under no_grad
        {"kind": "call", "op": "add_", "args": [{"ref": "w"}, 1.0], **no_grad},  # a leaf that requires grad
        {"kind": "call", "op": "add_", "args": [{"ref": "row"}, {"ref": "z"}], **no_grad},  # reads one
    ], "update")
    torch.testing.assert_close(session.tensors["w"].value.detach(), torch.tensor([[2.0, 4, 6], [4, 5, 6]]))
    bad = run_steps(session, validate_program({"id": "bad", "steps": [
        {"kind": "call", "op": "add_", "args": [{"ref": "w"}, 1.0], "out": []}]}), settings)
    assert bad.status == 422 and "leaf Variable that requires grad" in bad.body["error"]["message"]


# -- metrics and answers --------------------------------------------------------------------------

def test_step_histogram_renders_like_prometheus_histogram():
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    mine = StepHistogram("op_seconds", "doc", OP_BUCKETS)
    ours.register(mine)
    reference = Histogram("op_seconds", "doc", ("op",), buckets=OP_BUCKETS, registry=theirs)
    for k, (op, seconds) in enumerate([("add", 3e-6), ("add", 1e-5), ("add", 0.002), ("backward", 0.3), ("x", 100.0),
                                        ("add", 5.0)]):
        mine.pending.append((op, seconds))  # as the runner does after each step
        if k == 2:
            mine.fold()  # as the runner does once FOLD_AT wait: the rest are folded by the scrape
        reference.labels(op).observe(seconds)
    created = re.compile(r"(_created\{.*\}) .*")
    assert created.sub(r"\1", generate_latest(ours).decode()) == created.sub(r"\1", generate_latest(theirs).decode())


def test_the_runner_folds_the_step_times_once_enough_wait():
    """Each step's time waits in ``pending`` (no call of ours per step); after a program that leaves
    ``FOLD_AT`` or more waiting, the runner folds them: the list stays bounded with no scrape."""
    store, session, settings = _session()
    steps = StepHistogram("op_seconds", "doc", OP_BUCKETS)
    run_steps(session, validate_program({"id": "a", "steps": [_put("a", torch.ones(2))]}), settings, observe=steps)
    assert [op for op, _ in steps.pending] == ["put"]  # one step: it waits
    steps.pending.extend([("add", 1e-3)] * (FOLD_AT - 2))
    run_steps(session, validate_program({"id": "b", "steps": [_put("b", torch.ones(2))]}), settings, observe=steps)
    assert steps.pending == []  # FOLD_AT waited: folded
    rows = steps.rows()
    assert sum(rows["put"][:-2]) == 2 and sum(rows["add"][:-2]) == FOLD_AT - 2


def test_small_fetches_are_bytes_and_count_against_the_retry_cache():
    store, session, settings = _session()
    _run(session, settings, [_put("small", torch.ones(4)), _put("big", torch.ones(1 << 15))], "setup")
    fetch = lambda tid: {"kind": "fetch", "id": tid, "value": True, "grad": False}  # noqa: E731
    outcome = _run(session, settings, [fetch("small"), fetch("big")], "f")
    small, big = (r["tensor"]["value"]["data"] for r in outcome.body["results"])
    assert isinstance(small, bytes) and isinstance(big, memoryview)
    assert keepable(outcome, "f").body["results"][1]["tensor"]["value"]["data"] == bytes(big)
    _run(session, settings, [_put("mid", torch.ones(15000))], "setup2")  # 60 kB: below a frame, sent as bytes
    many = _run(session, settings, [fetch("mid")] * 20, "many")
    assert all(isinstance(r["tensor"]["value"]["data"], bytes) for r in many.body["results"])
    assert keepable(many, "many").status == 409  # 1.2 MB of fetched data is too much to keep for a retry


def test_op_table_resolution_follows_the_table():
    table = OpTable()
    assert table.resolve("double") is None and table.resolve("double_") is None

    @op("double", samples=(S(T((2,))),), reference=None, shape_rule="elementwise", table=table)
    def double(input):
        """2 * input"""
        return input * 2

    entry = table.get("double")
    assert table.resolve("double")[:2] == (entry, False) and table.resolve("double_")[:2] == (entry, True)
    table.remove("double")
    assert table.resolve("double") is None and table.resolve("double_") is None


# -- grads taken over without a copy --------------------------------------------------------------

def _grad(session, tid):
    return session.tensors[tid].grad


def test_grads_taken_over_never_alias_another_tensor():
    store, session, settings = _session()
    gen = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(8, 300, generator=gen), torch.randn(200, 300, generator=gen), torch.randn(200, generator=gen)
    a, c, t = torch.randn(3, generator=gen), torch.randn(3, generator=gen), torch.randn(3, generator=gen)
    _run(session, settings, [_put("x", x), _put("w", w, True), _put("b", b, True), _put("a", a, True),
                             _put("c", c, True), _put("t", t)], "setup")
    ref = lambda t: {"ref": t}  # noqa: E731
    _run(session, settings, [
        {"kind": "call", "op": "linear", "args": [ref("x"), ref("w"), ref("b")], "out": ["h"]},
        {"kind": "call", "op": "sum", "args": [ref("h")], "out": ["l"]},
        {"kind": "backward", "tensors": ["l"], "retain_graph": True},
        {"kind": "backward", "tensors": ["l"]},  # accumulates into the grads of the first one
        {"kind": "call", "op": "add", "args": [ref("a"), ref("c")], "out": ["s"]},  # one grad for both
        {"kind": "backward", "tensors": ["s"], "grad_tensors": [ref("t")]},  # which is the gradient sent
    ], "backward")
    lw, lb = w.clone().requires_grad_(), b.clone().requires_grad_()
    torch.nn.functional.linear(x, lw, lb).sum().backward()
    assert_same_bits(_grad(session, "w"), lw.grad * 2)
    assert_same_bits(_grad(session, "b"), lb.grad * 2)
    _grad(session, "a").mul_(3)
    assert torch.equal(_grad(session, "c"), t) and torch.equal(_grad(session, "a"), 3 * t)
    assert torch.equal(session.tensors["t"].value, t)
    # a leaf as its own root: its new grad is the gradient sent, which stays the client's own tensor
    _run(session, settings, [{"kind": "set_grad", "id": "c", "grad": None},
                             {"kind": "backward", "tensors": ["c"], "grad_tensors": [ref("t")]}], "leaf")
    _grad(session, "c").zero_()
    assert torch.equal(session.tensors["t"].value, t)


def test_grads_taken_over_equal_the_grads_of_the_plain_path_that_clones_them(monkeypatch):
    """``autograd_steps.owned`` (the speed path) against cloning every grad (the plain path)."""
    gen = torch.Generator().manual_seed(1)
    x, w, b = torch.randn(6, 40, generator=gen), torch.randn(40, 30, generator=gen), torch.randn(30, generator=gen)
    ref = lambda t: {"ref": t}  # noqa: E731
    # x @ w: the weight's grad is a fresh matmul result that nothing else holds, the case the
    # speed path is for (torch's own linear hands back a transposed view, which is cloned)
    steps = [_put("x", x), _put("w", w, True), _put("b", b, True),
             {"kind": "call", "op": "matmul", "args": [ref("x"), ref("w")], "out": ["m"]},
             {"kind": "call", "op": "add", "args": [ref("m"), ref("b")], "out": ["h"]},
             {"kind": "call", "op": "tanh", "args": [ref("h")], "out": ["t"]},
             {"kind": "call", "op": "sum", "args": [ref("t")], "out": ["l"]},
             {"kind": "backward", "tensors": ["l"], "retain_graph": True},
             {"kind": "backward", "tensors": ["l"]}]  # the second accumulates into what the first took over

    taken = []
    real_owned = autograd_steps.owned

    def watched(grads, i):
        taken.append(real_owned(grads, i))
        return taken[-1]

    monkeypatch.setattr(autograd_steps, "owned", watched)
    _, fast, settings = _session()
    _run(fast, settings, steps, "fast")
    assert any(taken), "no grad was taken over: the speed path was not exercised"
    monkeypatch.setattr(autograd_steps, "owned", lambda grads, i: False)
    _, plain, _ = _session()
    _run(plain, settings, steps, "plain")
    for tid in ("w", "b"):
        assert_same_bits(_grad(fast, tid), _grad(plain, tid))


def test_backward_reports_and_charges_only_the_leaves_it_reaches():
    settings = Settings(max_session_bytes=3000)
    store = SessionStore(settings)
    session = store.create()
    ref = lambda t: {"ref": t}  # noqa: E731
    # u: reached, but its op gives it no gradient; far: a big leaf the graph never reaches
    _run(session, settings, [_put("x", torch.randn(4), True), _put("u", torch.randn(4), True),
                             _put("far", torch.randn(400), True)], "setup")
    outcome = _run(session, settings, [
        {"kind": "call", "op": "vector_norm", "args": [ref("u"), 0], "out": ["n"]},
        {"kind": "call", "op": "sum", "args": [ref("x")], "out": ["s"]},
        {"kind": "call", "op": "add", "args": [ref("s"), ref("n")], "out": ["l"]},
        {"kind": "backward", "tensors": ["l"]},
    ], "backward")
    # all three grads would not fit (1600 bytes for "far" alone); the two reached ones do
    assert outcome.body["results"][-1] == {"tensors": [], "no_grad": ["u"]}
    assert _grad(session, "far") is None and _grad(session, "u") is None
    assert torch.equal(_grad(session, "x"), torch.ones(4))
    assert session.bytes_held == 16 + 16 + 1600 + 4 + 4 + 4 + 16  # values, then x's grad


# -- fetched big tensors as views of their bytes --------------------------------------------------

BIG = FRAME_MIN_BYTES // 4  # float32 elements: big enough for a fetch to answer with a view


def _answered(outcome, accept: str) -> list[torch.Tensor]:
    """The values and grads an answer carries, as the client decodes the body it is sent."""
    media_type, parts, _ = encode_answer(outcome.body, accept != JSON, accept)
    body = b"".join(bytes(p) for p in parts)
    decoded = unpack_frames(bytearray(body)) if media_type == FRAMES else decode_body(body, media_type)
    return [decode_tensor(r["tensor"][k]) for r in decoded["results"] if r and r.get("tensor")
            for k in ("value", "grad") if r["tensor"][k] is not None]


@pytest.mark.parametrize("accept", [FRAMES, MSGPACK, JSON])
def test_a_fetch_answers_the_value_at_its_step_though_later_steps_write_the_tensor(accept):
    """A view of the live bytes (the speed path) only after the program's last writing step: a
    fetch before it answers what the tensor held then, as the copy (the plain path) does."""
    _, session, settings = _session()
    ref = lambda t: {"ref": t}  # noqa: E731
    steps = [_put("x", torch.zeros(BIG)), _put("w", torch.ones(BIG), True),
             {"kind": "fetch", "id": "x"},
             {"kind": "call", "op": "add_", "args": [ref("x"), 1.0], "out": []},
             {"kind": "call", "op": "sum", "args": [ref("w")], "out": ["l"]},
             {"kind": "backward", "tensors": ["l"], "retain_graph": True},
             {"kind": "fetch", "id": "w", "value": False},
             {"kind": "backward", "tensors": ["l"]},  # accumulates into w's grad in place
             {"kind": "fetch", "id": "x"}, {"kind": "fetch", "id": "w", "value": False},
             {"kind": "free", "ids": ["l"]}]
    outcome = run_steps(session, validate_program({"id": "p", "steps": steps}), settings, as_json=accept == JSON)
    assert outcome.status == 200, outcome.body
    got = _answered(outcome, accept)
    for t, want in zip(got, [0.0, 1.0, 1.0, 2.0], strict=True):
        assert torch.equal(t, torch.full((BIG,), want)), (want, t[:3])
    fetched = [r["tensor"] for r in outcome.body["results"] if r and r.get("tensor")]
    if accept != JSON:  # the copies before the last writing step, the views after it
        kinds = [type(m[k]["data"]) for m in fetched for k in ("value", "grad") if m[k] is not None]
        assert kinds == [bytes, bytes, memoryview, memoryview]
