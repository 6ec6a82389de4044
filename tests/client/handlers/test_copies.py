"""``copy.deepcopy`` of remote tensors, modules, optimizers and state dicts (server-side clones, no
download), and ``torch.load(..., map_location=device)`` (storages uploaded once, tensors rebuilt on
them as torch rebuilds them): against what torch gives for the same objects."""

from __future__ import annotations

import copy
import io

import pytest
import torch
from torch import nn

from remote_autograd import client
from remote_autograd.client import _core

from ..device.test_device import recorded  # noqa: F401  (a fixture: a session whose programs are recorded)


def _same(remote: torch.Tensor, local: torch.Tensor, what: str) -> None:
    assert isinstance(remote, client.RemoteTensor), what
    assert remote.dtype == local.dtype and remote.shape == local.shape and remote.stride() == local.stride(), what
    assert remote.requires_grad == local.requires_grad and remote.is_leaf == local.is_leaf, what
    assert isinstance(remote, nn.Parameter) == isinstance(local, nn.Parameter), what
    assert torch.equal(remote.detach().cpu(), local.detach()), what


def test_a_deepcopy_copies_none_of_the_handles_own_fields(sess):
    """Fields a handle sets itself (views, grads, versions) are the handle's, never copied to the copy:
    HANDLE_FIELDS names them all (most are class defaults until a handle sets its own)."""
    x = sess.tensor(torch.randn(4, 3), requires_grad=True)
    view = x.t()
    (view * 2).sum().backward()
    x.grad.zero_()
    view.retain_grad()
    x.tag = "the user's"
    assert {"_storage", "_view_of", "_strides", "_grad_cache", "_meta_t"} <= set(vars(view)) | set(vars(x))
    for t in (x, view):
        assert set(vars(t)) - _core.HANDLE_FIELDS <= {"tag"}
    with torch.no_grad():
        y = copy.deepcopy(view.detach())
    assert y._storage is None and y._view_of is None and copy.deepcopy(x).tag == "the user's"


def test_deepcopy_of_tensors_keeps_what_torch_keeps_and_downloads_nothing(recorded):  # noqa: F811
    sess, recorder = recorded
    t = torch.arange(6.0).reshape(3, 2).requires_grad_()
    (t * 2).sum().backward()
    t.tag = {"kind": "weight"}
    p = nn.Parameter(torch.ones(3))
    p.grad, p.tag = torch.ones(3), "dropped"
    x = t.detach().to(sess.device).requires_grad_()
    x.grad, x.tag = t.grad.to(sess.device), t.tag
    q = nn.Parameter(torch.ones(3, device=sess.device))
    q.grad, q.tag = torch.ones(3, device=sess.device), "dropped"
    sess.sync()
    before = len(recorder.programs)
    want, got = copy.deepcopy([t, t, p]), copy.deepcopy([x, x, q])
    assert len(recorder.programs) == before, "queued: no request"
    assert got[0] is got[1] and want[0] is want[1], "one object, one copy (deepcopy's memo)"
    for g, w, what in zip(got, want, ("tensor", "tensor", "parameter")):
        _same(g, w, what)
        assert (g.grad is None) == (w.grad is None), what  # Parameter.__deepcopy__ copies no grad
        assert getattr(g, "tag", None) == getattr(w, "tag", None), what
    assert torch.equal(got[0].grad.cpu(), want[0].grad) and got[0].tag is not x.tag
    with torch.no_grad():
        got[0].add_(1)  # a copy: the original is untouched
    assert torch.equal(x.detach().cpu(), t.detach())


def test_deepcopy_of_a_non_leaf_is_refused_as_torch_refuses_it(sess):
    with pytest.raises(RuntimeError, match="Only Tensors created explicitly by the user"):
        copy.deepcopy(torch.ones(2, device=sess.device, requires_grad=True) * 2)


def test_deepcopy_of_a_module_and_its_optimizer_trains_on_as_the_original_would(sess):
    def run(device):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4)).to(device)
        model.register_buffer("scale", torch.full((4,), 0.5).to(device))  # a plain tensor too
        opt = torch.optim.Adam(model.parameters(), lr=0.1)
        x = torch.randn(5, 4).to(device)
        for _ in range(2):
            opt.zero_grad()
            (model(x) * model.scale).pow(2).mean().backward()
            opt.step()
        twin, twin_opt = copy.deepcopy((model, opt))
        states = copy.deepcopy(opt.state_dict())
        for m, o in ((model, opt), (twin, twin_opt)):
            o.zero_grad()
            (m(x) * m.scale).pow(2).mean().backward()
            o.step()
        return ([v.cpu() for v in model.state_dict().values()], [v.cpu() for v in twin.state_dict().values()],
                [v.cpu() for s in states["state"].values() for v in s.values()])

    got, want = run(sess.device), run("cpu")
    for g, w in zip(got, want):
        assert len(g) == len(w)
        for a, b in zip(g, w):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert all(torch.equal(a, b) for a, b in zip(got[0], got[1])), "the copy trained exactly as the original"


def _checkpoint() -> dict:
    base = torch.arange(12.0).reshape(3, 4)
    return {"base": base, "view": base[1:, ::2], "t": base.t(), "ints": torch.arange(5, dtype=torch.int16),
            "bf16": torch.ones(2, dtype=torch.bfloat16), "param": nn.Parameter(torch.ones(2)),
            "scalar": torch.tensor(3.5, dtype=torch.float64), "empty": torch.zeros(0, 3), "steps": [1, 2]}


@pytest.mark.parametrize("spelling", ["device", "string", "dict"])
def test_torch_load_to_the_device_rebuilds_each_tensor_as_torch_does(sess, spelling):
    saved = _checkpoint()
    buf = io.BytesIO()
    torch.save(saved, buf)
    buf.seek(0)
    map_location = {"device": sess.device, "string": str(sess.device), "dict": {"cpu": str(sess.device)}}[spelling]
    got = torch.load(buf, map_location=map_location)
    want = torch.load(io.BytesIO(buf.getvalue()))
    assert got["steps"] == [1, 2]
    for name in saved:
        if name != "steps":
            _same(got[name], want[name], name)
            assert got[name].device == sess.device and got[name]._version == want[name]._version, name
    got["base"].add_(100)  # tensors of one storage share memory on the server, as torch's do
    want["base"].add_(100)
    for name in ("view", "t"):
        assert torch.equal(got[name].cpu(), want[name]), name


def test_torch_load_of_a_whole_module_puts_its_parameters_on_the_device(sess):
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    loaded = torch.load(buf, map_location=sess.device, weights_only=False)
    assert all(isinstance(p, nn.Parameter) and p.device == sess.device and p.requires_grad
               for p in loaded.parameters())
    x = torch.randn(4, 3)
    torch.testing.assert_close(loaded(x.to(sess.device)).cpu().detach(), model(x).detach())


def test_torch_load_to_a_closed_session_is_a_clear_error(server_url):
    buf = io.BytesIO()
    torch.save({"w": torch.ones(2)}, buf)
    with client.connect(server_url) as sess:
        device = sess.device
    buf.seek(0)
    with pytest.raises(RuntimeError, match="not an open remote-autograd session"):
        torch.load(buf, map_location=device)
