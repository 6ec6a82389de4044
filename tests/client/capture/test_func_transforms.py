"""``torch.func`` under ``torch.compile(..., backend="remote")``: dynamo inlines ``vmap`` and ``grad`` into the
graph, whose functorch calls the server runs with torch's own functorch (``capture/_functorch``,
``service/engine/functorch_regions``). Per-sample gradients of an MLP (``functional_call`` over its
parameters, the torch tutorial's form) equal eager ``torch.func`` on the CPU bit for bit, one
``run_template`` per call; ``vmap`` alone, ``grad`` alone, ``jacrev``, ``vjp``, nested transforms and
``vmap``'s ``randomness=`` forms too. Forward-mode transforms (``jacfwd``, ``hessian``) raise at the
call; a region that fails on the server leaves it (and other sessions) running the next.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import functional_call, grad, grad_and_value, hessian, jacfwd, jacrev, vjp, vmap
from torch.utils._pytree import tree_leaves

from bench import _hot
from remote_autograd import client

G = torch.Generator().manual_seed(3)
X, Y = torch.randn(6, 4, generator=G), torch.randn(6, 1, generator=G)
LABELS = torch.randint(0, 3, (6,), generator=G)


def _mlp(classes: int = 1) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, classes))


def _per_sample_grads(model: nn.Module, loss_fn=nn.functional.mse_loss):
    """torch's per-sample-gradients tutorial: ``vmap(grad(loss), in_dims=(None, 0, 0))``."""
    def loss(params, x, y):
        out = functional_call(model, params, (x.unsqueeze(0),))
        return loss_fn(out, y.unsqueeze(0))

    def per_sample(params, x, y):
        return vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)
    return per_sample


@pytest.mark.parametrize("task", ["regression", pytest.param("classification", marks=pytest.mark.slow)])
def test_per_sample_gradients_of_an_mlp_equal_cpu_one_template_per_call(tapped, task):
    sess, tap = tapped
    # classification: cross_entropy's batching rule makes a tensor on the device of its own (dynamo's
    # tracing met it beside the stand-ins and gave up on the graph)
    classes, loss_fn, labels = (1, nn.functional.mse_loss, Y) if task == "regression" else \
        (3, nn.functional.cross_entropy, LABELS)
    local = _mlp(classes)
    want = [_per_sample_grads(local, loss_fn)({k: v.detach() for k, v in local.named_parameters()}, X * s, labels)
            for s in (1.0, 0.5, 2.0)]
    model = _mlp(classes).to(sess.device)
    params = {k: v.detach() for k, v in model.named_parameters()}
    compiled = torch.compile(_per_sample_grads(model, loss_fn), backend="remote")
    for call, scale in enumerate((1.0, 0.5, 2.0)):
        x, y = (X * scale).to(sess.device), labels.to(sess.device)
        sess.flush()
        recorded = []
        tap.recorded = recorded
        got = compiled(params, x, y)
        sess.flush()
        tap.recorded = None
        kinds = [s["kind"] for body, ctype in recorded for s in _hot.decode_body(body, ctype)["steps"]
                 if s["kind"] != "free"]  # the last call's results, let go
        if call:  # the template went with the first call: now one small step
            assert kinds == ["run_template"], kinds
        else:
            assert kinds.count("template") == 1 and kinds.count("run_template") == 1, kinds
        assert got.keys() == want[call].keys()
        for k in got:
            assert got[k].shape == (6, *dict(local.named_parameters())[k].shape)
            assert torch.equal(got[k].cpu(), want[call][k]), k


@pytest.mark.slow  # a compile per batch size
def test_per_sample_gradients_of_batches_of_other_sizes(sess):
    """A data loader's last batch is smaller: the batch size traced dynamic (as dynamo's second shape
    would make it), the template takes it as a number of each call."""
    local, model = _mlp(), _mlp().to(sess.device)
    want_params = {k: v.detach() for k, v in local.named_parameters()}
    params = {k: v.detach() for k, v in model.named_parameters()}
    compiled = torch.compile(_per_sample_grads(model), backend="remote", dynamic=True)
    for n in (6, 3):
        got = compiled(params, X[:n].to(sess.device), Y[:n].to(sess.device))
        want = _per_sample_grads(local)(want_params, X[:n], Y[:n])
        for k in got:
            assert got[k].shape == want[k].shape and torch.equal(got[k].cpu(), want[k]), (n, k)


W = torch.randn(3, dtype=torch.float64, generator=G)
A = torch.randn(4, 3, dtype=torch.float64, generator=G)


def _vjp(w, a):
    out, pullback = vjp(lambda v: (a @ v).sin(), w)
    return out, pullback(torch.ones_like(out))[0]


@pytest.mark.parametrize("name, fn", [
    ("vmap", lambda w, a: vmap(lambda r: (r * w).sin())(a)),
    ("vmap in_dims=1 out_dims=1", lambda w, a: vmap(lambda c: (c * a[:, 0]).cos(), in_dims=1, out_dims=1)(a)),
    ("grad", lambda w, a: grad(lambda v: (a @ v).tanh().sum())(w)),
    ("grad_and_value", lambda w, a: grad_and_value(lambda v: (a @ v).tanh().sum())(w)),
    ("grad has_aux argnums", lambda w, a: grad(lambda v, b: ((b @ v).sin().sum(), (b @ v).cos()), argnums=(0, 1),
                                               has_aux=True)(w, a)),
    ("vmap chunk_size", lambda w, a: vmap(lambda r: (r * w).sin(), chunk_size=3)(a)),
    ("vjp", _vjp),
    ("jacrev", lambda w, a: jacrev(lambda v: (a @ v).sin())(w)),
    ("jacrev of jacrev (a hessian)", lambda w, a: jacrev(jacrev(lambda v: (a @ v).sin().sum()))(w)),
    ("vmap of vmap", lambda w, a: vmap(vmap(lambda e: e * w.sum()))(a)),
])
def test_transforms_equal_cpu_in_float64(sess, name, fn):
    want = tree_leaves(fn(W, A))
    got = tree_leaves(torch.compile(fn, backend="remote")(W.to(sess.device), A.to(sess.device)))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert torch.equal(g.cpu(), w), name


def test_a_vmapped_forward_is_differentiated_from_outside_as_on_cpu(sess):
    """vmap adds no level of autograd: the backward after the compiled call reaches what it closes over
    (``w``) and what it maps over (``a``); the SDK knew neither .grad was set (they stayed None)."""
    def forward(w, a):
        return vmap(lambda r: (r * w).sin())(a).sum()
    w, a = W.clone().requires_grad_(), A.clone().requires_grad_()
    forward(w, a).backward()
    compiled = torch.compile(forward, backend="remote")
    wr, ar = W.to(sess.device).requires_grad_(), A.to(sess.device).requires_grad_()
    for _ in range(2):
        wr.grad = ar.grad = None
        compiled(wr, ar).backward()
        assert torch.equal(wr.grad.cpu(), w.grad) and torch.equal(ar.grad.cpu(), a.grad)


def test_vmap_randomness_forms(sess):
    x = X.to(sess.device)

    def noisy(randomness):
        return torch.compile(lambda t: vmap(lambda r: r + torch.rand_like(r), randomness=randomness)(t),
                             backend="remote")
    same, different = (noisy(r)(x).cpu() - X for r in ("same", "different"))
    assert torch.allclose(same, same[:1].expand_as(same)) and ((0 <= same) & (same < 1)).all()
    assert not torch.allclose(different, different[:1].expand_as(different))
    with pytest.raises(RuntimeError, match="vmap: called random operation while in randomness error mode"):
        noisy("error")(x)
    assert torch._C._functorch.peek_interpreter_stack() is None


@pytest.mark.parametrize("transform", ["jacfwd", "hessian"])
def test_forward_mode_transforms_raise_at_the_call(sess, transform):
    fn = {"jacfwd": lambda w, a: jacfwd(lambda v: a @ v)(w),
          "hessian": lambda w, a: hessian(lambda v: (a @ v).sin().sum())(w)}[transform]
    # dynamo's tracing of hessian's backward through forward-mode wrappers of this device aborted the process
    with pytest.raises(Exception, match=r"jvp / jacfwd / hessian on remote tensors.*jacrev\(jacrev\(f\)\)"):
        torch.compile(fn, backend="remote")(W.to(sess.device), A.to(sess.device))
    assert torch._C._functorch.peek_interpreter_stack() is None
    assert torch.equal((A.to(sess.device) @ W.to(sess.device)).cpu(), A @ W)  # the session goes on


def test_grad_through_the_transform_from_outside_raises(sess):
    model = _mlp().to(sess.device)
    params = dict(model.named_parameters())  # not detached: the per-sample grads would require grad
    with pytest.raises(RuntimeError, match=r"torch.func.grad's result requires grad outside the transform.*detach"):
        torch.compile(_per_sample_grads(model), backend="remote")(params, X.to(sess.device), Y.to(sess.device))
    assert torch._C._functorch.peek_interpreter_stack() is None


def test_a_region_that_fails_on_the_server_leaves_it_running_the_next(sess, eager_sess):
    factor = torch.compile(lambda m: vmap(torch.linalg.cholesky)(m), backend="remote")
    bad = torch.eye(3, dtype=torch.float64).repeat(4, 1, 1)
    bad[2] = -bad[2]  # not positive-definite: only the kernel finds it, inside the server's vmap
    with pytest.raises(client.RemoteError, match="linalg.cholesky.*not positive-definite"):
        factor(bad.to(sess.device)).cpu()
    good = A.T @ A + torch.eye(3, dtype=torch.float64)
    assert torch.equal(factor(good.expand(4, 3, 3).to(sess.device)).cpu(), vmap(torch.linalg.cholesky)(good.expand(4, 3, 3)))
    x = torch.randn(5, 3, dtype=torch.float64, generator=G)  # another session of the same server: untouched
    plain = x.to(eager_sess.device).sin().cpu()  # no transform left on the server's stack to batch it
    assert plain.shape == (5, 3) and torch.equal(plain, x.sin())


def test_eager_vmap_on_remote_tensors_raises_naming_the_transform_and_compile(sess):
    w, x = W.to(sess.device), A.to(sess.device)
    with pytest.raises(RuntimeError, match=r'torch.func.vmap on remote tensors.*torch.compile\(\.\.\., backend="remote"\)'):
        vmap(lambda r: r * w)(x)
    # an op on the batched tensor alone reaches the SDK below torch's functions, where no transform is named
    with pytest.raises(RuntimeError, match=r'torch.func transforms.*torch.compile\(\.\.\., backend="remote"\)'):
        vmap(lambda r: r * 2)(x)
    assert torch._C._functorch.peek_interpreter_stack() is None


def test_a_graph_break_inside_a_transform_runs_it_eagerly_and_raises(sess):
    def per_row(r):
        print("a graph break")  # dynamo then runs the whole transform eagerly
        return r * 2
    with pytest.raises(RuntimeError, match=r"torch.compile\(\.\.\., backend=\"remote\"\).*no graph break"):
        torch.compile(lambda t: vmap(per_row)(t), backend="remote")(A.to(sess.device))
    assert torch._C._functorch.peek_interpreter_stack() is None
