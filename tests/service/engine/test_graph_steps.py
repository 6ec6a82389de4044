"""Graph replay (``service/engine/graph_steps.py``) changes no answer, error or tensor.

There is no GPU here: the captures are ``graph_capture.RecordedGraph`` (``REMOTE_AUTOGRAD_CUDA_GRAPHS=emulate``),
which keeps a CUDA graph's rules (capturing launches nothing, a replay rewrites what the capture
made, Python is not replayed). A training loop's programs are recorded through the SDK once and
run on two fresh stores, graphs off and emulated: every answer must be the same bytes and every
tensor and grad the same at the end. The other tests hold a replay to its lifetime rule, its
version counts, its bytes and its fallbacks.
"""

from __future__ import annotations

import pytest
import torch

from remote_autograd import client
from remote_autograd.proto import encode_tensor
from remote_autograd.service.engine import graph_steps
from remote_autograd.service.engine.graph_capture import RecordedGraph
from remote_autograd.service.http.app import create_app
from remote_autograd.service.settings import Settings

from ...e2e.test_training import OPTIMIZERS, _data, _mlp
from ...models.gpt import GPT, GPTConfig, get_batch
from .test_program_plan import _record, _state, run_bodies


class Replays:
    """How many programs ran as a capture and as a replay (``monkeypatch``ed around the real ones)."""

    def __init__(self, monkeypatch) -> None:
        self.captures = self.replays = 0
        capture, replay = graph_steps._capture, graph_steps._replay

        def counting_capture(*args):
            self.captures += 1
            return capture(*args)

        def counting_replay(*args):
            self.replays += 1
            return replay(*args)

        monkeypatch.setattr(graph_steps, "_capture", counting_capture)
        monkeypatch.setattr(graph_steps, "_replay", counting_replay)


def _train_loop(optimizer: str, *, steps: int = 10, keep_losses: bool = False):
    """A user's loop: a batch uploaded each step, zero_grad, forward, backward, step, loss.item()."""
    def loop(sess):
        X, Y = _data()
        torch.manual_seed(0)
        model = _mlp().to(sess.device)
        opt = OPTIMIZERS[optimizer](model.parameters())
        kept = []
        for step in range(steps):
            i = (step * 16) % X.shape[0]
            xb, yb = X[i:i + 16].to(sess.device), Y[i:i + 16].to(sess.device)
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            loss.item()
            if keep_losses:
                kept.append(loss)
    return loop


def _run(bodies: list, mode: str, device: str = "cpu") -> tuple[list, dict, object]:
    """Each body run in order on a fresh store with ``cuda_graphs=mode``: (answers, final state, session)."""
    answers, session = run_bodies(bodies, Settings.from_env({}, cuda_graphs=mode, device=device))
    return answers, _state(session), session


def _assert_same(plain: tuple, graphs: tuple) -> None:
    (a, sa, _), (b, sb, _) = plain, graphs
    for i, (x, y) in enumerate(zip(a, b)):
        assert x == y, f"program {i} answered differently with graphs"
    assert sa.keys() == sb.keys()
    for tid in sa:
        if tid == "bytes":
            continue
        (v1, g1), (v2, g2) = sa[tid], sb[tid]
        assert torch.equal(v1, v2), tid
        assert (g1 is None) == (g2 is None) and (g1 is None or torch.equal(g1, g2)), tid


# -- training loops, both ways --------------------------------------------------------------------


@pytest.mark.parametrize("optimizer", ["sgd", "sgd-momentum-nesterov-wd"])
def test_a_training_loop_answers_the_same_bytes_replayed(optimizer, monkeypatch):
    bodies = _record(_train_loop(optimizer))
    plain = _run(bodies, "off")
    counted = Replays(monkeypatch)
    _assert_same(plain, _run(bodies, "emulate"))
    # warm-up twice, capture the two slots, then every step replayed
    assert (counted.captures, counted.replays) == (2, len(bodies) - 1 - 2 - 2)


def _gpt_loop(clip: bool):
    """A small GPT (dropout 0, as GPTs are configured to train) with SGD at a fixed rate."""
    def loop(sess):
        torch.manual_seed(0)
        config = GPTConfig(vocab_size=32, block_size=16, n_layer=1, n_head=2, n_embd=16, dropout=0.0)
        model = GPT(config).to(sess.device)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        data = torch.randint(0, 32, (512,), generator=torch.Generator().manual_seed(1))
        batches = torch.Generator().manual_seed(0)
        for _ in range(8):
            x, y = get_batch(data, 16, 4, batches, sess.device)
            opt.zero_grad()
            _, loss = model(x, y)
            loss.backward()
            if clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            loss.item()
    return loop


@pytest.mark.parametrize("clip", [False, True])
def test_a_gpt_answers_the_same_bytes_replayed(clip, monkeypatch):
    """Captured with clipping too: its coefficient is a 0-d tensor that no check reads on the host
    (the meta check keys it by its layout)."""
    bodies = _record(_gpt_loop(clip))
    plain = _run(bodies, "off")
    counted = Replays(monkeypatch)
    _assert_same(plain, _run(bodies, "emulate"))
    # 8 steps: the first makes the momentum buffers (another program), 2 warm up, 2 are captured
    assert (counted.captures, counted.replays) == (2, 3)


def _tensor_rate_loop(sess):
    """SGD by hand with the rate a 0-d tensor on the device: ``add_``'s ``alpha`` is read on the host."""
    X, Y = _data()
    w = torch.zeros(X.shape[1], device=sess.device, requires_grad=True)
    rate = torch.tensor(-0.1, device=sess.device)
    for _ in range(8):
        loss = ((X.to(sess.device) @ w - Y.float().to(sess.device)) ** 2).mean()
        loss.backward()
        with torch.no_grad():
            w.add_(w.grad, alpha=rate)
        w.grad = None
        loss.item()


def test_a_step_that_reads_a_value_on_the_host_is_never_captured(monkeypatch):
    """Its warm-up runs see the read (capturing it would fail): it runs the plain path, every time."""
    bodies = _record(_tensor_rate_loop)
    plain = _run(bodies, "off")
    counted = Replays(monkeypatch)
    _assert_same(plain, _run(bodies, "emulate"))
    assert (counted.captures, counted.replays) == (0, 0)


def test_a_program_under_other_torch_settings_is_never_captured(monkeypatch):
    """Its settings (``torch_globals``: here the client's default dtype, float64) are not part of a
    capture's signature: it runs the plain path, every time."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        bodies = _record(_train_loop("sgd"))
    finally:
        torch.set_default_dtype(before)
    plain = _run(bodies, "off")
    counted = Replays(monkeypatch)
    _assert_same(plain, _run(bodies, "emulate"))
    assert (counted.captures, counted.replays) == (0, 0)


def test_the_comparison_sees_a_replay_that_launches_nothing(monkeypatch):
    """Without this the test above could pass on a replay that did no device work."""
    bodies = _record(_train_loop("sgd"))
    plain = _run(bodies, "off")
    launched = RecordedGraph.replay
    calls = []

    def only_at_capture(self):  # the capture's own launch, then none
        if self not in calls:
            calls.append(self)
            launched(self)

    monkeypatch.setattr(RecordedGraph, "replay", only_at_capture)
    with pytest.raises(AssertionError):
        _assert_same(plain, _run(bodies, "emulate"))


@pytest.mark.slow  # an app of its own settings, a training loop replayed as graphs
def test_the_sdk_trains_the_same_with_graphs_as_on_cpu():
    """The device is the only difference: a loop on local torch and the same loop on a server
    that replays it as graphs reach the same losses and parameters."""
    def train(device):
        X, Y = _data()
        torch.manual_seed(0)
        model = _mlp().to(device)
        opt = OPTIMIZERS["sgd-momentum-nesterov-wd"](model.parameters())
        losses = []
        for step in range(8):
            i = (step * 16) % X.shape[0]
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(X[i:i + 16].to(device)), Y[i:i + 16].to(device))
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses, [p.detach().cpu() for p in model.parameters()]

    app = create_app(Settings.from_env({}, cuda_graphs="emulate", device="cpu"))
    with client.connect(transport=client.InProcessTransport(app)) as sess:
        remote_losses, remote_params = train(sess.device)
    local_losses, local_params = train("cpu")
    assert remote_losses == local_losses
    for r, l in zip(remote_params, local_params):
        assert torch.equal(r, l)


def test_a_program_whose_floats_change_every_step_is_never_captured(monkeypatch):
    bodies = _record(_train_loop("adam", steps=6))  # Adam's bias corrections: new floats each step
    counted = Replays(monkeypatch)
    _assert_same(_run(bodies, "off"), _run(bodies, "emulate"))
    assert counted.captures == 0


def test_on_is_plain_on_a_device_that_is_not_cuda(monkeypatch):
    bodies = _record(_train_loop("sgd", steps=6))
    counted = Replays(monkeypatch)
    _assert_same(_run(bodies, "off"), _run(bodies, "on"))
    assert counted.captures == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA device: bench/gpu_check.sh runs this")
@pytest.mark.parametrize("optimizer", ["sgd", "sgd-momentum-nesterov-wd"])
def test_on_a_gpu_a_training_loop_is_replayed_as_cuda_graphs(optimizer, monkeypatch):
    """The real thing: CUDA graphs against the plain path on the same GPU (kernels may differ in
    their last bits between the two, so values are compared within float32's noise)."""
    bodies = _record(_train_loop(optimizer))
    plain = _run(bodies, "off", "cuda")
    counted = Replays(monkeypatch)
    graphs = _run(bodies, "on", "cuda")
    assert counted.replays == len(bodies) - 1 - 2 - 2
    assert [status for status, _ in plain[0]] == [status for status, _ in graphs[0]]
    assert plain[1].keys() == graphs[1].keys()
    for tid, (value, grad) in ((k, v) for k, v in plain[1].items() if k != "bytes"):
        other_value, other_grad = graphs[1][tid]
        torch.testing.assert_close(other_value, value, rtol=1e-5, atol=1e-6)
        assert (grad is None) == (other_grad is None)
        if grad is not None:
            torch.testing.assert_close(other_grad, grad, rtol=1e-5, atol=1e-6)


# -- lifetime, versions, bytes, failures ---------------------------------------------------------


def test_a_capture_is_not_replayed_while_its_tensors_are_held(monkeypatch):
    """A client that keeps every step's loss holds both captures: the steps after run the plain path,
    and every kept loss keeps its own value."""
    bodies = _record(_train_loop("sgd", keep_losses=True))
    plain = _run(bodies, "off")
    counted = Replays(monkeypatch)
    _assert_same(plain, _run(bodies, "emulate"))
    assert counted.captures == 2 and counted.replays == 0


def _step(n: int) -> dict:
    """A step on the session's ``w`` (a leaf): y = (x * w).sum(), backward, w -= 0.5 * grad."""
    x, h, y = f"x{n}", f"h{n}", f"y{n}"
    return {"id": f"p{n}", "omit_known_meta": True, "steps": [
        {"kind": "put", "id": x, "value": encode_tensor(torch.full((4,), float(n)))},
        {"kind": "set_grad", "id": "w", "grad": None},
        {"kind": "call", "op": "Tensor.mul", "args": [{"ref": x}, {"ref": "w"}], "out": [h]},
        {"kind": "call", "op": "Tensor.sum", "args": [{"ref": h}], "out": [y]},
        {"kind": "backward", "tensors": [y]},
        {"kind": "call", "op": "Tensor.add_", "args": [{"ref": "w"}, {"grad_of": "w"}], "kwargs": {"alpha": -0.5},
         "grad_enabled": False, "out": []},
        {"kind": "fetch", "id": y},
        {"kind": "free", "ids": [x, h, y]},
    ]}


_SETUP = {"id": "setup", "steps": [{"kind": "put", "id": "w", "value": encode_tensor(torch.ones(4)),
                                    "requires_grad": True}]}


def test_a_replayed_write_moves_the_version_a_saved_tensor_checks(monkeypatch):
    """``w`` saved by an earlier graph, then written by replayed steps: backward through that graph
    is torch's own error both ways (a replay moves version counters as the plain path does)."""
    keep = {"id": "keep", "steps": [
        {"kind": "call", "op": "Tensor.mul", "args": [{"ref": "w"}, {"ref": "w"}], "out": ["sq"]},
        {"kind": "call", "op": "Tensor.sum", "args": [{"ref": "sq"}], "out": ["s"]}]}
    later = {"id": "later", "steps": [{"kind": "backward", "tensors": ["s"]}]}
    bodies = [_SETUP, *[_step(n) for n in range(2)], keep, *[_step(n) for n in range(2, 8)], later]
    counted = Replays(monkeypatch)
    plain, graphs = _run(bodies, "off"), _run(bodies, "emulate")
    _assert_same(plain, graphs)
    assert counted.replays > 0
    status, body = graphs[0][-1]
    assert status == 422 and b"modified by an inplace operation" in body, body


def test_an_id_in_use_answers_the_plain_error_and_leaves_the_plain_state(monkeypatch):
    reused = _step(10)
    reused["steps"][0]["id"] = "w"  # the put's id is the session's w: 409 at that step
    bodies = [_SETUP, *[_step(n) for n in range(6)], reused, _step(11)]
    counted = Replays(monkeypatch)
    plain, graphs = _run(bodies, "off"), _run(bodies, "emulate")
    _assert_same(plain, graphs)
    assert plain[0][-2][0] == 409 and counted.replays > 0


def test_a_capture_counts_its_tensors_until_it_goes(monkeypatch):
    """While a capture lives its tensors count to the session; once its captures are released the
    session's bytes are the plain path's, to the byte."""
    bodies = [_SETUP, *[_step(n) for n in range(8)]]
    plain, graphs = _run(bodies, "off"), _run(bodies, "emulate")
    session = graphs[2]
    assert session.bytes_held > plain[2].bytes_held
    for entry in session.caches.graphs.values():
        entry.release(session)
    assert session.bytes_held == plain[2].bytes_held == session.storages.counted()


def test_a_session_forgets_its_least_recent_signatures(monkeypatch):
    monkeypatch.setattr(graph_steps, "GRAPHS_PER_SESSION", 1)
    other = [{**_step(n), "steps": [s for s in _step(n)["steps"] if s["kind"] != "fetch"]} for n in range(20, 26)]
    bodies = [_SETUP, *[_step(n) for n in range(5)], *other, *[_step(n) for n in range(5, 10)]]
    plain, graphs = _run(bodies, "off"), _run(bodies, "emulate")
    _assert_same(plain, graphs)
    session = graphs[2]
    assert len(session.caches.graphs) == 1
    for entry in session.caches.graphs.values():
        entry.release(session)
    assert session.bytes_held == plain[2].bytes_held


def test_the_setting_is_checked_when_the_server_starts():
    with pytest.raises(ValueError, match="REMOTE_AUTOGRAD_CUDA_GRAPHS='yes'"):
        create_app(Settings.from_env({"REMOTE_AUTOGRAD_CUDA_GRAPHS": "yes"}))


# -- the stand-in itself ------------------------------------------------------------------------


def test_recorded_graph_keeps_a_cuda_graphs_rules():
    w = torch.ones(3)
    graph = RecordedGraph()
    with graph.capturing():
        w.add_(1)  # recorded, not run
        made = w * 2  # a tensor the capture made
    assert torch.equal(w, torch.ones(3))
    graph.replay()
    assert torch.equal(w, torch.full((3,), 2.0)) and torch.equal(made, torch.full((3,), 4.0))
    graph.replay()  # the same kernels again, on the same tensors
    assert torch.equal(w, torch.full((3,), 3.0)) and torch.equal(made, torch.full((3,), 6.0))
    xs = [torch.ones(2), torch.ones(2)]
    listed = RecordedGraph()
    with listed.capturing():
        torch._foreach_add_(xs, 1.0)
        sums = torch._foreach_add(xs, xs)  # a list returned: every tensor of it rewritten by a replay
    listed.replay()
    assert all(torch.equal(t, torch.full((2,), 4.0)) for t in sums)
    with pytest.raises(RuntimeError, match="read on the host"):
        with RecordedGraph().capturing():
            w.sum().item()
