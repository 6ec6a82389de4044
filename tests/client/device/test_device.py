"""``remote`` is a torch device: the same training code, given ``sess.device`` instead of ``"cpu"``,
gives torch's results. Each training function below has no SDK call; the device is the only
difference between the two runs."""

from __future__ import annotations

import io
from typing import Iterator

import httpx
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from remote_autograd import client
from remote_autograd.proto import decode_body
from remote_autograd.proto.codec import is_frames, unpack_frames
from ...bits import fit, torch_copies


class ProgramRecorder(httpx.BaseTransport):
    """The in-process transport, keeping every program the SDK sends (``bodies``) and its steps
    (``programs``): what a test asserts was sent, seen where the bytes leave the client rather than
    by patching it."""

    def __init__(self) -> None:
        self.inner = client.InProcessTransport()
        self.programs: list[list[dict]] = []
        self.bodies: list[dict] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "POST" and request.url.path.endswith("/programs"):
            body, kind = request.read(), request.headers.get("content-type")
            program = unpack_frames(body) if is_frames(kind) else decode_body(body, kind)
            self.bodies.append(program)
            self.programs.append(program["steps"])
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()

    def puts(self) -> list[dict]:
        return [step for steps in self.programs for step in steps if step["kind"] == "put"]


@pytest.fixture
def recorded() -> Iterator[tuple[client.Session, ProgramRecorder]]:
    """A session whose programs are recorded, on an in-process server."""
    recorder = ProgramRecorder()
    with client.connect(transport=recorder) as sess:
        yield sess, recorder


# -- the device itself ---------------------------------------------------------------------------


def test_session_device_is_a_torch_device_with_one_index_per_open_session(server_url):
    with client.connect(server_url) as a, client.connect(server_url) as b:
        assert a.device.type == "remote" and b.device.type == "remote" and a.device != b.device
        x = torch.zeros(2, 3, device=a.device)
        before = a.requests
        assert x.device == a.device and str(x.device) == str(a.device)
        assert not (x.is_cuda or x.is_cpu or x.is_xpu or x.is_mps or x.is_meta or x.is_mkldnn or x.is_sparse)
        assert x.is_remote
        assert a.requests == before, "device questions are answered locally"
        index = b.device.index
    with client.connect(server_url) as c:
        assert c.device.index <= index, "a closed session's index is free again"


FACTORIES = {
    "zeros": lambda d: torch.zeros(2, 3, device=d),
    "ones": lambda d: torch.ones((4,), dtype=torch.float64, device=d),
    "empty-shape": lambda d: torch.empty(2, 5, device=d).shape,
    "full": lambda d: torch.full((2, 2), 7, device=d),
    "arange": lambda d: torch.arange(1, 10, 2, device=d),
    "linspace": lambda d: torch.linspace(0, 1, 5, device=d),
    "eye": lambda d: torch.eye(3, 4, device=d),
    "tensor": lambda d: torch.tensor([[1, 2], [3, 4]], device=d),
    "rand": lambda d: torch.rand(3, 2, device=d),
    "randn": lambda d: torch.randn(5, device=d),
    "randint": lambda d: torch.randint(0, 9, (6,), device=d),
    "randperm": lambda d: torch.randperm(7, device=d),
    "zeros_like-local": lambda d: torch.zeros_like(torch.ones(2, 2), device=d),
    "new_zeros": lambda d: torch.ones(2, dtype=torch.float64, device=d).new_zeros(3, 1),
    "new_ones": lambda d: torch.ones(2, device=d).new_ones((2, 2)),
    "new_full": lambda d: torch.ones(2, device=d).new_full((3,), 2.5),
    "new_empty-shape": lambda d: torch.ones(2, device=d).new_empty(4, 2).shape,
    "new_tensor": lambda d: torch.ones(2, dtype=torch.int32, device=d).new_tensor([5, 6]),
    "randn_like": lambda d: torch.randn_like(torch.zeros(3, device=d)),
}


@pytest.mark.parametrize("name", list(FACTORIES))
def test_factories_on_the_device_match_torch(sess, name):
    torch.manual_seed(3)  # seeds the local generator and every open session's, as for CUDA
    want = FACTORIES[name]("cpu")
    torch.manual_seed(3)
    got = FACTORIES[name](sess.device)
    if isinstance(want, torch.Size):
        assert got == want
        return
    assert isinstance(got, client.RemoteTensor) and got.device == sess.device
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got.cpu(), want)


def test_factory_with_requires_grad_is_a_leaf_that_gets_its_grad(sess):
    w = torch.zeros(3, device=sess.device, requires_grad=True)
    v = torch.tensor([1.0, 2.0, 3.0], device=sess.device, requires_grad=True)
    assert w.requires_grad and w.is_leaf and v.requires_grad
    (w * v).sum().backward()
    assert torch.equal(w.grad.cpu(), torch.tensor([1.0, 2.0, 3.0]))
    assert torch.equal(v.grad.cpu(), torch.zeros(3))


def test_moves_to_and_from_the_device(sess):
    d = sess.device
    t = torch.arange(6.0).reshape(2, 3)
    assert torch.equal(t.to(d).cpu(), t)
    assert t.to(d, torch.float64).dtype == torch.float64
    assert torch.equal(t.to(d, non_blocking=True).to("cpu"), t)
    r = t.to(d)
    assert r.to(d) is r and r.to(r) is r
    back = r.to("cpu", torch.float64)
    assert type(back) is torch.Tensor and back.dtype == torch.float64 and torch.equal(back, t.double())
    assert torch.equal(torch.tensor(5.0, device=d).cpu(), torch.tensor(5.0))


def test_a_batch_moved_to_the_device_is_copied_without_torchs_thread_pool(sess):
    """``x.to(device)`` of a 200 KB batch (a frame of its own) keeps a private copy until its program
    is sent: numpy makes it, not a torch kernel, whose intra-op threads would spin afterwards on the
    cores a server beside this client needs (``proto/codec.py``, ``service/openmp_wait.py``). The
    copy is the move's: the batch changed before the program goes out is not what arrives."""
    x = torch.randn(64, 784)
    want = x.clone()
    with torch_copies() as copies:
        r = x.to(sess.device)
    x.fill_(0)
    assert not copies
    assert torch.equal(r.cpu(), want)


# -- one training function, two devices -----------------------------------------------------------


def _mlp():
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))


def _cnn():
    # No conv bias before BatchNorm (as real CNNs do): its true gradient is zero, and Adam would turn
    # the rounding noise standing in for it into full-size steps of either sign.
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(4 * 2 * 2, 3))


def _data(model_fn, device):
    g = torch.Generator().manual_seed(1)
    shape = (16, 8) if model_fn is _mlp else (16, 1, 4, 4)
    return torch.randn(*shape, generator=g).to(device), torch.randint(0, 3, (16,), generator=g).to(device)


def _fit(model, opt, X, Y, steps):
    losses = fit(model, opt, F.cross_entropy, X, Y, steps)
    return losses, {k: v.cpu() for k, v in model.state_dict().items()}


def train_built_on(model_fn, device, steps=4):
    """Built inside ``with torch.device(device)``: parameters are created (and initialised) there."""
    torch.manual_seed(0)
    with torch.device(device):
        model = model_fn()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return _fit(model, opt, *_data(model_fn, device), steps)


def train_moved_to(model_fn, device, steps=4):
    """Built locally, optimizer created BEFORE ``model.to(device)``: it must see the moved parameters."""
    torch.manual_seed(0)
    model = model_fn()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model.to(device)
    return _fit(model, opt, *_data(model_fn, device), steps)


def _assert_same_run(got, want):
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
    assert got[1].keys() == want[1].keys()
    for k in want[1]:
        torch.testing.assert_close(got[1][k], want[1][k], rtol=1e-5, atol=1e-6, msg=k)


@pytest.mark.parametrize("model_fn", [_mlp, _cnn], ids=["mlp", "cnn"])
@pytest.mark.parametrize("train", [train_built_on, train_moved_to],
                         ids=["built-under-torch-device", "moved-with-an-optimizer-made-before"])
def test_a_model_trains_like_cpu(sess, model_fn, train):
    _assert_same_run(train(model_fn, sess.device), train(model_fn, "cpu"))


def test_a_module_built_under_torch_device_uploads_nothing(recorded):
    sess, recorder = recorded
    torch.manual_seed(0)
    with torch.device(sess.device):
        model = _cnn()
    sess.sync()
    # Only BatchNorm's `torch.tensor(0)` (num_batches_tracked) is data from the client: a literal.
    assert [p["value"]["shape"] for p in recorder.puts()] == [[]], "parameters are created on the server, not uploaded"
    assert all(p.device == sess.device for p in model.parameters())
    assert all(b.device == sess.device for b in model.buffers())


def test_module_to_keeps_the_parameter_objects_and_moves_them_in_one_program(recorded):
    sess, recorder = recorded
    torch.manual_seed(0)
    model = _cnn()
    before = [id(p) for p in model.parameters()]
    model.layer_grad = None
    model[0].weight.grad = torch.ones_like(model[0].weight)
    recorder.programs.clear()
    model.to(sess.device)
    sess.sync()
    assert len(recorder.programs) == 1
    puts = recorder.puts()
    assert [id(p) for p in model.parameters()] == before
    assert all(isinstance(p, nn.Parameter) and p.requires_grad and p.device == sess.device
               for p in model.parameters())
    assert len(puts) == len(list(model.parameters())) + len(list(model.buffers()))
    assert torch.equal(model[0].weight.grad.cpu(), torch.ones(4, 1, 3, 3)), "a grad moves with its parameter"
    assert model.to(sess.device) is model and model[0].weight.device == sess.device
    model.cpu()
    assert [id(p) for p in model.parameters()] == before
    assert all(type(p) is nn.Parameter and p.device.type == "cpu" for p in model.parameters())
    assert torch.equal(model[0].weight.grad, torch.ones(4, 1, 3, 3))


def train_with_state_round_trip(device, steps=3):
    """Save the optimizer's state, load it into a fresh optimizer, go on: as checkpoint code does."""
    torch.manual_seed(0)
    model = _mlp().to(device)
    X, Y = _data(_mlp, device)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    losses = []
    for step in range(2 * steps):
        if step == steps:
            buf = io.BytesIO()
            torch.save(opt.state_dict(), buf)
            buf.seek(0)
            opt = torch.optim.Adam(model.parameters(), lr=0.01)
            opt.load_state_dict(torch.load(buf, weights_only=True))  # torch moves state to param.device
        opt.zero_grad()
        loss = F.cross_entropy(model(X), Y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    states = [v for s in opt.state.values() for k, v in s.items() if k != "step"]
    return losses, {k: v.cpu() for k, v in model.state_dict().items()}, {t.device for t in states}


def test_optimizer_state_dict_round_trip(sess):
    got, want = train_with_state_round_trip(sess.device), train_with_state_round_trip("cpu")
    _assert_same_run(got[:2], want[:2])
    assert got[2] == {sess.device}, "loaded optimizer state lives on the device"


class TinyGPTish(nn.Module):
    """Token and position embeddings, the nanoGPT idiom ``torch.arange(T, device=idx.device)``."""

    def __init__(self, vocab=11, block=8, dim=12):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(block, dim)
        self.ln, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.tok.weight  # weight tying

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.head(self.ln(self.tok(idx) + self.pos(pos)))


def train_gptish(device, steps=4, *, build_there=False):
    torch.manual_seed(0)
    if build_there:  # Embedding (normal_), LayerNorm (ones_/zeros_), Linear (kaiming_uniform_) on the server
        with torch.device(device):
            model = TinyGPTish()
    else:
        model = TinyGPTish().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
    g = torch.Generator().manual_seed(2)
    data = torch.randint(0, 11, (4, 9), generator=g).to(device)
    x, y = data[:, :-1], data[:, 1:]
    losses = []
    for _ in range(steps):
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    return losses, {k: v.cpu() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("build_there", [False, True], ids=["moved", "built-there"])
def test_nanogpt_arange_idiom_and_weight_tying(sess, build_there):
    _assert_same_run(train_gptish(sess.device, build_there=build_there), train_gptish("cpu", build_there=build_there))


def test_dtype_conversions_of_a_moved_module_keep_its_parameters(sess):
    model = _mlp().to(sess.device)
    params = list(model.parameters())
    model.double()
    assert list(model.parameters()) == params
    assert all(p.dtype == torch.float64 and p.device == sess.device and p.requires_grad for p in params)
    out = model(torch.ones(2, 8, dtype=torch.float64, device=sess.device))
    out.sum().backward()
    assert params[0].grad.dtype == torch.float64 and params[0].grad.shape == (16, 8)


def train_word_lm_style(device, steps=4, lr=0.5):
    """The word language model's update: ``p.data.add_(p.grad, alpha=-lr)``, hidden state from ``new_zeros``."""
    torch.manual_seed(0)
    emb, cell, out = nn.Embedding(7, 6), nn.Linear(12, 6), nn.Linear(6, 7)
    model = nn.ModuleList([emb, cell, out]).to(device)
    g = torch.Generator().manual_seed(4)
    seq = torch.randint(0, 7, (5, 3), generator=g).to(device)
    losses = []
    for _ in range(steps):
        model.zero_grad()
        h = emb.weight.new_zeros(3, 6)
        loss = 0.0
        for t in range(seq.shape[0] - 1):
            h = torch.tanh(cell(torch.cat([emb(seq[t]), h], dim=1)))
            loss = loss + F.cross_entropy(out(h), seq[t + 1])
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)
        losses.append(loss.item())
    return losses, {k: v.cpu() for k, v in model.state_dict().items()}


def test_word_lm_data_add_update(sess):
    _assert_same_run(train_word_lm_style(sess.device), train_word_lm_style("cpu"))


def test_sess_module_is_module_to_device(sess):
    model = _mlp()
    params = list(model.parameters())
    assert sess.module(model) is model
    assert list(model.parameters()) == params and all(p.device == sess.device for p in params)
    sd = model.state_dict()
    assert all(v.device == sess.device for v in sd.values()), "state_dict keeps the device, as torch's does"
    local = _mlp()
    local.load_state_dict(sd)  # a remote state into a local model, as a CUDA one loads into a CPU model
    for k, v in local.state_dict().items():
        assert type(v) is torch.Tensor and torch.equal(v, sd[k].cpu())


def test_a_module_trained_locally_first_moves_and_goes_on_like_cpu(sess):
    def run(device):
        torch.manual_seed(0)
        model = _mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        X, Y = _data(_mlp, "cpu")
        F.cross_entropy(model(X), Y).backward()  # local autograd has seen the parameters; grads are set
        opt.step()
        model.to(device)  # the grads move too; the optimizer keeps its parameters
        return _fit(model, opt, X.to(device), Y.to(device), 3)

    _assert_same_run(run(sess.device), run("cpu"))


def test_moving_a_module_back_frees_the_server_copies(sess):
    import gc

    model = _mlp().to(sess.device)
    assert sess.stats()["tensors"] == 4
    model.cpu()
    gc.collect()
    assert sess.stats()["tensors"] == 0


def test_dataloader_workers_seeding_themselves_leave_the_session_alone(sess):
    # Each worker calls torch.manual_seed; in a forked child that must not touch the parent's sessions.
    ds = torch.utils.data.TensorDataset(torch.arange(8.0).reshape(4, 2))
    sums = [b.to(sess.device).sum().item() for (b,) in torch.utils.data.DataLoader(ds, batch_size=2, num_workers=2)]
    assert sums == [6.0, 22.0]
