"""Unit tests of ``service.sessions.store.CustomTensor``: its boundary rules.

``from_torch`` keeps ``detach().clone()`` copies of the value and of a non-None grad; a
missing grad stays ``None``; ``to_torch`` builds a new leaf with ``requires_grad`` as
recorded and a grad converted to the value's device and dtype.
"""

from __future__ import annotations

import pytest
import torch

from remote_autograd.service.sessions.store import CustomTensor

FLOAT_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64]
INT_DTYPES = [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool]


def _leaf_with_grad(dtype=torch.float32) -> torch.Tensor:
    x = torch.arange(1, 7, dtype=torch.float64).reshape(2, 3).to(dtype).requires_grad_()
    (x * x).sum().abs().backward() if x.is_complex() else (x * x).sum().backward()
    assert x.grad is not None
    return x


def _shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


# -- from_torch ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + INT_DTYPES, ids=str)
def test_from_torch_stores_a_copy_of_the_value(dtype):
    src = torch.arange(6, dtype=torch.float64).reshape(2, 3).to(dtype)
    want = src.clone()
    ct = CustomTensor.from_torch(src)
    assert not _shares_memory(ct.value, src)
    src.zero_() if dtype != torch.bool else src.fill_(False)
    assert torch.equal(ct.value, want)
    assert ct.dtype == dtype and ct.device == src.device and ct.shape == src.shape


def test_from_torch_of_a_leaf_that_requires_grad_is_a_new_leaf():
    src = torch.randn(3, requires_grad=True)
    ct = CustomTensor.from_torch(src)
    assert ct.value is not src
    assert ct.requires_grad and ct.is_leaf and ct.value.grad_fn is None
    with torch.no_grad():
        src.add_(1)
    assert not torch.equal(ct.value, src.detach())


@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf:UserWarning")
def test_from_torch_of_a_non_leaf_is_detached_from_its_graph():
    x = torch.randn(3, requires_grad=True)
    y = x * 2
    ct = CustomTensor.from_torch(y)
    assert ct.requires_grad  # carried: `obj.requires_grad = t.requires_grad`
    assert ct.is_leaf and ct.value.grad_fn is None
    # a backward through the stored value never reaches the source's graph
    ct.value.sum().backward()
    assert x.grad is None


def test_from_torch_without_backward_has_grad_none_not_zeros():
    src = torch.randn(2, 2, requires_grad=True)
    ct = CustomTensor.from_torch(src)
    assert ct.grad is None
    assert CustomTensor.from_torch(torch.randn(2)).grad is None
    assert ct.to_torch().grad is None


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_from_torch_copies_the_grad_as_a_clone(dtype):
    src = _leaf_with_grad(dtype)
    want = src.grad.clone()
    ct = CustomTensor.from_torch(src)
    assert ct.grad is not None and ct.grad is not src.grad
    assert not _shares_memory(ct.grad, src.grad)
    assert torch.equal(ct.grad, want)
    assert ct.grad.dtype == dtype
    src.grad.mul_(0)  # in place on the source's .grad
    src.grad.add_(5)
    assert torch.equal(ct.grad, want)
    # another backward accumulating into the source's grad does not reach the copy either
    (src * 3).sum().abs().backward() if src.is_complex() else (src * 3).sum().backward()
    assert torch.equal(ct.grad, want)


@pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True:UserWarning")
def test_from_torch_grad_is_detached():
    x = torch.randn(3, requires_grad=True)
    (x ** 3).sum().backward(create_graph=True)
    assert x.grad.requires_grad  # a grad in a graph
    ct = CustomTensor.from_torch(x)
    assert not ct.grad.requires_grad and ct.grad.grad_fn is None
    torch.testing.assert_close(ct.grad, 3 * x.detach() ** 2)


def test_from_torch_copies_a_retained_non_leaf_grad():
    x = torch.randn(3, requires_grad=True)
    y = x * 2
    y.retain_grad()
    (y * y).sum().backward()
    ct = CustomTensor.from_torch(y)
    torch.testing.assert_close(ct.grad, 2 * y.detach())
    y.grad.zero_()
    assert ct.grad.abs().sum() > 0


def test_from_torch_carries_requires_grad_dtype_device():
    for rg in (False, True):
        for dtype in (torch.float32, torch.float64, torch.bfloat16):
            src = torch.ones(2, dtype=dtype, requires_grad=rg)
            ct = CustomTensor.from_torch(src)
            assert ct.requires_grad is rg and ct.dtype is dtype and ct.device == torch.device("cpu")
    ct = CustomTensor.from_torch(torch.ones(2), device="cpu", requires_grad=True)
    assert ct.requires_grad and ct.device == torch.device("cpu")
    ct = CustomTensor.from_torch(torch.ones(2, requires_grad=True), requires_grad=False)
    assert not ct.requires_grad


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=str)
def test_integer_tensors_never_require_grad(dtype):
    src = torch.ones(3, dtype=dtype)
    ct = CustomTensor.from_torch(src)
    assert not ct.requires_grad
    out = ct.to_torch()
    assert not out.requires_grad and out.dtype == dtype
    # asking for it is torch's own error, never a silently grad-requiring integer tensor
    with pytest.raises(RuntimeError, match="floating point"):
        CustomTensor.from_torch(src, requires_grad=True)


# -- to_torch -----------------------------------------------------------------------------


def test_to_torch_builds_a_new_leaf():
    x = torch.randn(3, requires_grad=True)
    ct = CustomTensor(x * 2)  # a value live in a graph, as after a call step
    out = ct.to_torch()
    assert out.is_leaf and out.grad_fn is None and out.requires_grad
    assert out is not ct.value and not _shares_memory(out, ct.value)
    torch.testing.assert_close(out, (x * 2).detach())
    out.sum().backward()  # its own graph: nothing reaches x
    assert x.grad is None and torch.equal(out.grad, torch.ones(3))
    assert ct.grad is None


@pytest.mark.parametrize("rg", [False, True])
def test_to_torch_requires_grad_as_recorded(rg):
    ct = CustomTensor.from_torch(torch.randn(2, 2, requires_grad=rg))
    assert ct.to_torch().requires_grad is rg


def test_to_torch_grad_is_a_copy_in_the_values_device_and_dtype():
    data = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    grad = torch.arange(6, dtype=torch.float32).reshape(2, 3)  # a grad of another dtype
    ct = CustomTensor(data, grad)
    out = ct.to_torch()
    assert out.grad.dtype == torch.float64 and out.grad.device == out.device
    assert torch.equal(out.grad, grad.double())
    assert not _shares_memory(out.grad, ct.grad)
    out.grad.add_(1)
    assert torch.equal(ct.grad, torch.arange(6, dtype=torch.float32).reshape(2, 3))
    # same dtype: still a copy, never the stored tensor
    ct2 = CustomTensor(data, grad.double())
    out2 = ct2.to_torch()
    assert out2.grad is not ct2.grad and not _shares_memory(out2.grad, ct2.grad)


def test_to_torch_grad_is_detached():
    data = torch.randn(3, requires_grad=True)
    g = torch.randn(3, requires_grad=True) * 2  # a grad in a graph (create_graph)
    out = CustomTensor(data, g).to_torch()
    assert not out.grad.requires_grad and out.grad.grad_fn is None


def test_to_torch_on_an_explicit_device():
    ct = CustomTensor.from_torch(_leaf_with_grad())
    out = ct.to_torch(device="cpu")
    assert out.device == torch.device("cpu") and out.grad.device == torch.device("cpu")


def test_to_torch_twice_gives_independent_tensors():
    src = _leaf_with_grad()
    ct = CustomTensor.from_torch(src)
    a, b = ct.to_torch(), ct.to_torch()
    assert a is not b and not _shares_memory(a, b) and not _shares_memory(a.grad, b.grad)
    with torch.no_grad():
        a.mul_(10)
    a.grad.zero_()
    assert torch.equal(b, src.detach()) and torch.equal(b.grad, src.grad)
    assert torch.equal(ct.value, src.detach()) and torch.equal(ct.grad, src.grad)
    # and a backward on one accumulates into its grad only
    (b * 1).sum().backward()
    assert torch.equal(a.grad, torch.zeros_like(a))
    assert torch.equal(ct.grad, src.grad)


def test_round_trip_from_torch_to_torch():
    src = _leaf_with_grad(torch.float64)
    out = CustomTensor.from_torch(src).to_torch()
    assert out is not src and out.requires_grad and out.is_leaf
    assert torch.equal(out.detach(), src.detach()) and torch.equal(out.grad, src.grad)
    assert out.dtype == src.dtype and out.grad.dtype == src.grad.dtype and out.device == src.device


def test_metadata_properties():
    ct = CustomTensor(torch.zeros(2, 3, dtype=torch.float64), torch.ones(2, 3, dtype=torch.float64))
    assert ct.shape == (2, 3) and ct.is_leaf and not ct.retains_grad  # bytes: by storage (storage_ledger)
    assert "shape=[2, 3]" in repr(ct)
