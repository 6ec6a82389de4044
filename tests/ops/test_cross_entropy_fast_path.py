"""The class losses' fast paths (one ``CrossEntropy`` or ``NLL`` node: class indices, 1-d or 2-d input,
no label smoothing) give F.cross_entropy's and F.nll_loss's values and gradients bit for bit, and
differentiate twice."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from remote_autograd.service.ops import OP_TABLE

from ..bits import assert_same_bits

cross_entropy = OP_TABLE.get("cross_entropy").fn
nll_loss = OP_TABLE.get("nll_loss").fn

# (input shape, whether the input is a transposed view); the classes are the last dim
SHAPES = [((64, 10), False), ((5, 3), False), ((1, 4), False), ((7,), False), ((6, 5), True), ((0, 3), False)]
CASES = list(itertools.product(SHAPES, [False, True], [-100, 1], ["mean", "sum", "none"]))


def _id(case) -> str:
    (shape, transposed), weighted, ignore_index, reduction = case
    shape = "x".join(map(str, shape)) + ("-T" if transposed else "")
    return f"{shape}{'-w' if weighted else ''}-ii{ignore_index}-{reduction}"


def _inputs(case, dtype, target_dtype=torch.int64, seed=0):
    (shape, transposed), weighted, ignore_index, reduction = case
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tuple(reversed(shape)) if transposed else shape, generator=gen, dtype=dtype)
    x = (x.t() if transposed else x).requires_grad_()
    n_classes = shape[-1]
    target = torch.randint(0, n_classes, shape[:-1], generator=gen).to(target_dtype)
    if target.numel() >= 2:  # ignore_index=1 hits one target at least, and keeps one
        target.view(-1)[0], target.view(-1)[-1] = 1, 0
    weight = torch.rand(n_classes, generator=gen, dtype=dtype) + 0.1 if weighted else None
    return x, target, dict(weight=weight, ignore_index=ignore_index, reduction=reduction)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_fast_path_is_torch_bit_for_bit(case, dtype):
    x, target, kw = _inputs(case, dtype)
    got, want = cross_entropy(x, target, **kw), F.cross_entropy(x, target, **kw)
    assert type(got.grad_fn).__name__ == "CrossEntropyBackward"  # the fast path was taken
    assert_same_bits(got, want)
    g = torch.rand(want.shape, generator=torch.Generator().manual_seed(1), dtype=dtype) + 0.5
    (got_dx,) = torch.autograd.grad(got, x, g)
    (want_dx,) = torch.autograd.grad(want, x, g)
    assert_same_bits(got_dx, want_dx)


def test_ignored_targets_and_byte_targets_as_torch():
    x = torch.randn(4, 3, requires_grad=True)
    everything_ignored = torch.full((4,), 2)
    for reduction in ("mean", "sum", "none"):  # the mean of nothing is 0/0, as torch
        assert_same_bits(cross_entropy(x, everything_ignored, ignore_index=2, reduction=reduction),
                         F.cross_entropy(x, everything_ignored, ignore_index=2, reduction=reduction))
    x, target, kw = _inputs(CASES[0], torch.float32, target_dtype=torch.uint8)
    got, want = cross_entropy(x, target, **kw), F.cross_entropy(x, target, **kw)
    assert_same_bits(got, want)
    assert_same_bits(torch.autograd.grad(got, x)[0], torch.autograd.grad(want, x)[0])


def _mean_of_nothing(case) -> bool:
    """Every target ignored under reduction='mean': the loss is 0/0, and there is no gradient to check."""
    _, target, kw = _inputs(case, torch.float64)
    return kw["reduction"] == "mean" and bool((target == kw["ignore_index"]).all())


@pytest.mark.parametrize("case", [c for c in CASES if c[0][0] not in ((64, 10), (0, 3)) and not _mean_of_nothing(c)],
                         ids=_id)
def test_gradcheck_and_gradgradcheck(case):
    x, target, kw = _inputs(case, torch.float64)
    f = lambda x: cross_entropy(x, target, **kw)  # noqa: E731
    assert torch.autograd.gradcheck(f, (x,))
    assert torch.autograd.gradgradcheck(f, (x,))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_double_backward_is_torch_bit_for_bit(case, dtype):
    x, target, kw = _inputs(case, dtype)

    def second(fn):  # d/dx and d/dg of a function of dloss/dx (g: the loss's incoming gradient)
        loss = fn(x, target, **kw)
        g = torch.ones_like(loss).requires_grad_()
        (dx,) = torch.autograd.grad(loss, x, g, create_graph=True)
        return torch.autograd.grad((dx * dx.detach().cos()).sum(), (x, g))

    for got, want in zip(second(cross_entropy), second(F.cross_entropy)):
        assert_same_bits(got, want)


def test_other_cases_keep_the_composition():
    x = torch.randn(4, 3, requires_grad=True)
    for target, kw in [(torch.randint(0, 3, (4,)), dict(label_smoothing=0.1)),  # label smoothing
                       (torch.rand(4, 3), {}),  # class probabilities
                       (torch.randint(0, 3, (4,), dtype=torch.int32), {})]:  # a target dtype aten's nll_loss refuses
        assert type(cross_entropy(x, target, **kw).grad_fn).__name__ != "CrossEntropyBackward"
    x3 = torch.randn(2, 3, 4, requires_grad=True)  # > 2-d
    assert type(cross_entropy(x3, torch.randint(0, 3, (2, 4))).grad_fn).__name__ != "CrossEntropyBackward"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_nll_loss_fast_path_is_torch_bit_for_bit(case, dtype):
    x, target, kw = _inputs(case, dtype)
    logp = torch.log_softmax(x, -1)
    got, want = nll_loss(logp, target, **kw), F.nll_loss(logp, target, **kw)
    assert type(got.grad_fn).__name__ == "NLLBackward"  # the fast path was taken
    assert_same_bits(got, want)
    g = torch.rand(want.shape, generator=torch.Generator().manual_seed(1), dtype=dtype) + 0.5
    got_dx = torch.autograd.grad(got, x, g, retain_graph=True)[0]  # log_softmax is shared by both
    assert_same_bits(got_dx, torch.autograd.grad(want, x, g)[0])


@pytest.mark.parametrize("case", CASES[1::7], ids=_id)
def test_nll_loss_gradcheck_and_gradgradcheck(case):
    x, target, kw = _inputs(case, torch.float64)
    if kw["reduction"] == "mean" and bool((target == kw["ignore_index"]).all()):
        pytest.skip("every target ignored: the mean is 0/0")
    f = lambda x: nll_loss(torch.log_softmax(x, -1), target, **kw)  # noqa: E731
    assert torch.autograd.gradcheck(f, (x,))
    assert torch.autograd.gradgradcheck(f, (x,))
