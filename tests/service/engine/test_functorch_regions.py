"""``functorch`` steps of a template over raw HTTP (``proto/SPEC.md`` §5), written by hand as a non-Python
client would: per-sample gradients (``vmap(grad(f))``) run by torch's functorch on the server equal
``torch.func`` locally; a region that is not well formed is refused when the template is defined (400);
a run whose region fails (on meta, or in its kernel) keeps no output and leaves the server's
functorch stack clean for the next run and every other session.
"""

from __future__ import annotations

import httpx
import pytest
import torch
from torch.func import grad, vmap

from remote_autograd import client
from remote_autograd.client.transport._embedded import service_app
from remote_autograd.proto import decode_tensor, encode_tensor

from ...conftest import PROTOCOL_HEADERS
from ..wire import Wire, call_step, decode, put_step, ref


def fx(fn: str, **fields) -> dict:
    return {"kind": "functorch", "fn": fn, **fields}


def _steps(batch: int = 4) -> list[dict]:
    """Per-sample gradients of ``(x @ w - t) ** 2`` by ``w``: ``vmap(grad(loss), in_dims=(None, 0, 0))``."""
    return [
        fx("vmap_enter", batch=batch, randomness="error"),
        fx("add_batch_dim", id="X", dim=0, out=["x"]),
        fx("add_batch_dim", id="T", dim=0, out=["t"]),
        fx("grad_enter"),
        fx("wrap_for_grad", id="w", out=["wg"]),
        fx("wrap_for_grad", id="x", out=["xg"]),
        fx("wrap_for_grad", id="t", out=["tg"]),
        fx("requires_grad", id="wg"),
        call_step("matmul", ref("xg"), ref("wg"), out=["p"]),
        call_step("sub", ref("p"), ref("tg"), out=["d"]),
        call_step("mul", ref("d"), ref("d"), out=["l"]),
        fx("autograd_grad", outputs=["l"], inputs=["wg"], out=["gw"]),
        fx("unwrap_for_grad", id="gw", out=["gu"]),
        fx("grad_exit"),
        fx("remove_batch_dim", id="gu", dim=0, out=["G"]),
        fx("vmap_exit"),
    ]


def _template(tid: str = "psg", steps: list | None = None) -> dict:
    return {"kind": "template", "id": tid,
            "inputs": [{"id": "w", "dtype": "float64", "shape": [3]}, {"id": "X", "dtype": "float64", "shape": [4, 3]},
                       {"id": "T", "dtype": "float64", "shape": [4]}],
            "steps": _steps() if steps is None else steps, "outputs": ["G"]}


def _run(out: str, tid: str = "psg", X: str = "X") -> dict:
    return {"kind": "run_template", "template": tid, "inputs": [ref("w"), ref(X), ref("T")], "out": [out]}


G = torch.Generator().manual_seed(5)
W, X, T = (torch.randn(*s, dtype=torch.float64, generator=G) for s in ((3,), (4, 3), (4,)))
WANT = vmap(grad(lambda w, x, t: (x @ w - t) * (x @ w - t)), in_dims=(None, 0, 0))(W, X, T)


def _fetch(wire: Wire, sid: str, tid: str) -> torch.Tensor:
    return decode_tensor(decode(wire.get(f"/v1/sessions/{sid}/tensors/{tid}"))["value"])


def _put_inputs(wire: Wire, sid: str) -> None:
    wire.ok(sid, [put_step("w", wire.tensor(W)), put_step("X", wire.tensor(X)), put_step("T", wire.tensor(T))])


@pytest.mark.backends("inprocess", "tenants")  # in a tenant's worker process too
def test_per_sample_gradients_run_by_functorch_on_the_server_equal_torch_func(wire: Wire, sid: str):
    _put_inputs(wire, sid)
    wire.ok(sid, [_template(), _run("g1"), _run("g2")])
    for out in ("g1", "g2"):
        assert torch.equal(_fetch(wire, sid, out), WANT)


@pytest.mark.parametrize("case", ["outside a region", "never closed", "closed by the other kind",
                                  "batch dim in a grad region", "in-place on an input", "backward inside"])
def test_a_region_that_is_not_well_formed_is_refused_when_defined(wire: Wire, sid: str, case: str):
    steps = _steps()
    steps, words = {
        "outside a region": ([fx("add_batch_dim", id="X", dim=0, out=["x0"]), *steps], ["step 0", "outside"]),
        "never closed": (steps[:-1], ["vmap region is never closed"]),
        "closed by the other kind": ([*steps[:13], fx("vmap_exit"), *steps[14:]], ["step 13", "closes no vmap"]),
        "batch dim in a grad region": ([*steps[:4], fx("add_batch_dim", id="X", dim=0, out=["x2"]), *steps[4:]],
                                       ["step 4", "add_batch_dim inside a grad region"]),
        "in-place on an input": ([*steps[:2], call_step("Tensor.add_", ref("w"), 1.0), *steps[2:]],
                                 ["step 2", "in-place call on a tensor made outside it"]),
        "backward inside": ([*steps[:11], {"kind": "backward", "tensors": ["l"], "retain_graph": True}, *steps[11:]],
                            ["step 11", "backward step inside a torch.func region"]),
    }[case]
    st, body = wire.program(sid, [_template(steps=steps)])
    assert st == 400 and body["error"]["code"] == "bad_request", body
    for w in words:
        assert w in body["error"]["message"], body["error"]["message"]


def test_a_failing_region_keeps_nothing_and_the_next_run_and_session_are_clean(wire: Wire, sid: str):
    _put_inputs(wire, sid)
    wire.ok(sid, [_template()])
    held = decode(wire.get(f"/v1/sessions/{sid}"))["tensors"]
    factor = {"kind": "template", "id": "chol", "inputs": [{"id": "M", "dtype": "float64", "shape": [3, 3, 3]}],
              "steps": [fx("vmap_enter", batch=3, randomness="error"), fx("add_batch_dim", id="M", dim=0, out=["m"]),
                        call_step("linalg.cholesky", ref("m"), out=["c"]), fx("remove_batch_dim", id="c", dim=0,
                                                                               out=["C"]),
                        fx("vmap_exit")],
              "outputs": ["C"]}
    mismatched = {"kind": "template", "id": "mm", "inputs": [*factor["inputs"],
                                                            {"id": "v", "dtype": "float64", "shape": [4]}],
                  "steps": [*factor["steps"][:2], call_step("matmul", ref("m"), ref("v"), out=["c"]),
                            *factor["steps"][3:]], "outputs": ["C"]}
    bad = -torch.eye(3, dtype=torch.float64).expand(3, 3, 3).contiguous()
    wire.ok(sid, [put_step("M", wire.tensor(bad)), factor, mismatched])
    for steps, status, words in [
        # the kernel refuses inside the server's vmap: levels entered, then left
        ([{"kind": "run_template", "template": "chol", "inputs": [ref("M")], "out": ["C"]}], 422,
         ["step 0 of template 'chol'", "linalg.cholesky", "positive-definite"]),
        # torch refuses on meta, before any kernel: levels entered on the meta pass, then left
        ([{"kind": "run_template", "template": "mm", "inputs": [ref("M"), ref("T")], "out": ["P"]}], 422,
         ["step 0 of template 'mm'", "matmul", "size mismatch"]),
    ]:
        st, body = wire.program(sid, steps)
        assert st == status, body
        for w in words:
            assert w in body["error"]["message"], body["error"]["message"]
    assert decode(wire.get(f"/v1/sessions/{sid}"))["tensors"] == held + 1  # M; no output, no temporary
    wire.ok(sid, [_run("g")])
    assert torch.equal(_fetch(wire, sid, "g"), WANT)
    other = wire.session()
    try:  # a plain op in another session: no vmap level of a failed run batches it
        wire.ok(other, [put_step("a", wire.tensor(X)), call_step("sum", ref("a"), out=["s"])])
        assert torch.equal(_fetch(wire, other, "s"), X.sum())
    finally:
        wire.c.delete(f"/v1/sessions/{other}")


def test_a_batch_size_other_than_the_inputs_is_refused(wire: Wire, sid: str):
    _put_inputs(wire, sid)
    steps = _steps(batch=5)
    st, body = wire.program(sid, [_template("b5", steps), _run("g", tid="b5")])
    assert st == 422, body
    assert "expected a dim of size 5" in body["error"]["message"], body["error"]["message"]
    assert wire.get(f"/v1/sessions/{sid}/tensors/g").status_code == 404


@pytest.mark.parametrize("limit, op, args", [
    # X holds 128 KiB; each sample's repeat is 64 KiB, the batch's 256 KiB: counted below vmap's wrappers,
    # before it is made
    ({"max_session_bytes": 256 << 10}, "Tensor.repeat", [2, 1]),
    # a batch of 64x64 matmuls: its work, counted on meta below vmap, is over the step's budget
    ({"max_step_flops": 10**6}, "matmul", [{"ref": "x"}]),
])
def test_a_regions_bytes_and_work_are_held_to_the_limits_before_it_runs(limit: dict, op: str, args: list):
    small = httpx.Client(transport=client.InProcessTransport(service_app(**limit)), base_url="http://in-process",
                         headers=PROTOCOL_HEADERS)
    template = {"kind": "template", "id": "big", "inputs": [{"id": "X", "dtype": "float64", "shape": [4, 64, 64]}],
                "steps": [fx("vmap_enter", batch=4, randomness="error"), fx("add_batch_dim", id="X", dim=0, out=["x"]),
                          call_step(op, ref("x"), *args, out=["y"]), call_step("sum", ref("y"), out=["s"]),
                          fx("remove_batch_dim", id="s", dim=0, out=["S"]), fx("vmap_exit")],
                "outputs": ["S"]}
    steps = [{"kind": "put", "id": "X", "value": encode_tensor(torch.ones(4, 64, 64, dtype=torch.float64),
                                                                  as_json=True)},
             template, {"kind": "run_template", "template": "big", "inputs": [ref("X")], "out": ["S"]}]
    with small:
        sid = small.post("/v1/sessions").json()["session_id"]
        r = small.post(f"/v1/sessions/{sid}/programs", json={"id": "p", "steps": steps})
        assert r.status_code == 413 and f"limit {next(iter(limit))}=" in r.json()["error"]["message"], r.text
        assert small.get(f"/v1/sessions/{sid}/tensors/S").status_code == 404


def test_a_repeated_run_takes_its_checks_answer_by_layouts_and_another_layout_is_checked_again():
    """``region_memo``: a span's meta pass remembered by the layouts it read; the plain path checks each
    run. The same run again answers the same; a bigger batch (a dynamic dim, a scalar batch size) is
    another key: its bytes counted again, over the limit."""
    app = httpx.Client(transport=client.InProcessTransport(service_app(max_session_bytes=256 << 10)),
                       base_url="http://in-process", headers=PROTOCOL_HEADERS)
    template = {"kind": "template", "id": "rep", "scalars": [{"id": "n", "kind": "int"}],
                "inputs": [{"id": "X", "dtype": "float64", "shape": [None, 64, 64]}],
                "steps": [fx("vmap_enter", batch={"scalar": "n"}, randomness="error"),
                          fx("add_batch_dim", id="X", dim=0, out=["x"]),
                          call_step("Tensor.repeat", ref("x"), 2, 1, out=["y"]),
                          call_step("sum", ref("y"), out=["s"]),
                          fx("remove_batch_dim", id="s", dim=0, out=["S"]), fx("vmap_exit")],
                "outputs": ["S"]}
    ones = [torch.arange(n * 64 * 64, dtype=torch.float64).reshape(n, 64, 64) for n in (1, 4)]
    with app:
        sid = app.post("/v1/sessions").json()["session_id"]
        puts = [{"kind": "put", "id": f"X{len(t)}", "value": encode_tensor(t, as_json=True)} for t in ones]
        assert app.post(f"/v1/sessions/{sid}/programs", json={"id": "p0", "steps": [*puts, template]}).status_code == 200

        def run(n: int, out: str) -> httpx.Response:
            step = {"kind": "run_template", "template": "rep", "inputs": [ref(f"X{n}")], "scalars": [n], "out": [out]}
            return app.post(f"/v1/sessions/{sid}/programs", json={"id": f"run-{out}", "steps": [step]})
        # X1 and X4 hold 160 KiB: one sample's repeat (64 KiB) fits, four (256 KiB) do not
        assert run(1, "a").status_code == run(1, "b").status_code == 200
        for out in ("a", "b"):
            got = decode_tensor(app.get(f"/v1/sessions/{sid}/tensors/{out}").json()["value"])
            assert torch.equal(got, 2 * ones[0].sum(dim=(1, 2)))
        r = run(4, "c")
        assert r.status_code == 413 and "max_session_bytes" in r.json()["error"]["message"], r.text
