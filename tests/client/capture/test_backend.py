"""``torch.compile(fn, backend="remote")``: a compiled training step runs as a template, one small request
per step, and trains to local torch's values bit for bit (SGD: eager torch's; the Adam family: torch's
own compiled step, which rounds differently from its eager one, ``tests/e2e/test_compiled_models.py``).

Also: a module compiled with its backward in the graph (``trace_autograd_ops``), the options torch.compile
takes (``mode``, ``options``, ``fullgraph``), a graph the server cannot hold as a template (it runs call by
call, and says so), the default backend's refusal, and local code compiled in the same process.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

from bench import _hot
from remote_autograd.client.capture import remote_backend

X = torch.randn(8, 10, generator=torch.Generator().manual_seed(1))
Y = torch.randint(0, 3, (8,), generator=torch.Generator().manual_seed(2))


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 3))


def train_step(model, opt, x, y):
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.detach()


def _train(device, step, steps: int = 4):
    model = _mlp().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = X.to(device), Y.to(device)
    losses = [step(model, opt, x, y).item() for _ in range(steps)]
    return losses, [p.detach().cpu() for p in model.parameters()]


def test_a_compiled_training_step_is_one_small_request_and_trains_as_local_torch(tapped):
    sess, tap = tapped
    want_losses, want_params = _train("cpu", train_step)
    compiled = torch.compile(train_step, backend="remote")
    model = _mlp().to(sess.device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = X.to(sess.device), Y.to(sess.device)
    losses = []
    for step in range(4):
        recorded = []
        tap.recorded = recorded
        losses.append(compiled(model, opt, x, y).item())
        tap.recorded = None
        sent = [_hot.decode_body(body, ctype) for body, ctype in recorded]
        if step >= 2:  # warm: the templates were sent, the momentum buffers made
            assert len(sent) == 1  # one request: the step and the loss's value
            kinds = [s["kind"] for s in sent[0]["steps"]]
            # the forward and the optimizer's step; the loss detached after the backward's graph break is
            # a graph of one call, which goes as that call (a template of it would be one step all the same)
            assert kinds.count("run_template") == 2 and kinds.count("call") == 1, kinds
            assert next(s for s in sent[0]["steps"] if s["kind"] == "call")["op"] == "detach"
            assert len(recorded[0][0]) < 1500  # bytes: ids and numbers, no op by op
    assert losses == want_losses
    for got, want in zip(model.parameters(), want_params):
        assert torch.equal(got.detach().cpu(), want)


def test_a_compiled_module_with_its_backward_in_the_graph(sess):
    """``trace_autograd_ops``: forward and backward one graph, the grads set by dynamo's epilogue."""
    local, remote = _mlp(), _mlp().to(sess.device)

    def step(model, x, y):
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        return loss.detach()

    with torch._dynamo.config.patch(trace_autograd_ops=True):
        compiled = torch.compile(step, backend="remote")
        for _ in range(2):  # the second call accumulates into the grads the first one set
            got = compiled(remote, X.to(sess.device), Y.to(sess.device))
            want = step(local, X, Y)
            assert got.item() == want.item() and not got.requires_grad
    for r, l in zip(remote.parameters(), local.parameters()):
        assert r.grad is not None and torch.equal(r.grad.cpu(), l.grad)



def test_backward_in_the_graph_after_a_break_is_what_local_torch_makes_of_it(sess):
    """torch 2.13's ``trace_autograd_ops`` drops a backward that follows a graph break (``zero_grad``
    between the loss and its backward): the grads stay None locally, and so they do remotely
    (docs/compile.md says so, and where to put ``zero_grad``)."""
    grads = []
    for device in ("cpu", sess.device):
        model = _mlp().to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def step(x, y):
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            return loss.detach()

        torch._dynamo.reset()
        with torch._dynamo.config.patch(trace_autograd_ops=True):
            torch.compile(step, backend="remote" if device != "cpu" else "eager")(X.to(device), Y.to(device))
        grads.append([p.grad is None for p in model.parameters()])
    assert grads[0] == grads[1]


def test_a_compiled_step_under_autocast_trains_as_eager_local_torch(sess):
    """``torch.autocast("remote")`` inside the compiled step (dynamo traced it to a stop before: no autocast
    kernel of the device for ops without an autocast rule)."""
    results = []
    for device in ("cpu", sess.device):
        model = _mlp().to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

        def step(x, y, device_type=torch.device(device).type):
            with torch.autocast(device_type=device_type, dtype=torch.bfloat16):
                loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss.detach()

        torch._dynamo.reset()
        run = step if device == "cpu" else torch.compile(step, backend="remote")
        losses = [run(X.to(device), Y.to(device)).cpu() for _ in range(3)]
        results.append(losses + [p.detach().cpu() for p in model.parameters()])
    for want, got in zip(*results, strict=True):
        assert torch.equal(got, want)

def test_torch_compile_of_a_module_trains_and_evaluates_as_local_torch(sess):
    model, twin = _mlp(), _mlp()
    compiled = torch.compile(twin.to(sess.device), backend="remote")
    opt_l = torch.optim.SGD(model.parameters(), lr=0.1)
    opt_r = torch.optim.SGD(compiled.parameters(), lr=0.1)
    for _ in range(3):
        for m, opt, x, y in ((model, opt_l, X, Y), (compiled, opt_r, X.to(sess.device), Y.to(sess.device))):
            opt.zero_grad()
            nn.functional.cross_entropy(m(x), y).backward()
            opt.step()
    with torch.no_grad():
        out = compiled(X.to(sess.device))
        assert not out.requires_grad
        assert torch.equal(out.cpu(), model(X))


def test_mode_options_and_fullgraph(tapped):
    sess, tap = tapped
    x = torch.ones(3, device=sess.device)
    with _hot.recording(tap) as programs:
        out = torch.compile(lambda t: t * 2 + 1, backend="remote", mode="reduce-overhead")(x)
        assert out.tolist() == [3.0] * 3
    template = next(s for p in programs() for s in p["steps"] if s["kind"] == "template")
    assert template["mode"] == "reduce-overhead"  # a hint the server may compile by
    with pytest.raises(Exception, match="takes no options"):
        torch.compile(lambda t: t - 1, backend="remote", options={"max_autotune": True})(x)
    assert torch.compile(lambda t: (t * 3).sum(), backend="remote", fullgraph=True)(x).item() == 9.0

    def reads(t):
        n = (t * 3).sum().item()  # dynamo keeps the value read in the graph: no template can hold it
        return t * n

    with pytest.warns(RuntimeWarning, match="runs call by call"):  # correct, op by op, and said
        assert torch.compile(reads, backend="remote", fullgraph=True)(x).tolist() == [9.0] * 3


def test_a_graph_that_is_no_template_runs_call_by_call_and_says_so(sess):
    """A graph reading a remote tensor's values on the client (``.cpu()``) cannot run on the server alone."""
    x = torch.arange(3.0, device=sess.device)
    with pytest.warns(RuntimeWarning, match="runs call by call"):
        out = torch.compile(lambda t: (t + 1).cpu() * 2, backend="remote")(x)
    assert out.tolist() == [2.0, 4.0, 6.0] and out.device.type == "cpu"


@pytest.mark.inductor  # the CPU function compiles with torch's default backend: inductor, here
def test_local_code_compiles_as_before_in_the_same_process(sess):
    """After a remote compile: a CPU function compiles with torch's default backend, and dynamo's own
    rewrites (off while a graph of remote tensors is traced) are back."""
    torch.compile(lambda t: t * 2, backend="remote")(torch.ones(2, device=sess.device))
    assert torch._dynamo.config.enable_dynamo_decompositions

    def local(a, b):
        return torch.relu(a @ b).sum()

    a, b = torch.randn(4, 3), torch.randn(3, 2)
    assert torch.allclose(torch.compile(local)(a, b), local(a, b))


def test_the_backend_registered_by_name():
    from torch._dynamo.backends.registry import lookup_backend

    assert lookup_backend("remote") is remote_backend


def test_the_c_facts_torch_compile_reads_are_the_handles(sess):
    """dynamo's guards read the C++ tensor: its requires_grad and .grad follow the SDK's own."""
    w = sess.tensor(torch.ones(3), requires_grad=True)
    with torch._C.DisableTorchFunctionSubclass():
        assert torch.Tensor.requires_grad.__get__(w) and torch.Tensor.grad.__get__(w) is None
    (w * 2).sum().backward()
    with torch._C.DisableTorchFunctionSubclass():
        assert torch.Tensor.grad.__get__(w).shape == (3,)
    w.grad = None
    w.requires_grad_(False)
    with torch._C.DisableTorchFunctionSubclass():
        assert not torch.Tensor.requires_grad.__get__(w) and torch.Tensor.grad.__get__(w) is None
    model = copy.deepcopy(_mlp()).to(sess.device)  # a module move keeps working on a traceable subclass
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert model[0].weight.device == sess.device and model[0].weight.requires_grad
