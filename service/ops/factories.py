"""Factories: new tensors on the session's device, random ones from the session's generator.

``torch.zeros(...)`` has no tensor argument, so the SDK's device kernels (client/handlers/_kernels.py) call
these by op name (no torch names); the ``*_like`` family reaches ``__torch_function__`` and is
torch's own from the surface (``surface.json``). ``device`` arguments are accepted and ignored: the
session's device is the only one. ``empty`` memory is zeroed: a session never sees stale data.
"""

from __future__ import annotations

import functools

import torch

from remote_autograd.proto import ErrorCode, ProtocolError
from remote_autograd.proto.op_contract import FACTORIES

from ._context import current, torch_fills_uninitialised
from ._registry import op
from ._samples import S


@functools.lru_cache(maxsize=256)
def _meta_numel(reference, args: tuple, kwargs: tuple) -> int:
    """The elements ``reference(*args, **kwargs)`` would make, from the same factory on meta.

    Memoized: a training loop's factories (the GPT's ``arange`` of its positions) repeat their
    arguments every step, and torch's meta path for ``arange`` runs its Python decomposition.
    Arguments that compare equal give the same count (``arange(2)``, ``arange(2.0)``); one torch
    refuses where its equal was accepted (``zeros(2.0)`` after ``zeros(2)``) is still refused,
    with the same error, by the factory itself, which runs after this check.
    """
    return reference(*args, **dict(kwargs), device="meta").numel()


def _factory(name: str, samples, reference, *, capturable: bool = False):
    """Register a factory whose output size is checked against the session's limit before
    anything is allocated (the same torch factory on the meta device says the size). The names are
    the op contract's (``FACTORIES``), which the SDK's device kernels call. ``capturable``: its values
    are a kernel's, from its arguments alone (no generator): a capture may replay it."""
    if name not in FACTORIES:
        raise ValueError(f"factory {name!r} is not in proto/op_contract.py's FACTORIES: the SDK would not call it")
    register = op(name, torch_names=(), samples=samples, reference=reference, differentiable=False,
                  shape_rule="meta", factory=True, capturable=capturable)

    def decorate(fn):
        @functools.wraps(fn)
        def bounded(*args, **kwargs):
            limit = current().max_elements
            if limit is not None:
                plain = tuple((k, v) for k, v in kwargs.items() if k not in ("device", "requires_grad"))
                try:
                    hash((args, plain))
                except TypeError:  # an unhashable argument (a size given as a list): not memoized
                    numel = reference(*args, **dict(plain), device="meta").numel()
                else:
                    numel = _meta_numel(reference, args, plain)
                if numel > limit:
                    raise ProtocolError(ErrorCode.TOO_LARGE, f"{name}: {numel} elements, over the limit "
                                        f"max_tensor_elements={limit}")
            return fn(*args, **kwargs)

        return register(bounded)

    return decorate


_SIZES = (S(2, 3), S((2, 3), dtype=torch.float64), S([4], requires_grad=True), S(0), S(()))


@_factory("zeros", _SIZES, torch.zeros, capturable=True)
def zeros(*size, dtype=None, device=None, requires_grad=False):
    """a tensor of zeros of shape ``size``"""
    return torch.zeros(*size, dtype=dtype, device=current().device, requires_grad=requires_grad)


@_factory("ones", _SIZES, torch.ones, capturable=True)
def ones(*size, dtype=None, device=None, requires_grad=False):
    """a tensor of ones of shape ``size``"""
    return torch.ones(*size, dtype=dtype, device=current().device, requires_grad=requires_grad)


@_factory("empty", _SIZES, torch.zeros, capturable=True)
def empty(*size, dtype=None, device=None, requires_grad=False):
    """torch.empty, but zeroed (under deterministic algorithms, filled as torch fills it)"""
    if torch_fills_uninitialised():
        return torch.empty(*size, dtype=dtype, device=current().device, requires_grad=requires_grad)
    return torch.zeros(*size, dtype=dtype, device=current().device, requires_grad=requires_grad)


@_factory("full", (S((2, 3), 1.5), S([2], 7), S((), True), S((3,), 2, dtype=torch.float64, requires_grad=True)),
          torch.full, capturable=True)
def full(size, fill_value, *, dtype=None, device=None, requires_grad=False):
    """a tensor of shape ``size`` filled with ``fill_value`` (dtype inferred from it, as torch)"""
    return torch.full(size, fill_value, dtype=dtype, device=current().device, requires_grad=requires_grad)


@_factory("arange", (S(5), S(1, 4), S(0.0, 2.0, 0.5), S(5, 1, -2, dtype=torch.float32), S(3, requires_grad=False)),
          torch.arange, capturable=True)
def arange(start, end=None, step=1, *, dtype=None, device=None, requires_grad=False):
    """start, start + step, ... up to end (exclusive); arange(end) starts at 0"""
    if end is None:
        start, end = 0, start
    return torch.arange(start, end, step, dtype=dtype, device=current().device, requires_grad=requires_grad)


@_factory("linspace", (S(0, 1, 5), S(-1.0, 1.0, 1), S(2, 3, 4, dtype=torch.float64, requires_grad=True)),
          torch.linspace)
def linspace(start, end, steps, *, dtype=None, device=None, requires_grad=False):
    """``steps`` evenly spaced values from start to end (inclusive)"""
    return torch.linspace(start, end, steps, dtype=dtype, device=current().device, requires_grad=requires_grad)


@_factory("eye", (S(3), S(2, 4), S(3, 2, dtype=torch.int64)), torch.eye)
def eye(n, m=None, *, dtype=None, device=None, requires_grad=False):
    """an n x m (default n x n) identity matrix"""
    m = n if m is None else m
    return torch.eye(n, m, dtype=dtype, device=current().device, requires_grad=requires_grad)


_RANDOM_SIZES = (S(2, 3), S((3, 2), dtype=torch.float64), S([4], requires_grad=True), S(0))


@_factory("rand", _RANDOM_SIZES, torch.rand)
def rand(*size, dtype=None, device=None, requires_grad=False):
    """uniform in [0, 1), from the session's generator"""
    gen = current().generator
    return torch.rand(*size, generator=gen, dtype=dtype, device=current().device, requires_grad=requires_grad)


@_factory("randn", _RANDOM_SIZES, torch.randn)
def randn(*size, dtype=None, device=None, requires_grad=False):
    """standard normal, from the session's generator"""
    gen = current().generator
    return torch.randn(*size, generator=gen, dtype=dtype, device=current().device, requires_grad=requires_grad)


@_factory("randint", (S(10, (2, 3)), S(-3, 3, (4,)), S(5, [3], dtype=torch.float32), S(2, size=(2,))), torch.randint)
def randint(low, high=None, size=None, *, dtype=None, device=None, requires_grad=False):
    """integers uniform in [low, high) (randint(high, size): low = 0), int64 by default, from the session's generator"""
    if size is None:  # randint(high, size)
        low, high, size = 0, low, high
    elif high is None:  # randint(high, size=size)
        low, high = 0, low
    gen = current().generator
    return torch.randint(low, high, size, generator=gen, dtype=dtype or torch.int64, device=current().device,
                         requires_grad=requires_grad)


@_factory("randperm", (S(5), S(0), S(4, dtype=torch.float64)), torch.randperm)
def randperm(n, *, dtype=None, device=None, requires_grad=False):
    """a random permutation of 0..n-1, int64 by default, from the session's generator"""
    return torch.randperm(n, generator=current().generator, dtype=dtype or torch.int64, device=current().device,
                          requires_grad=requires_grad)
