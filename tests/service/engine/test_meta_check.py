"""No kernel sees arguments torch would refuse (DESIGN principle 4, ``service/engine/meta_check.py``).

A hostile token speaks the protocol directly, as curl would: these tests send raw programs to a
server with two tokens, ``a`` attacking and ``b`` the victim. Before the check, torch's CPU fused
optimizers walked ``params[i].numel()`` elements through shorter tensors: ``_fused_adam_`` given a
256-element grad for a 4096-element param handed ``a`` floats of ``b``'s, and a one-element
momentum buffer made ``_fused_sgd_`` write past it (SIGSEGV, every tenant lost).
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Iterator

import httpx
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from remote_autograd.proto import decode_tensor, dtype_name, encode_tensor
from remote_autograd.service.engine import meta_check
from remote_autograd.service.ops import OP_TABLE

from ...servers import memory_of, reset_peak, running, session_pids
from ..wire import MSGPACK, Wire, call_step, checked_client, decode, new_id, put_step, ref

TOKEN_A, TOKEN_B = "attacker-token", "victim-token"
VICTIM = torch.full((4096,), 7.25)


SESSION_LIMIT = 64 << 20


@pytest.fixture(scope="module")
def server():
    with running(REMOTE_AUTOGRAD_TOKENS=f"{TOKEN_A},{TOKEN_B}", REMOTE_AUTOGRAD_MAX_SESSION_BYTES=str(SESSION_LIMIT)) as s:
        yield s


@pytest.fixture(scope="module")
def url(server) -> str:
    return server.url


def _client(url: str, token: str) -> httpx.Client:
    return checked_client(url, headers={"Authorization": f"Bearer {token}", "Remote-Autograd-Protocol": "1"})


@pytest.fixture(scope="module")
def victim(url: str) -> Iterator[dict]:
    """Token b's session, holding a big tensor of known values (freed and held again by the attacks'
    neighbours in memory: what a short read would find)."""
    with _client(url, TOKEN_B) as c:
        wire = Wire(c, "msgpack")
        sid = wire.session()
        wire.ok(sid, [put_step("secret", wire.tensor(VICTIM))])
        yield {"wire": wire, "sid": sid}


@pytest.fixture(params=["msgpack", "json"])
def attacker(request, url: str) -> Iterator[tuple[Wire, str]]:
    with _client(url, TOKEN_A) as c:
        wire = Wire(c, request.param)
        sid = wire.session()
        yield wire, sid
        c.delete(f"/v1/sessions/{sid}")


def _fetch(wire: Wire, sid: str, tid: str) -> torch.Tensor:
    (result,) = wire.ok(sid, [{"kind": "fetch", "id": tid}])
    return decode_tensor(result["tensor"]["value"])


def _victim_untouched(victim: dict) -> None:
    assert torch.equal(_fetch(victim["wire"], victim["sid"], "secret"), VICTIM)


def _puts(wire: Wire, tensors: dict[str, torch.Tensor]) -> list:
    return [put_step(tid, wire.tensor(t)) for tid, t in tensors.items()]


def _refused(wire: Wire, sid: str, steps: list, *words: str) -> dict:
    status, body = wire.program(sid, steps)
    assert status == 422, body
    error = body["error"]
    assert error["code"] == "op_error" and error["step"] == len(steps) - 1, error
    for word in words:
        assert word in error["message"], error["message"]
    return error


def test_fused_sgd_with_a_one_element_momentum_buffer_is_refused_and_writes_nothing(attacker, victim):
    """The crash of issue 19: one small program, every session of every token lost (SIGSEGV)."""
    wire, sid = attacker
    params = torch.linspace(-1, 1, 64)
    wire.ok(sid, _puts(wire, {"p": params, "g": torch.ones(64), "m": torch.zeros(1)}))
    _refused(wire, sid, [call_step("_fused_sgd_", [ref("p")], [ref("g")], [ref("m")], weight_decay=0.0,
                                   momentum=0.9, lr=0.1, dampening=0.0, nesterov=False, maximize=False,
                                   is_first_step=False)],
             "momentum_buffer_list", "shape [1]")
    assert torch.equal(_fetch(wire, sid, "p"), params)
    assert torch.equal(_fetch(wire, sid, "m"), torch.zeros(1))
    _victim_untouched(victim)


def test_fused_adam_with_a_short_grad_never_shows_another_tenants_memory(attacker, victim):
    """The read of issue 19: params of 4096 elements, a grad of 256; the fetched params carried the
    victim's 7.25s. Now refused before the kernel, and the params are what they were."""
    wire, sid = attacker
    zeros = torch.zeros(4096)
    wire.ok(sid, _puts(wire, {"p": zeros, "g": torch.zeros(256), "m": zeros, "v": zeros, "s": torch.ones(())}))
    _refused(wire, sid, [call_step("_fused_adam_", [ref("p")], [ref("g")], [ref("m")], [ref("v")], [],
                                   [ref("s")], lr=0.1, beta1=0.9, beta2=0.999, weight_decay=0.0, eps=1e-8,
                                   amsgrad=False, maximize=False)],
             "grads[0]", "[256]", "[4096]")
    assert torch.equal(_fetch(wire, sid, "p"), zeros)
    _victim_untouched(victim)


def _adam(*, p="p", g="g", m="m", v="v", s="s", maxes=(), amsgrad=False) -> dict:
    refs = lambda ids: [ref(i) for i in (ids if isinstance(ids, (list, tuple)) else [ids])]  # noqa: E731
    return call_step("_fused_adam_", refs(p), refs(g), refs(m), refs(v), refs(maxes), refs(s), lr=0.1, beta1=0.9,
                     beta2=0.999, weight_decay=0.0, eps=1e-8, amsgrad=amsgrad, maximize=False)


# each class of mismatch a CPU fused kernel trusts: the call and the words its refusal must name
_MISMATCHES = {
    "list length": (_adam(m=["m", "m2"]), "exp_avgs has 2 tensors"),
    "shape": (_adam(v="short"), "exp_avg_sqs[0] has shape [3]"),
    "dtype": (_adam(g="double"), "grads[0] is torch.float64"),
    "strides": (_adam(g="transposed"), "strides"),
    "not dense": (_adam(p="every_other", g="half_g", m="half_m", v="half_v"), "not dense"),
    "written twice": (_adam(m="p"), "share memory"),
    "amsgrad without maxes": (_adam(amsgrad=True), "max_exp_avg_sqs has 0 tensors"),
    "a step of many elements": (_adam(s="many"), "state_steps[0] must be a tensor of one element"),
}


@pytest.mark.parametrize("case", _MISMATCHES)
def test_every_class_of_fused_mismatch_is_refused_with_the_argument_named(attacker, case):
    wire, sid = attacker
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    tensors = {"p": base, "g": torch.ones(3, 4), "m": torch.zeros(3, 4), "m2": torch.zeros(3, 4),
               "v": torch.zeros(3, 4), "s": torch.ones(()), "short": torch.zeros(3),
               "double": torch.ones(3, 4, dtype=torch.float64), "many": torch.ones(3),
               "half_g": torch.ones(6), "half_m": torch.zeros(6), "half_v": torch.zeros(6)}
    wire.ok(sid, _puts(wire, tensors) + [
        call_step("t", ref("g"), out=["gt"]), call_step("contiguous", ref("gt"), out=["gtc"]),
        call_step("t", ref("gtc"), out=["transposed"]),  # (3, 4) with strides (1, 3)
        call_step("reshape", ref("p"), [12], out=["flat"]),
        call_step("getitem", ref("flat"), {"slice": [None, None, 2]}, out=["every_other"])])
    step, words = _MISMATCHES[case]
    _refused(wire, sid, [step], words)
    assert torch.equal(_fetch(wire, sid, "p"), base)


# -- every native entry, its arguments mismatched: refused, or exactly torch's answer --------------


def _native_cases() -> list[tuple[str, int, str]]:
    cases = []
    for entry in OP_TABLE:
        if entry.kind != "native" or not entry.samples or entry.name.startswith("_test"):
            continue
        args, kwargs = entry.samples[0].materialise(torch.float32)
        for where, _ in _tensor_places((args, kwargs)):
            cases += [(entry.name, where, "one element"), (entry.name, where, "another dtype")]
        cases += [(entry.name, where, "one fewer") for where, v in _list_places((args, kwargs)) if v]
    return cases


def _places(value: Any, wanted, path: tuple = ()) -> Iterator[tuple[tuple, Any]]:
    """``(path, node)`` of every node of a sample's nested arguments that ``wanted(path, node)``."""
    if wanted(path, value):
        yield path, value
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _places(v, wanted, (*path, i))
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _places(v, wanted, (*path, k))


def _tensor_places(value: Any) -> Iterator[tuple[tuple, torch.Tensor]]:
    return _places(value, lambda path, v: isinstance(v, torch.Tensor))


def _list_places(value: Any) -> Iterator[tuple[tuple, list]]:
    """Lists of tensors among the arguments (the top-level args list itself is not one)."""
    return _places(value, lambda path, v: isinstance(v, list) and len(path) > 1
                   and any(isinstance(x, torch.Tensor) for x in v))


def _mutated(value: Any, where: tuple, how: str) -> Any:
    if not where:
        if how == "one fewer":
            return value[:-1]
        if how == "one element":
            return value.detach().reshape(-1)[:1].clone()
        other = torch.float64 if value.dtype != torch.float64 else torch.float32
        if not (value.dtype.is_floating_point or value.dtype.is_complex):
            other = torch.int32 if value.dtype == torch.int64 else torch.int64
        return value.detach().to(other)
    head, rest = where[0], where[1:]
    if isinstance(value, dict):
        return {**value, head: _mutated(value[head], rest, how)}
    items = list(value)
    items[head] = _mutated(items[head], rest, how)
    return type(value)(items) if isinstance(value, tuple) else items


class _Encoder:
    """A sample's arguments as wire values: each tensor a put, each dtype and slice tagged."""

    def __init__(self, wire: Wire) -> None:
        self.wire, self.puts, self.prefix = wire, [], new_id()

    def value(self, v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            tid = f"{self.prefix}{len(self.puts)}"
            self.puts.append(put_step(tid, self.wire.tensor(v.detach())))
            return ref(tid)
        if isinstance(v, (list, tuple)):
            return [self.value(x) for x in v]
        if isinstance(v, dict):
            return {k: self.value(x) for k, x in v.items()}
        if isinstance(v, torch.dtype):
            return {"dtype": dtype_name(v)}
        if isinstance(v, slice):
            return {"slice": [v.start, v.stop, v.step]}
        if v is Ellipsis:
            return {"ellipsis": True}
        return v


def _outputs(result: Any) -> list[torch.Tensor]:
    outs = result if isinstance(result, (tuple, list)) else [result]
    return [o for o in outs if isinstance(o, torch.Tensor)]


@pytest.fixture(scope="module")
def fresh(url: str) -> Iterator[tuple[Wire, str]]:
    with _client(url, TOKEN_A) as c:
        wire = Wire(c, "msgpack")
        yield wire, wire.session()


CASES = _native_cases()


@pytest.mark.parametrize("name,where,how", CASES, ids=[f"{n}-{'.'.join(map(str, w))}-{h}" for n, w, h in CASES])
def test_a_native_entry_given_mismatched_arguments_refuses_them_or_gives_torchs_answer(fresh, victim, name, where,
                                                                                      how):
    """Never 5xx, never a crash; an accepted call answers exactly what local torch answers for the
    same arguments, and a call local torch refuses is refused."""
    wire, sid = fresh
    entry = OP_TABLE.get(name)
    args, kwargs = entry.samples[0].materialise(torch.float32)
    args, kwargs = _mutated((args, kwargs), where, how)
    try:
        with torch.no_grad():
            expected = entry.reference(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args], **kwargs)
    except Exception:
        expected = None
    enc = _Encoder(wire)
    wire_args, wire_kwargs = enc.value(list(args)), enc.value(kwargs)
    out = new_id()
    step = {**call_step(name, *wire_args, out=[out], **wire_kwargs), "out_many": True, "grad_enabled": False}
    status, body = wire.program(sid, enc.puts + [step])
    wire.ok(sid, [{"kind": "free", "ids": [p["id"] for p in enc.puts]}])
    if expected is None:
        assert status in (400, 404, 413, 422), body
        return
    if status != 200:
        assert 400 <= status < 500, body
        return
    if entry.inplace or not entry.exact:
        return  # written lists (compared by the op tests) and random draws
    ids = [meta["id"] for meta in body["results"][len(enc.puts)]["tensors"]]
    got = [decode_tensor(r["tensor"]["value"]) for r in wire.ok(sid, [{"kind": "fetch", "id": i} for i in ids])]
    want = _outputs(expected)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert torch.equal(g, w.contiguous()) or (torch.allclose(g, w, equal_nan=True) and g.is_floating_point())
    wire.ok(sid, [{"kind": "free", "ids": ids}])


def test_the_server_and_the_victim_are_still_fine_after_every_mismatch(url, victim):
    with checked_client(url) as c:
        assert c.get("/healthz").json()["status"] == "ok"
    _victim_untouched(victim)


# -- the memo: the same answers as the plain meta run ---------------------------------------------


def test_the_memo_gives_the_meta_runs_answers_and_keys_everything_a_kernel_checks():
    """Same layouts hit the memo; a different stride, offset, dtype, storage sharing or Python value
    is another key, so a refusal is never reused for an acceptable call or the reverse."""
    add, mm = OP_TABLE.get("add"), OP_TABLE.get("mm")
    x, y = torch.ones(2, 3), torch.ones(3, 4)
    meta_check.forget()
    assert meta_check.check_call(mm, [x, y], {}, inplace=False, grad_enabled=True).bytes == 2 * 4 * 4
    assert meta_check.check_call(mm, [x, y], {}, inplace=False, grad_enabled=True).bytes == 2 * 4 * 4  # memoized
    with pytest.raises(Exception, match="same reduction dim"):  # torch's meta kernel's words
        meta_check.check_call(mm, [x, x], {}, inplace=False, grad_enabled=True)
    with pytest.raises(Exception, match="same reduction dim"):  # the refusal is memoized too
        meta_check.check_call(mm, [x, x], {}, inplace=False, grad_enabled=True)
    assert meta_check.check_call(mm, [x, x.t()], {}, inplace=False, grad_enabled=True).bytes == 2 * 2 * 4
    assert meta_check.check_call(add, [x, 1], {}, inplace=False, grad_enabled=True).bytes == 2 * 3 * 4
    assert meta_check.check_call(add, [x.long(), 1], {}, inplace=False, grad_enabled=True).bytes == 2 * 3 * 8
    assert meta_check.check_call(add, [x.long(), 1.0], {}, inplace=False, grad_enabled=True).bytes == 2 * 3 * 4
    base = torch.zeros(8)
    view = base[2:5]
    add_ = OP_TABLE.resolve("add_")  # torch's own Tensor.add_
    assert meta_check.check_call(add, [view, view], {}, inplace=True, grad_enabled=False, fn=add_.fn,
                                 writes=add_.writes).bytes == 0
    with pytest.raises(Exception, match="single memory location"):
        meta_check.check_call(add, [torch.zeros(1).expand(4), 1], {}, inplace=True, grad_enabled=False, fn=add_.fn,
                              writes=add_.writes)


def test_a_view_op_is_charged_nothing_and_a_grown_storage_its_growth():
    view, resize = OP_TABLE.get("view"), OP_TABLE.resolve("resize_").entry
    x = torch.zeros(4, 6)
    meta_check.forget()
    assert meta_check.check_call(view, [x, [24]], {}, inplace=False, grad_enabled=True).bytes == 0
    if resize is not None and not resize.check:
        small = torch.zeros(2, 3)
        try:
            grown = meta_check.check_call(resize, [small, 4, 6], {}, inplace=True, grad_enabled=False).bytes
        except Exception:
            grown = None  # our resize_ refuses to grow; torch's own (the derived table) grows it
        assert grown in (None, (24 - 6) * 4)


# small arguments, outputs of 4 GiB (the factory 512 MiB): each was allocated before its 413 (32x the element limit for
# repeat, outer, einsum, pad, one_hot; interpolate passed 6 GiB)
_BOMBS = {
    "outer": lambda v: call_step("outer", ref(v(1 << 15)), ref(v(1 << 15)), out=["o"]),
    "repeat": lambda v: call_step("repeat", ref(v(1024)), [1 << 20], out=["o"]),
    "einsum": lambda v: call_step("einsum", "i,j->ij", ref(v(1 << 15)), ref(v(1 << 15)), out=["o"]),
    "pad": lambda v: call_step("pad", ref(v(4)), [0, 1 << 30], out=["o"]),
    "interpolate": lambda v: call_step("interpolate", ref(v(16, shape=[1, 1, 4, 4])), size=[1 << 15, 1 << 15],
                                       out=["o"]),
    "zeros": lambda v: call_step("zeros", 1 << 27, out=["o"]),  # within max_tensor_elements, not the bytes
}


@pytest.fixture(scope="module", params=["off", "on"], ids=["inprocess", "tenants"])
def bomb_server(request):
    """Both backends: the process whose memory a bomb would grow is the server, or the token's worker."""
    with running(REMOTE_AUTOGRAD_TOKENS=TOKEN_A, REMOTE_AUTOGRAD_MAX_SESSION_BYTES=str(SESSION_LIMIT),
                 REMOTE_AUTOGRAD_TENANT_PROCESSES=request.param) as s:
        yield s


@contextlib.contextmanager
def _session_on(server) -> Iterator[tuple[Wire, str, list[int]]]:
    """A session of token a on ``server``, and the processes that hold its memory."""
    with _client(server.url, TOKEN_A) as c:
        wire = Wire(c, "msgpack")
        sid = wire.session()
        yield wire, sid, session_pids(server, c, sid)
        c.delete(f"/v1/sessions/{sid}")


@pytest.fixture
def bomber(bomb_server) -> Iterator[tuple[Wire, str, list[int]]]:
    with _session_on(bomb_server) as session:
        yield session


def _set_off(bomber: tuple[Wire, str, list[int]], bomb) -> tuple[int, dict, int]:
    """Run the step ``bomb`` makes (from vectors it asks for, put first): its status, its answer, and how
    far the peak memory of the session's processes rose while it ran."""
    wire, sid, pids = bomber
    puts = []

    def vector(n: int, shape=None, value=1, dtype=torch.float32) -> str:
        tid = f"v{len(puts)}"
        puts.append(put_step(tid, wire.tensor(torch.full([n], value, dtype=dtype).reshape(shape or [n]))))
        return tid

    step = bomb(vector)
    wire.ok(sid, puts)
    reset_peak(pids)
    before = memory_of(pids, "VmHWM")
    status, body = wire.program(sid, [step])
    return status, body, memory_of(pids, "VmHWM") - before


@pytest.mark.parametrize("op", _BOMBS)
def test_a_huge_output_is_refused_before_anything_is_allocated(bomber, op):
    status, body, grew = _set_off(bomber, _BOMBS[op])
    assert status == 413, body
    assert "max_session_bytes" in body["error"]["message"]
    assert grew < 256 << 20  # nothing near 4 GiB was ever resident


def test_a_data_dependent_output_is_bounded_by_its_values_before_the_kernel(bomber):
    """one_hot's width is its input's largest value: 2^30 classes for one element is 8 GiB."""
    wire, sid, pids = bomber
    wire.ok(sid, [put_step("i", wire.tensor(torch.tensor([1 << 30])))])
    reset_peak(pids)
    before = memory_of(pids, "VmHWM")
    status, body = wire.program(sid, [{**call_step("one_hot", ref("i"), out=["o"]), "out_many": True}])
    assert status == 413, body
    assert memory_of(pids, "VmHWM") - before < 256 << 20


# outputs of 2^27 elements (512 MiB as float32, one_hot's 1 GiB as int64), past max_tensor_elements (2^20) and
# within every byte limit: each was allocated before its 413 (issue 31), the element limit checked after the kernel
ELEMENT_LIMIT = 1 << 20
_PAST_THE_ELEMENT_LIMIT = {
    "repeat": lambda v: call_step("repeat", ref(v(1024)), [1 << 17], out=["o"]),
    "outer": lambda v: call_step("outer", ref(v(1 << 14)), ref(v(1 << 13)), out=["o"]),
    "einsum": lambda v: call_step("einsum", "i,j->ij", ref(v(1 << 14)), ref(v(1 << 13)), out=["o"]),
    "pad": lambda v: call_step("pad", ref(v(4)), [0, 1 << 27], out=["o"]),
    "interpolate": lambda v: call_step("interpolate", ref(v(16, shape=[1, 1, 4, 4])), size=[1 << 13, 1 << 14],
                                       out=["o"]),
    "one_hot": lambda v: {**call_step("one_hot", ref(v(1, value=1 << 27, dtype=torch.int64)), out=["o"]),
                          "out_many": True},  # no num_classes: its width is its largest value
}


@pytest.fixture(scope="module")
def elements_server():
    """Default byte limits (8 GiB a session), a small element limit."""
    with running(REMOTE_AUTOGRAD_TOKENS=TOKEN_A, REMOTE_AUTOGRAD_MAX_TENSOR_ELEMENTS=str(ELEMENT_LIMIT)) as s:
        yield s


@pytest.mark.parametrize("op", _PAST_THE_ELEMENT_LIMIT)
def test_an_output_past_the_element_limit_is_refused_before_its_kernel_allocates_it(elements_server, op):
    with _session_on(elements_server) as bomber:
        status, body, grew = _set_off(bomber, _PAST_THE_ELEMENT_LIMIT[op])
        assert status == 413, body
        assert f"max_tensor_elements={ELEMENT_LIMIT}" in body["error"]["message"], body
        assert grew < 128 << 20  # the 512 MiB output was never made


def test_the_conv2d_of_issue_31_is_refused_before_it_runs(bomber):
    """Two ``expand``ed one-element tensors, a 2048x2048 image by a 1024x1024 kernel: 4 MiB held, 497 s of
    work as one step. Refused on its count before the kernel (the client's 30 s timeout would end the
    test long before such a kernel did)."""
    wire, sid, _ = bomber
    one = wire.tensor(torch.ones(1, 1, 1, 1))
    wire.ok(sid, [put_step("x1", one), put_step("w1", one),
                  call_step("expand", ref("x1"), [1, 1, 2048, 2048], out=["x"]),
                  call_step("expand", ref("w1"), [1, 1, 1024, 1024], out=["w"])])
    status, body = wire.program(sid, [call_step("conv2d", ref("x"), ref("w"), out=["y"]),
                                      {"kind": "fetch", "id": "y"}])
    assert status == 413, body
    error = body["error"]
    assert error["code"] == "too_large" and error["step"] == 0 and error["op"] == "conv2d"
    assert "max_step_flops=100000000000" in error["message"] and "3.53e+13 FLOPs" in error["message"]
    assert wire.ok(sid, [call_step("conv2d", ref("w1"), ref("w1"), out=["small"])]) is not None  # it goes on


def _each_sample():
    for entry in OP_TABLE:
        if entry.name.startswith("_test"):
            continue
        for index, sample in enumerate(entry.samples):
            yield pytest.param(entry.name, index, id=f"{entry.name}-{index}")


def _answer(entry, args, kwargs):
    try:
        return meta_check.check_call(entry, args, kwargs, inplace=entry.inplace, grad_enabled=True)
    except Exception as exc:
        return type(exc).__name__, str(exc)


@pytest.mark.parametrize("name,index", list(_each_sample()))
def test_memoized_and_plain_checks_agree_on_every_sample(name, index):
    """The speed path (a remembered answer) and the plain path (the call on meta) agree, and every
    sample the table declares passes the check (a false refusal would stop a real program)."""
    entry = OP_TABLE.get(name)
    args, kwargs = entry.samples[index].materialise(torch.float32, seed=index)
    meta_check.forget()
    plain = _answer(entry, args, kwargs)
    assert isinstance(plain, meta_check.Needs), plain
    again, copies = entry.samples[index].materialise(torch.float32, seed=index)
    assert _answer(entry, again, copies) == plain  # memoized, on other tensors of the same layouts


class _ValueReads(TorchDispatchMode):
    """Counts the values read back to the host (``.item()``: a sync on a GPU) while it is on."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.reads += 1
        return func(*args, **(kwargs or {}))


def test_a_0d_tensor_is_keyed_by_its_layout_unless_the_check_needs_its_value():
    """``clip_grad_norm_``'s coefficient, a new value every step, hits the memo and is never read back;
    ``narrow``'s tensor ``start``, whose value decides torch's refusal, is answered value by value."""
    mul, narrow = OP_TABLE.get("mul"), OP_TABLE.get("narrow")
    x = torch.ones(3, 4)
    meta_check.forget()
    assert meta_check.check_call(mul, [x, torch.tensor(0.5)], {}, inplace=False, grad_enabled=False).bytes == 3 * 4 * 4
    with _ValueReads() as reads:
        for coefficient in (0.25, 2.0, float("nan")):
            assert meta_check.check_call(mul, [x, torch.tensor(coefficient)], {}, inplace=False,
                                         grad_enabled=False).bytes == 3 * 4 * 4
    assert reads.reads == 0
    row = torch.arange(10.0)
    for start in (2, 9, 3, 9, 8, 2):  # each answer as the plain meta run gives it, in any order
        if start == 8:
            meta_check.forget()  # and after the memo starts again
        if start + 2 <= 10:
            assert meta_check.check_call(narrow, [row, 0, torch.tensor(start), 2], {}, inplace=False,
                                         grad_enabled=False).bytes == 0
        else:
            with pytest.raises(Exception, match=r"exceeds dimension size"):
                meta_check.check_call(narrow, [row, 0, torch.tensor(start), 2], {}, inplace=False, grad_enabled=False)
