"""The work of one aten op, from its arguments' and outputs' shapes: the table ``step_cost`` counts by.

The unit is a FLOP. An op with a formula (torch's own ``torch.utils.flop_counter`` table:
matmuls, convolutions, attention; ours below: the rest of what does more than touch each
element once) is charged it, and at least what it touches; any other op is charged what it
touches: ``ELEMENT_FLOPS`` per element of its inputs and outputs (a view, a reshape or an empty
tensor touches nothing). Sizes are logical: an ``expand``ed one-element tensor counts every
element it shows, as the kernel reads every one. Each factor was measured on the CPU of the
machine the defaults were set on (``docs/limits.md``: a 2048x2048 float32 matmul ran 33-39
GFLOP/s on 2 threads), as the time an op took there, in FLOPs at that rate:

- an element touched, 32 (``x + y``: 40 per element, ``exp`` 120, ``sum`` 13, a pooling window's
  element 14-29, an FFT's ``n log2 n`` 41);
- a convolution's FLOP, ``32 / (2 * output channels per group)`` when that is more than 1: a
  convolution with few output channels reads each input patch for few of them (torch's FLOPs of
  the one-channel 2048x2048 by 1024x1024 convolution ran at 2 GFLOP/s, 1/20 of the rate);
- per ``n^3`` of a matrix (once per matrix in the batch): 32 for a
  factorization or a solve (Cholesky 2.6, LU 5.8, ``inv`` 10, QR 26, ``matrix_exp`` 17), 512
  for a spectral one (``eigh`` 106, ``svd`` 351, ``pinv`` 218, ``eig`` 684); ``n`` is its smaller
  side for a matrix that is not square (``m x n x min(m, n)``, LAPACK's own order);
- a sort's element, ``32 * log2`` of the length it sorts along (``kthvalue``, ``topk``,
  ``median``, ``searchsorted`` likewise).

An estimate, not a measure: it keeps a step's cost within a small factor of its time, so that a
budget in FLOPs is a budget in seconds, and an argument that makes a kernel's work explode
(an expanded tensor, a huge kernel) is seen before the kernel runs.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
from torch.utils.flop_counter import flop_registry, sdpa_flop_count

aten = torch.ops.aten

ELEMENT_FLOPS = 32
FACTORIZATION_FLOPS = 32  # per n^3
SPECTRAL_FLOPS = 512  # per n^3

_FREE = object()  # an op that touches no element (a view, an empty tensor, a check)
_TOUCHES = object()  # an op charged what it touches, and no formula


def work(func, args: tuple, kwargs: dict, out: Any) -> float:
    """The FLOPs ``func(*args, **kwargs)`` (an aten overload) did, having answered ``out`` on meta."""
    rule = _rules.get(func)
    if rule is None:
        rule = _rules[func] = _rule(func)
    if rule is _FREE:
        return 0
    touched = ELEMENT_FLOPS * (elements(args) + elements(tuple(kwargs.values())) + elements(out))
    if rule is _TOUCHES:
        return touched
    try:
        return max(touched, rule(args, kwargs, out))
    except (IndexError, TypeError, ValueError, RuntimeError):  # a spelling a formula does not read: what it touches
        return touched


def elements(values: Any) -> int:
    """Elements of the tensors among ``values`` (nested in lists and tuples), as their shapes show them."""
    if isinstance(values, torch.Tensor):
        return values.numel()
    if isinstance(values, (list, tuple)):
        return sum(elements(v) for v in values)
    return 0


# -- which rule an overload follows ------------------------------------------------------------

_rules: dict[Any, Any] = {}  # overload -> _FREE, _TOUCHES or a formula (args, kwargs, out) -> FLOPs


def _rule(func) -> Any:
    packet = getattr(func, "overloadpacket", None)
    if packet is None:  # not an aten overload (a higher-order operator): what it touches
        return _TOUCHES
    if func.is_view or torch.Tag.inplace_view in func.tags or packet in _NO_WORK:
        return _FREE
    if packet in flop_registry:
        formula = flop_registry[packet]
        if packet in _CONVOLUTIONS:
            return lambda args, kwargs, out: formula(*args, **kwargs, out_val=out) * _convolution_reads(args, out)
        return lambda args, kwargs, out: formula(*args, **kwargs, out_val=out)
    return _FORMULAS.get(packet, _TOUCHES)


_NO_WORK = {aten._unsafe_view, aten.empty, aten.empty_strided, aten.empty_like, aten.new_empty,
            aten.new_empty_strided, aten._linalg_check_errors, aten.resize_as_, aten.lift_fresh_copy}
_CONVOLUTIONS = {aten.convolution, aten._convolution, aten.convolution_overrideable, aten.cudnn_convolution,
                 aten._slow_conv2d_forward}


def _convolution_reads(args: tuple, out: Any) -> float:
    """How much slower than its FLOPs a convolution runs for reading each input patch for few output
    channels: ``ELEMENT_FLOPS / (2 * channels)`` when over 1."""
    x, w = args[0], args[1]
    transposed = len(args) > 6 and args[6] is True and w.dim() > 1
    if transposed:
        per_group = w.shape[1]
    else:
        groups = max(1, x.shape[1] // w.shape[1]) if x.dim() > 1 and w.dim() > 1 and w.shape[1] else 1
        per_group = w.shape[0] // groups if w.dim() else 1
    return max(1.0, ELEMENT_FLOPS / (2 * max(1, per_group)))


# -- formulas of our own: (args, kwargs, out) -> FLOPs -------------------------------------------


def _matmul_like(args, kwargs, out) -> float:
    """``addbmm``, ``addmm_``, ``baddbmm_`` (torch's table has the out-of-place ones): 2 FLOPs per
    multiply-add of ``(b x) n x k`` by ``(b x) k x m``."""
    return 2 * args[1].numel() * args[2].shape[-1]


def _attention(args, kwargs, out) -> float:
    return sdpa_flop_count(args[0].shape, args[1].shape, args[2].shape)


def _along(position: int, whole_by_default: bool) -> Callable:
    """A sort along one dimension (its ``dim`` argument at ``position``, or ``dim=``), or of the whole
    tensor when it has no ``dim`` and ``whole_by_default``."""
    def flops(args, kwargs, out):
        x = args[0]
        dim = args[position] if len(args) > position else kwargs.get("dim", None if whole_by_default else -1)
        length = x.numel() if dim is None or x.dim() == 0 else x.shape[dim]
        return ELEMENT_FLOPS * x.numel() * _log2(length)
    return flops


def _searchsorted(args, kwargs, out) -> float:
    boundaries, values = args[0], args[1]
    length = boundaries.shape[-1] if boundaries.dim() else 1
    return ELEMENT_FLOPS * elements(values) * _log2(length)


def _fft(args, kwargs, out) -> float:
    x, dims = args[0], args[1]
    length = math.prod(x.shape[d] for d in dims) if x.dim() else 1
    size = max(x.numel(), elements(out))
    return ELEMENT_FLOPS * size * _log2(length)


def _cubic(per_n3: int) -> Callable:
    """A factorization or a solve: ``per_n3`` times ``m x n x min(m, n)`` per matrix of each argument
    of two dimensions or more."""
    def flops(args, kwargs, out):
        total = 0
        for t in _tensors((*args, *kwargs.values())):
            if t.dim() >= 2:
                total += per_n3 * t.numel() * min(t.shape[-1], t.shape[-2])  # the batch's m x n, times min
        return total
    return flops


def _distances(p_at: int) -> Callable:
    """``cdist``, ``pdist``: per output, one pass over a row of ``m`` elements, at a cost per element
    that depends on the norm (its ``p`` at ``p_at``; ``None``: torch's matmul for p=2)."""
    def flops(args, kwargs, out):
        m = args[0].shape[-1] if args[0].dim() else 1
        p = 2.0 if p_at is None or len(args) <= p_at else args[p_at]
        # p=2 is a matmul (2 FLOPs); measured: p=1 32 per element, another p 120
        per_element = 2 if p == 2 else ELEMENT_FLOPS if p in (0, 1, math.inf) else 4 * ELEMENT_FLOPS
        return per_element * elements(out) * m
    return flops


def _pool(dims: int) -> Callable:
    """A pooling of windows of ``kernel_size`` (its second argument): every window's elements, per output."""
    def flops(args, kwargs, out):
        size = args[1] if len(args) > 1 else kwargs.get("kernel_size", 1)
        sizes = [size] if isinstance(size, int) else list(size)
        window = math.prod(sizes * dims if len(sizes) == 1 else sizes)
        return ELEMENT_FLOPS * _first(out).numel() * window
    return flops


def _adaptive_pool(args, kwargs, out) -> float:
    """Windows of ``ceil(in / out) + 1`` elements per pooled dimension (torch's adaptive windows)."""
    x, result = args[0], _first(out)
    sizes = list(args[1]) if len(args) > 1 and not isinstance(args[1], int) else []
    dims = len(sizes) or 1
    window = 1
    for i in range(1, dims + 1):
        window *= -(-x.shape[-i] // max(1, result.shape[-i])) + 1
    return ELEMENT_FLOPS * result.numel() * window


def _trilinear(args, kwargs, out) -> float:
    """``bilinear``'s kernel: a multiply-add per element of its three inputs broadcast together, each
    unsqueezed at its ``expand`` dimensions."""
    tensors, expands = args[:3], args[3:6]
    shapes = []
    for t, expand in zip(tensors, expands):
        shape = list(t.shape)
        for d in sorted(expand):
            shape.insert(d, 1)
        shapes.append(shape)
    return 2 * math.prod(torch.broadcast_shapes(*shapes))


_FORMULAS: dict[Any, Callable] = {
    aten.addbmm: _matmul_like, aten.addbmm_: _matmul_like, aten.addmm_: _matmul_like, aten.baddbmm_: _matmul_like,
    aten._scaled_dot_product_flash_attention_for_cpu: _attention,
    aten.sort: _along(1, False), aten.kthvalue: _along(2, False), aten.topk: _along(2, False),
    aten.mode: _along(1, False), aten.median: _along(1, True), aten.nanmedian: _along(1, True),
    aten.searchsorted: _searchsorted,
    aten.bucketize: lambda args, kwargs, out: _searchsorted((args[1], args[0]), kwargs, out),
    aten._fft_r2c: _fft, aten._fft_c2c: _fft, aten._fft_c2r: _fft,
    aten._cdist_forward: _distances(2), aten._euclidean_dist: _distances(None), aten._pdist_forward: _distances(1),
    aten._trilinear: _trilinear,
    aten._adaptive_avg_pool2d: _adaptive_pool, aten._adaptive_avg_pool3d: _adaptive_pool,
    aten.adaptive_max_pool2d: _adaptive_pool, aten.adaptive_max_pool3d: _adaptive_pool,
    aten.max_pool1d_with_indices: _pool(1), aten.max_pool1d: _pool(1), aten.avg_pool1d: _pool(1),
    aten.max_pool2d_with_indices: _pool(2), aten.max_pool2d: _pool(2), aten.avg_pool2d: _pool(2),
    aten.fractional_max_pool2d: _pool(2),
    aten.max_pool3d_with_indices: _pool(3), aten.max_pool3d: _pool(3), aten.avg_pool3d: _pool(3),
    aten.fractional_max_pool3d: _pool(3),
}
_FACTORIZATIONS = ("linalg_cholesky_ex", "cholesky", "linalg_inv_ex", "_linalg_det", "_linalg_slogdet", "linalg_qr",
                   "linalg_lu", "linalg_lu_factor_ex", "linalg_lu_solve", "lu_unpack", "linalg_ldl_factor_ex",
                   "linalg_ldl_solve", "_linalg_solve_ex", "linalg_solve_triangular", "triangular_solve",
                   "cholesky_solve", "cholesky_inverse", "linalg_householder_product", "ormqr", "geqrf",
                   "linalg_matrix_exp", "_lu_with_info")
_SPECTRAL = ("_linalg_svd", "_linalg_eigh", "linalg_eig", "_linalg_eigvals", "linalg_pinv", "linalg_lstsq")
_FORMULAS.update({getattr(aten, name): _cubic(FACTORIZATION_FLOPS) for name in _FACTORIZATIONS if hasattr(aten, name)})
_FORMULAS.update({getattr(aten, name): _cubic(SPECTRAL_FLOPS) for name in _SPECTRAL if hasattr(aten, name)})


# -- data-dependent entries (meta cannot say their outputs): work from their real arguments -------


def bounded_work(name: str, args: tuple, kwargs: dict, bound: int) -> float:
    """The FLOPs of a call of data-dependent entry ``name`` whose outputs ``bounds.py`` bounds to
    ``bound`` elements: what it touches, or its own formula where it does more."""
    touched = ELEMENT_FLOPS * (elements(args) + elements(tuple(kwargs.values())) + bound)
    formula = _BOUNDED.get(name)
    return touched if formula is None else max(touched, formula(*args, **kwargs))


def _covariance(input, *args, **kwargs) -> float:
    """``cov``, ``corrcoef``: a variables x variables matrix of products over the observations."""
    return 2 * input.shape[0] * input.numel() if input.dim() == 2 else 0


def _sorted(input, *args, **kwargs) -> float:
    return ELEMENT_FLOPS * input.numel() * _log2(input.numel())


def _packed_rnn(data, batch_sizes, hx, params, *args) -> float:
    """A packed recurrent call: every row of ``data`` through every weight, once per layer and direction."""
    return 2 * data.shape[0] * elements(params)


_BOUNDED: dict[str, Callable[..., float]] = {
    "cov": _covariance, "corrcoef": _covariance, "unique": _sorted,
    "lstm": _packed_rnn, "gru": _packed_rnn, "rnn_tanh": _packed_rnn, "rnn_relu": _packed_rnn,
}


def _tensors(values) -> list[torch.Tensor]:
    return [v for v in values if isinstance(v, torch.Tensor)]


def _first(out: Any) -> torch.Tensor:
    return out[0] if isinstance(out, (tuple, list)) else out


def _log2(n: int) -> float:
    return max(1.0, math.log2(max(1, n)))
