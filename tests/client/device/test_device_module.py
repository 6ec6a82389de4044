"""``torch.remote`` answers what torch asks of a device, as ``torch.cuda`` does; importing the SDK
leaves local code as it was (the test process has imported it; a child process that has not is
the reference); remote tensors print, ``new``, ``in``, ``type_as`` and ``.cuda()`` as torch's."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import pytest
import torch

from remote_autograd import client

# -- the session's generator -----------------------------------------------------------------------


def test_rng_state_is_the_sessions_generator_state_as_torch_gives_it(sess):
    torch.manual_seed(5)  # seeds the local generator and the session's, as it seeds CUDA's
    state = torch.remote.get_rng_state(sess.device)
    assert type(state) is torch.Tensor and state.dtype == torch.uint8 and state.device.type == "cpu"
    if sess.remote_device == "cpu":  # the server's generator is a CPU one: torch's own layout, byte for byte
        assert torch.equal(state, torch.get_rng_state())
    first = torch.randn(4, device=sess.device).cpu()
    torch.remote.set_rng_state(state, sess.device)
    assert torch.equal(torch.randn(4, device=sess.device).cpu(), first)
    assert [s.shape for s in torch.remote.get_rng_state_all()][sess.device.index] == state.shape


def test_fork_rng_on_the_remote_device_restores_the_sessions_generator(sess):
    def draws(fork: dict | None):
        torch.manual_seed(0)
        before = torch.randn(3, device=sess.device).cpu()
        if fork is None:
            return before, torch.randn(3, device=sess.device).cpu()
        with torch.random.fork_rng(**fork):
            torch.randn(5, device=sess.device)  # drawn inside: forgotten at the end
        return before, torch.randn(3, device=sess.device).cpu()

    want = draws(None)
    for fork in ({"device_type": "remote"}, {"device_type": "remote", "devices": [sess.device]}, {}):
        got = draws(fork)  # fork_rng() without a type forks torch's current accelerator: remote
        assert all(torch.equal(g, w) for g, w in zip(got, want)), fork


def test_manual_seed_of_the_device_module_seeds_the_current_devices_session(server_url):
    with client.connect(server_url) as sess:
        if sess.device.index != 0:
            pytest.skip("another session holds remote:0")
        draws = []
        for seed in (torch.remote.manual_seed, sess.manual_seed, torch.remote.manual_seed):
            seed(7 if len(draws) < 2 else 8)
            draws.append(torch.randn(3, device=sess.device).cpu())
    assert torch.equal(draws[0], draws[1]) and not torch.equal(draws[0], draws[2])


def test_a_bad_state_is_refused_and_the_generator_is_untouched(sess):
    torch.manual_seed(1)
    want = torch.randn(3, generator=torch.Generator().manual_seed(1))
    with pytest.raises(TypeError, match="expected a torch.ByteTensor"):
        torch.remote.set_rng_state(torch.zeros(4), sess.device)
    torch.remote.set_rng_state(torch.zeros(3, dtype=torch.uint8), sess.device)
    with pytest.raises(client.RemoteError) as info:
        sess.sync()
    assert info.value.status == 422
    assert torch.equal(torch.randn(3, device=sess.device).cpu(), want)


def test_a_closed_sessions_index_is_a_clear_error(server_url):
    with client.connect(server_url) as sess:
        device = sess.device
    with pytest.raises(RuntimeError, match="not an open remote-autograd session"):
        torch.remote.get_rng_state(device)


# -- local code is left alone ----------------------------------------------------------------------

# What a CPU-only program observes of DataLoader(pin_memory=True), fork_rng() and torch.accelerator.
LOCAL_PROGRAM = r"""
import json, sys, warnings
import torch
if sys.argv[1] == "sdk":
    from remote_autograd import client
    sess = client.connect(transport=client.InProcessTransport())  # a session open beside the local code
seen = {}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    ds = torch.utils.data.TensorDataset(torch.arange(12.0).reshape(6, 2))
    batches = list(torch.utils.data.DataLoader(ds, batch_size=4, pin_memory=True))
seen["batches"] = [b.tolist() for (b,) in batches]
seen["pinned"] = [b.is_pinned() for (b,) in batches]
seen["warnings"] = sorted({str(w.message) for w in caught})
torch.manual_seed(0)
with torch.random.fork_rng():
    torch.randn(5)
seen["after_fork"] = torch.randn(3).tolist()
seen["accelerator_available"] = torch.accelerator.is_available()
print(json.dumps(seen))
"""


def _observed(which: str) -> dict:
    done = subprocess.run([sys.executable, "-c", LOCAL_PROGRAM, which], capture_output=True, text=True, timeout=120,
                          check=True)
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.slow  # a process of its own, with a DataLoader's workers
def test_a_cpu_dataloader_pinning_memory_and_fork_rng_behave_as_without_the_sdk():
    without = _observed("plain")
    with_sdk = _observed("sdk")
    if torch.cuda.is_available():  # torch makes a registered PrivateUse1 backend the accelerator: no CUDA pinning
        for seen in (without, with_sdk):
            seen.pop("pinned"), seen.pop("warnings"), seen.pop("accelerator_available")
    assert with_sdk == without


# -- printing and small Tensor methods -------------------------------------------------------------


PRINTED = {  # what torch prints for these on a CUDA device, with cuda:0 for {device}
    "float": (lambda: torch.arange(3.0), "tensor([0., 1., 2.], device='{device}')"),
    "empty-int32": (lambda: torch.zeros(0, 3, dtype=torch.int32),
                    "tensor([], device='{device}', size=(0, 3), dtype=torch.int32)"),
    "empty": (lambda: torch.zeros(0), "tensor([], device='{device}')"),
    "0d-int": (lambda: torch.tensor(5), "tensor(5, device='{device}')"),
    "half": (lambda: torch.ones(2, dtype=torch.float16), "tensor([1., 1.], device='{device}', dtype=torch.float16)"),
    "bool": (lambda: torch.tensor([True, False]), "tensor([ True, False], device='{device}')"),
    "double": (lambda: torch.tensor([0.5, 2.0], dtype=torch.float64),
               "tensor([0.5000, 2.0000], device='{device}', dtype=torch.float64)"),
}


@pytest.mark.parametrize("name", list(PRINTED))
def test_a_remote_tensor_prints_as_torch_prints_a_cuda_one(sess, name):
    make, text = PRINTED[name]
    x = make().to(sess.device)
    assert repr(x) == str(x) == text.format(device=sess.device)


@pytest.mark.parametrize("make", [lambda: torch.randn(3, 30), lambda: torch.randn(2000)], ids=["wrapped", "summarised"])
def test_a_long_remote_tensor_prints_torchs_lines_and_the_device_on_a_line_of_its_own(sess, make):
    t = make()
    assert repr(t.to(sess.device)) == repr(t)[:-1] + f",\n       device='{sess.device}')"


def test_grad_suffixes_and_parameters_print_as_torch(sess):
    w = torch.ones(2, device=sess.device, requires_grad=True)
    assert repr(w) == f"tensor([1., 1.], device='{sess.device}', requires_grad=True)"
    assert repr(w * 2) == f"tensor([2., 2.], device='{sess.device}', grad_fn=<RemoteBackward>)"
    p = torch.nn.Parameter(torch.ones(2, device=sess.device))
    assert repr(p) == f"Parameter containing:\ntensor([1., 1.], device='{sess.device}', requires_grad=True)"


def test_tensor_new_follows_torchs_legacy_constructor(sess):
    t = torch.ones(2, dtype=torch.float64)
    x = t.to(sess.device)
    for args in ((), (2, 3), (torch.Size([4]),), ([1, 2],), ((5, 6),), ([[1, 2], [3, 4]],)):
        got, want = x.new(*args), t.new(*args)
        assert got.device == sess.device and got.dtype == want.dtype and got.shape == want.shape, args
        if want.numel() and args and not isinstance(args[0], (int, torch.Size)):
            assert torch.equal(got.cpu(), want), args
    other = torch.arange(3.0, dtype=torch.float64).to(sess.device)
    assert torch.equal(x.new(other).cpu(), other.cpu())
    with pytest.raises(TypeError, match="expected a tensor of dtype torch.float64"):
        x.new(torch.arange(3).to(sess.device))


def test_contains_and_type_as_answer_as_torch(sess):
    t = torch.arange(4.0)
    x = t.to(sess.device)
    for element in (2.0, 7, torch.tensor(3.0), torch.tensor([9.0]), torch.tensor([1.0])):
        remote = element.to(sess.device) if isinstance(element, torch.Tensor) and element.dim() else element
        assert (remote in x) == (element in t), element
    with pytest.raises(RuntimeError, match="only supports Tensor or scalar"):
        "a" in x  # noqa: B015
    as_int = x.type_as(torch.zeros(1, dtype=torch.int32).to(sess.device))
    assert as_int.device == sess.device and as_int.dtype == torch.int32 and torch.equal(as_int.cpu(), t.int())
    local = x.type_as(torch.zeros(1, dtype=torch.float64))  # torch: self.type(other.type()), a move to the CPU
    assert type(local) is torch.Tensor and local.dtype == torch.float64 and torch.equal(local, t.double())


def test_cuda_says_to_use_the_sessions_device(sess):
    x = torch.ones(2).to(sess.device)
    with pytest.raises(RuntimeError, match=r"Use `device = sess.device`"):
        x.cuda()
    model = torch.nn.Linear(2, 2).to(sess.device)
    with pytest.raises(RuntimeError, match="sess.device"):
        model.cuda()


def test_the_device_module_is_not_an_accelerator_torch_can_pin_or_sync_for(sess):
    assert torch.accelerator.current_accelerator().type == "remote"  # torch's choice once PrivateUse1 is named
    assert not torch.accelerator.is_available() and not torch.remote.is_available()
    assert torch.remote.device_count() > sess.device.index
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.random.fork_rng(devices=[]):  # nothing to fork: no request
            before = sess.requests
        assert sess.requests == before
