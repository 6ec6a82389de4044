"""The client's process-global torch settings travel with its programs (``proto/torch_globals.py``),
and anomaly detection holds on the server: each case used to differ from torch without a word.

The server runs in another process (``server_url``: sessions in it, or in a tenant's worker): one
in this process would share the settings and hide every difference.
"""

from __future__ import annotations

import inspect
import threading
import warnings

import pytest
import torch
from torch import nn

from remote_autograd import client
from remote_autograd.proto import DTYPES, torch_globals
from remote_autograd.proto.messages import TorchGlobals

from ..servers import api, call, put, ref

pytestmark = [pytest.mark.backends("inprocess", "tenants"),
              pytest.mark.filterwarnings("ignore:Anomaly Detection has been enabled"),
              pytest.mark.filterwarnings("ignore:Error detected in")]


@pytest.fixture(autouse=True)
def _torchs_defaults_after():
    before, anomaly = torch_globals.read(), (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled())
    yield
    torch_globals.apply(before)
    torch.set_anomaly_enabled(*anomaly)


def _line(offset: int = 0) -> str:
    """``file:line`` of the caller's line (plus ``offset``), as errors name it."""
    frame = inspect.currentframe().f_back
    return f"{frame.f_code.co_filename}:{frame.f_lineno + offset}"


def _made_under_float64(device) -> dict[str, torch.Tensor]:
    return {"zeros": torch.zeros(3, device=device), "full": torch.full((2,), 1 / 3, device=device),
            "upload": torch.tensor([1 / 3]).to(device), "sqrt": torch.arange(4, device=device).sqrt(),
            "scaled": torch.arange(3, device=device) * (1 / 3), "true_divide": torch.arange(3, device=device) / 3,
            "linspace": torch.linspace(0, 1, 7, device=device)}


@pytest.mark.backends("inprocess", "tenants", "ray")  # the worker actors run programs too
def test_the_default_dtype_travels_with_the_program(sess):
    """``torch.set_default_dtype(torch.float64)`` after ``connect()``: the client said float64 and the
    server held float32 (``.cpu()`` answered float32)."""
    torch.set_default_dtype(torch.float64)
    remote, local = _made_under_float64(sess.device), _made_under_float64("cpu")
    drawn = torch.randn(2, device=sess.device)
    for name, t in remote.items():
        assert t.dtype == torch.float64 and torch.equal(t.cpu(), local[name]), name
    assert drawn.dtype == drawn.cpu().dtype == torch.float64
    w = torch.arange(3, device=sess.device).sqrt().requires_grad_()
    (w * (1 / 3)).sum().backward()
    assert w.grad.cpu().dtype == torch.float64 and torch.equal(w.grad.cpu(), torch.full((3,), 1 / 3))


def test_a_default_dtype_changed_between_queued_ops_gives_each_its_own(sess):
    """The queue is sent when the default dtype changes: each program runs under the dtype its ops were
    inferred under."""
    a = torch.arange(2, device=sess.device).sqrt()
    torch.set_default_dtype(torch.float64)
    b = torch.arange(2, device=sess.device).sqrt()
    torch.set_default_dtype(torch.float32)
    assert (a.dtype, b.dtype) == (torch.float32, torch.float64)
    assert (a.cpu().dtype, b.cpu().dtype) == (torch.float32, torch.float64)


def test_deterministic_algorithms_travel_with_the_program(sess):
    """``torch.use_deterministic_algorithms(True)``: an op without a deterministic kernel raises torch's
    error, and ``empty`` memory is what torch fills it with; the server ignored both."""
    idx, src = torch.tensor([1, 1], device=sess.device), torch.tensor([1.0, 2.0], device=sess.device)
    torch.use_deterministic_algorithms(True)
    z = torch.zeros(4, device=sess.device)
    line = _line(1)
    z.put_(idx, src)
    with pytest.raises(client.RemoteError, match="put_ does not have a deterministic implementation") as raised:
        sess.sync()
    assert raised.value.where == line
    assert torch.isnan(torch.empty(3, device=sess.device).cpu()).all()
    assert torch.isnan(torch.empty_like(z).cpu()).all()
    torch.use_deterministic_algorithms(True, warn_only=True)
    z.put_(idx, src)  # torch warns (on the server) and runs it
    assert z.cpu()[1].item() in (1.0, 2.0)
    torch.use_deterministic_algorithms(False)
    assert not torch.empty(3, device=sess.device).cpu().any()  # zeroed, as every session's memory otherwise


def test_every_setting_reaches_the_server(sess):
    """What the server's torch holds while the step runs (a test-only op reads it), setting by setting."""
    want = (torch.float64, True, True, False, "medium", False, True, True)  # none of them torch's default
    # as torch.set_default_dtype, use_deterministic_algorithms(..., warn_only=True), fill_uninitialized_memory,
    # set_float32_matmul_precision and cudnn's flags set them (torch's own test helpers, imported by other
    # tests of this process, forbid setting cudnn's flags but through its flags() context manager)
    torch_globals.apply(want)
    got = sess.ops._test_torch_globals().tolist()
    precisions = TorchGlobals.model_fields["float32_matmul_precision"].annotation.__args__
    assert (list(DTYPES)[got[0]], *map(bool, got[1:4]), precisions[got[4]], *map(bool, got[5:])) == \
        ("float64", *want[1:])
    torch_globals.apply(torch_globals.DEFAULT)
    assert sess.ops._test_torch_globals().tolist() == [2, 0, 0, 1, 0, 1, 0, 0]  # back to torch's


def test_a_setting_changed_while_steps_are_queued_fails_them_loudly(sess):
    """A program runs under one state: steps queued on both sides of a change cannot run as torch would."""
    first = _line(1)
    x = torch.ones(2, device=sess.device)
    y = x * 2
    torch.use_deterministic_algorithms(True)
    with pytest.raises(client.RemoteError, match="torch.use_deterministic_algorithms changed while steps were queued "
                       f"for the server \\(from {first} on\\)"):
        y.cpu()
    with pytest.raises(client.RemoteError):  # never ran: used, it raises
        y + 1
    assert torch.equal((torch.ones(2, device=sess.device) * 2).cpu(), torch.full((2,), 2.0))


def test_the_per_backend_fp32_precision_api_is_refused_where_it_is_met(sess):
    """torch cannot report it as ``set_float32_matmul_precision`` would: the SDK says which calls work."""
    x = torch.ones(2, device=sess.device)
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    with pytest.raises(client.RemoteError, match="per-backend fp32_precision API was used"):
        (x * 2).cpu()  # queued before: the program fails, its steps with it
    line = _line(2)
    with pytest.raises(RuntimeError, match="Set it with torch.set_float32_matmul_precision") as raised:
        torch.ones(2, device=sess.device)
    assert raised.traceback[0].lineno + 1 == int(line.rsplit(":", 1)[1])


def _nan_backward(device):
    w = torch.tensor([-1.0, 4.0], device=device, requires_grad=True)
    return w, w.sqrt().sum()  # sqrt(-1) is NaN, and so is its gradient


_SQRT = f"{__file__}:{_nan_backward.__code__.co_firstlineno + 2}"  # the forward call torch's traceback names


@pytest.mark.backends("inprocess", "tenants", "ray")  # the worker actors run programs too
def test_anomaly_detection_raises_torchs_error_and_names_the_forward_call(sess):
    """``torch.autograd.detect_anomaly()``: a backward whose gradient has a NaN raises torch's error; the
    server filled ``grad=[nan, 0.25]``."""
    w_local, loss_local = _nan_backward("cpu")
    with torch.autograd.detect_anomaly(), pytest.raises(RuntimeError) as torchs:
        loss_local.backward()
    with torch.autograd.detect_anomaly():
        w, loss = _nan_backward(sess.device)
        backward = _line(1)
        loss.backward()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with pytest.raises(client.RemoteError) as raised:
            read = _line(1)
            w.grad.cpu()
    assert raised.value.server_message == str(torchs.value)  # "Function 'SqrtBackward0' returned nan values ..."
    assert raised.value.where == backward and f"by the forward call Tensor.sqrt at {_SQRT}" in str(raised.value)
    assert [(str(s.message), f"{s.filename}:{s.lineno}") for s in seen if "Error detected" in str(s.message)] == \
        [("Error detected in SqrtBackward0. Traceback of forward call that caused the error:\n  Tensor.sqrt at "
          f"{_SQRT}", read)]
    assert w.grad is None  # the backward did not happen, as in torch


def test_anomaly_detection_around_the_backward_alone_is_honoured(sess):
    w, loss = _nan_backward(sess.device)
    with torch.autograd.detect_anomaly():
        loss.backward()
    with pytest.raises(client.RemoteError, match="returned nan values in its 0th output"):
        sess.sync()  # sent after the block: the check travelled with the backward step


def test_without_anomaly_detection_or_its_nan_check_the_nan_flows_as_in_torch(sess):
    for anomaly in (None, torch.autograd.detect_anomaly(check_nan=False)):
        w, loss = _nan_backward(sess.device)
        w_local, loss_local = _nan_backward("cpu")
        with anomaly or torch.enable_grad():
            loss.backward()
            loss_local.backward()
        torch.testing.assert_close(w.grad.cpu(), w_local.grad, equal_nan=True)


def test_anomaly_detection_names_the_forward_call_of_any_backward_error(sess):
    """torch's "modified by an inplace operation" under anomaly detection: the failing node's forward call."""
    x = torch.ones(3, device=sess.device, requires_grad=True)
    with torch.autograd.detect_anomaly():
        made = _line(1)
        y = x.exp()
        y.add_(1)
        y.sum().backward()
    with pytest.warns(UserWarning, match="Error detected in ExpBackward0"), \
            pytest.raises(client.RemoteError, match="modified by an inplace operation") as raised:
        sess.sync()
    assert f"ExpBackward0 was made by the forward call Tensor.exp at {made}" in str(raised.value)


def test_a_default_device_on_the_session_makes_factories_and_modules_there(sess):
    """``torch.set_default_device(sess.device)`` works as ``with torch.device(sess.device)``."""
    torch.manual_seed(0)
    local = nn.Linear(3, 2)
    torch.set_default_device(sess.device)
    try:
        made = [torch.ones(2), torch.tensor([1.0, 2.0]), torch.arange(3), torch.full((2,), 0.5)]
        torch.manual_seed(0)
        module = nn.Linear(3, 2)
    finally:
        torch.set_default_device(None)
    assert all(isinstance(t, client.RemoteTensor) for t in (*made, module.weight))
    assert [t.cpu().tolist() for t in made] == [[1.0, 1.0], [1.0, 2.0], [0, 1, 2], [0.5, 0.5]]
    assert module.weight.device == sess.device and torch.equal(module.weight.detach().cpu(), local.weight.detach())


def test_programs_with_other_settings_run_at_once_and_change_no_one_elses(server_url):
    """Two clients at once, over plain HTTP: one asks for float64, the other for torch's defaults."""
    def run(globals_: dict | None, dtypes: list) -> None:
        with api(server_url) as c:
            sid = c.post("/v1/sessions").json()["session_id"]
            for i in range(15):
                steps = [put("i", [1, 4], dtype="int64"), call("sqrt", ref("i"), out=["s"]),
                         {"kind": "fetch", "id": "s"}, {"kind": "free", "ids": ["i", "s"]}]
                body = {"id": f"p{i}", "steps": steps, **({"torch_globals": globals_} if globals_ else {})}
                answer = c.post(f"/v1/sessions/{sid}/programs", json=body).json()
                dtypes.append(answer["results"][2]["tensor"]["value"]["dtype"])

    wide, plain = [], []
    threads = [threading.Thread(target=run, args=({"default_dtype": "float64"}, wide)),
               threading.Thread(target=run, args=(None, plain))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert wide == ["float64"] * 15 and plain == ["float32"] * 15


def test_anomaly_detection_names_the_forward_call_in_an_eager_session(eager_sess):
    """Each op its own program: the forward call is found among the programs sent before."""
    with torch.autograd.detect_anomaly():
        w, loss = _nan_backward(eager_sess.device)
        with pytest.warns(UserWarning, match="Error detected in SqrtBackward0"), \
                pytest.raises(client.RemoteError, match="returned nan values") as raised:
            loss.backward()
    assert f"by the forward call Tensor.sqrt at {_SQRT}" in str(raised.value)
