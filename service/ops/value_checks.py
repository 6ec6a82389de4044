"""Value checks: the integer values a kernel indexes memory by, checked before it runs (DESIGN principle 4).

The meta check derives every call's outputs from shapes; it never sees values. A few of torch's
CPU kernels index memory by the *values* of integer arguments and trust them: lengths and offsets
(``segment_reduce``), a packed sequence's batch sizes (``_pad_packed_sequence``, packed
``lstm``/``gru``/``rnn_*``), labels (``ctc_loss``), bags (``embedding_bag``), LAPACK pivots
(``linalg.ldl_solve``), an enum passed as an int (``grid_sampler_*``); and torch checks a view's
bounds in int64, where huge sizes wrap around (``as_strided``). Given other values these crash the
process or read and write other tensors' memory. ``VALUE_CHECKS`` (entry name -> check) holds one
check per such op, found by machine: the value fuzz (``python -m tests.fuzz.values``) calls every
allow-listed op with extreme integer values, and its committed result (``value_fuzz.json``) says
what each check stops.

A check runs on the real arguments before the kernel (and before the meta run, so it checks the
structure it indexes by itself), raises ``ValueError`` (a 422) with torch's own wording where torch
has one (its safe flag's, or another device's check), and returns quietly for what torch refuses by
itself without reading values. It reads a tensor's values with one transfer to the host (on a GPU a
sync): only these ops pay it.

``check_of`` gives an entry its ``OpEntry.check``: its argument contract (``arg_checks.py``) and its
value check, in that order. ``meta_check`` runs it on every path a call takes: the plain check, a
replayed plan's (``check_planned``: values change between runs even when layouts do not), and a
program with such an op is never captured as a CUDA graph (``graph_signature``).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from . import arg_checks

_INDEX_DTYPES = (torch.int32, torch.int64)


def _fail(message: str) -> None:
    raise ValueError(message)


def _host(*values: torch.Tensor) -> list:
    """0-d tensors' values, in one transfer."""
    return torch.stack([v.to(torch.int64) for v in values]).tolist()


def _falls(t: torch.Tensor) -> torch.Tensor:
    """Whether any element along the last dimension is smaller than the one before it."""
    return (t[..., 1:] < t[..., :-1]).any()


def _rises(t: torch.Tensor) -> torch.Tensor:
    """Whether any element along the last dimension is larger than the one before it."""
    return (t[..., 1:] > t[..., :-1]).any()


# -- segment_reduce -------------------------------------------------------------------------------


def _segment_reduce(data, reduce=None, *, lengths=None, indices=None, offsets=None, axis=0, unsafe=False,
                    initial=None) -> None:
    """The CPU kernel walks ``data`` along ``axis`` by the lengths (or between the offsets) of each
    row of ``lengths``, whose last dimension it takes as the axis. ``unsafe=True`` skips torch's own
    check of the lengths (``unsafe=False`` checks them, but not offsets): the server checks both always."""
    if indices is not None:
        _fail("segment_reduce(): indices based reduction is not supported yet.")
    if not isinstance(data, torch.Tensor) or not isinstance(axis, int) or not -data.dim() <= axis < data.dim():
        return  # torch refuses it (meta: an axis out of range) before reading a value
    axis %= data.dim()
    size = data.shape[axis]
    for name, t in (("lengths", lengths), ("offsets", offsets)):
        if not isinstance(t, torch.Tensor) or t.dtype not in _INDEX_DTYPES:
            continue  # absent, or not an index type torch dispatches on
        if t.dim() != axis + 1 or t.shape[:axis] != data.shape[:axis]:
            _fail(f"segment_reduce(): {name} must have data's sizes before axis {axis} and then the segments "
                  f"(expected {list(data.shape[:axis])} + [segments], got {list(t.shape)})")
        if not t.numel():
            if name == "offsets":
                _fail("segment_reduce(): offsets must have at least one element along axis")
            continue
        if name == "lengths":
            sums = t.sum(-1)  # wraps around int64 past 2^63, but is read only when every length is within the axis
            low, high, most, off = _host(t.min(), t.max(), sums.max(), (sums != size).any())
            if low < 0:
                _fail("lengths contains negative value!")
            if not unsafe and (high > size or off):
                _fail("segment_reduce(): Expected all rows of lengths along axis to sum to "
                      "data.size(lengths.dim()-1) when !unsafe.")
            if high > size or most > size:
                _fail(f"segment_reduce(): lengths along axis sum to more than data.size(axis) ({size}): "
                      "unsafe=True skips torch's check of them, this server does not")
        else:
            low, high, falls = _host(t.min(), t.max(), _falls(t))
            if low < 0 or high > size:
                _fail(f"segment_reduce(): offsets must be within [0, data.size(axis)] = [0, {size}]")
            if falls:
                _fail("segment_reduce(): offsets must be non-decreasing along axis (a segment's length "
                      "offsets[i+1] - offsets[i] is never negative)")


# -- packed sequences -----------------------------------------------------------------------------


def _batch_sizes(op: str, data, batch_sizes, batch: int | None = None) -> None:
    """A packed sequence's batch sizes (``nn.utils.rnn.pack_padded_sequence``'s): positive, never
    growing, summing to the packed rows; the first is the batch (the hidden state's, when given).
    The kernels write a per-sequence table and slice the data by them."""
    if not isinstance(data, torch.Tensor) or data.dim() < 1:
        return  # torch refuses it before reading a value
    if not isinstance(batch_sizes, torch.Tensor) or batch_sizes.dtype != torch.int64 or batch_sizes.dim() != 1 \
            or not batch_sizes.numel():
        _fail(f"{op}(): batch_sizes must be a non-empty 1-d int64 tensor (a PackedSequence's)")
    rows = data.shape[0]
    # the sum wraps around int64 past 2^63, but is read only when every batch size is within the rows
    low, high, first, grows, total = _host(batch_sizes.min(), batch_sizes.max(), batch_sizes[0], _rises(batch_sizes),
                                           batch_sizes.sum())
    if low < 1:
        _fail(f"{op}(): batch_sizes must be positive, got {low}")
    if grows:
        _fail(f"{op}(): batch_sizes must not increase (a PackedSequence's are sorted by decreasing length)")
    if high > rows or total != rows:
        _fail(f"{op}(): batch_sizes must sum to the packed data's first size {rows}")
    if batch is not None and first != batch:
        _fail(f"{op}(): batch_sizes[0] ({first}) must be the hidden state's batch size ({batch})")


def _pad_packed(data, batch_sizes, *args, **kwargs) -> None:
    _batch_sizes("_pad_packed_sequence", data, batch_sizes)


def _recurrent(name: str) -> Callable[..., None]:
    """``lstm``, ``gru``, ``rnn_tanh``, ``rnn_relu``: packed when their second argument is batch sizes
    (``(data, batch_sizes, hx, params, ...)``); unpacked calls (``(input, hx, params, ...)``) are meta's."""
    def check(data, second=None, hx=None, *args, **kwargs) -> None:
        if not (isinstance(second, torch.Tensor) and second.dtype == torch.int64):
            return
        state = hx[0] if isinstance(hx, (list, tuple)) and hx else hx
        if not isinstance(state, torch.Tensor) or state.dim() != 3:
            _fail(f"{name}(): a packed call's hidden state must be 3-d (layers x directions, batch, hidden)")
        _batch_sizes(name, data, second, state.shape[1])
    check.__name__ = f"_{name}"
    return check


# -- losses and lookups ---------------------------------------------------------------------------


def _ctc_labels(log_probs, targets, input_lengths, target_lengths, *args, **kwargs) -> None:
    """Each label the target lengths reach (``targets[b, :target_lengths[b]]``, or the first
    ``sum(target_lengths)`` of concatenated targets) indexes ``log_probs``' classes; torch's CPU kernel
    does not check them. The lengths are ``arg_checks.py``'s contract's, run first."""
    if not isinstance(targets, torch.Tensor) or targets.dtype not in _INDEX_DTYPES \
            or not isinstance(log_probs, torch.Tensor) or log_probs.dim() not in (2, 3):
        return  # torch refuses other targets before reading them; the contract, other log_probs
    classes, batch = log_probs.shape[-1], (log_probs.shape[1] if log_probs.dim() == 3 else 1)
    reach = torch.as_tensor(target_lengths).reshape(-1).tolist()
    if targets.dim() == 2:
        if targets.shape[0] != batch:
            _fail(f"ctc_loss(): padded targets must have a row per batch element ({batch}), got {targets.shape[0]}")
        reached = torch.arange(targets.shape[1], device=targets.device) < torch.as_tensor(
            reach, device=targets.device)[:, None]
        labels = targets[reached]
    elif targets.dim() == 1:
        labels = targets[:sum(reach)]
    else:
        _fail(f"ctc_loss(): targets must be 1-d (concatenated) or 2-d (padded), got {targets.dim()}-d")
    if labels.numel():
        low, high = _host(labels.min(), labels.max())
        if low < 0 or high >= classes:
            _fail(f"ctc_loss(): targets must be class indices in [0, {classes}) (log_probs' last dimension), "
                  f"got {low if low < 0 else high}")


def _embedding_bag(input, weight=None, offsets=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False,
                   mode="mean", sparse=False, per_sample_weights=None, include_last_offset=False,
                   padding_idx=None) -> None:
    """Bags are ``input[offsets[i]:offsets[i+1]]``: offsets start at 0, never fall, end within the
    input (with ``include_last_offset``, at its end: torch's CSR form; a shorter last offset leaves
    indices in no bag, whose gradient rows torch leaves unset)."""
    if not isinstance(input, torch.Tensor) or input.dim() != 1 or not isinstance(offsets, torch.Tensor) \
            or offsets.dim() != 1 or offsets.dtype not in _INDEX_DTYPES:
        return  # torch refuses it (or builds the offsets itself from a 2-d input) before reading a value
    length = input.shape[0]
    if not offsets.numel():
        if include_last_offset:
            _fail("include_last_offset: number of offset should be at least 1")
        return
    first, last, falls = _host(offsets[0], offsets[-1], _falls(offsets))
    if first != 0:
        _fail("offsets[0] has to be 0, i.e., the first sequence in the mini-batch has to start from position 0. "
              f"However, got {first}")
    if last > length:
        _fail(f"offsets[-1] can not be greater than input's length {length} but got offsets[-1] of {last}")
    if falls:
        _fail("embedding_bag(): offsets must be non-decreasing (each bag starts where the one before it does, "
              "or after)")
    if include_last_offset and last != length:
        _fail(f"embedding_bag(): with include_last_offset=True, offsets[-1] must be input's length {length} "
              f"(the CSR form), got {last}")


# -- views ----------------------------------------------------------------------------------------


def _ints(values: Any) -> list[int] | None:
    """A size or stride list as Python ints (a 0-d integer tensor counts), or None for anything else."""
    if not isinstance(values, (list, tuple, torch.Size)):
        return None
    out = []
    for v in values:
        if isinstance(v, torch.Tensor) and v.numel() == 1 and not v.is_floating_point() and not v.is_complex():
            v = int(v)
        if type(v) is not int:
            return None
        out.append(v)
    return out


def _as_strided(input, size=None, stride=None, storage_offset=None, **kwargs) -> None:
    """The view must lie within the input's storage. torch checks it in int64, which wraps around: a
    view of 2^62 elements of a 4-byte storage passes (and then reads whatever lies past it). Here it
    is reckoned in Python ints, and refused in torch's words with the true size."""
    if not isinstance(input, torch.Tensor):
        return
    sizes, strides = _ints(size), _ints(stride)
    offset = input.storage_offset() if storage_offset is None else storage_offset
    if sizes is None or strides is None or len(sizes) != len(strides) or type(offset) is not int \
            or min(sizes + strides + [offset], default=0) < 0:
        return  # torch refuses these itself, before making the view
    itemsize, held = input.element_size(), input.untyped_storage().nbytes()
    needed = 0 if 0 in sizes else (offset + 1 + sum((n - 1) * s for n, s in zip(sizes, strides))) * itemsize
    if needed > held:
        _fail(f"setStorage: sizes {sizes}, strides {strides}, storage offset {offset}, and itemsize {itemsize} "
              f"requiring a storage size of {needed} are out of bounds for storage of size {held}")


# -- LAPACK pivots and enums ----------------------------------------------------------------------


def _ldl_solve(LD, pivots, B=None, *, hermitian=False, **kwargs) -> None:
    """LAPACK's ``sytrs`` swaps rows by the pivots of ``ldl_factor`` (1-based, lower form): a positive
    pivot k names row k; a negative one a 2x2 block, given twice, on the row named by -k."""
    if not isinstance(LD, torch.Tensor) or LD.dim() < 2 or not isinstance(pivots, torch.Tensor) \
            or pivots.dtype not in _INDEX_DTYPES or pivots.shape != LD.shape[:-1]:
        return  # torch refuses these shapes and types before reading a value
    n = LD.shape[-1]
    for row in pivots.reshape(-1, n).tolist() if pivots.numel() else []:
        k = 0
        while k < n:
            p = row[k]
            if p == 0 or abs(p) > n:
                _fail(f"linalg.ldl_solve(): pivots must be in [-{n}, -1] or [1, {n}] (1-based, as ldl_factor "
                      f"gives them), got {p}")
            if p > 0:
                k += 1
                continue
            if k + 1 >= n or row[k + 1] != p:
                _fail("linalg.ldl_solve(): a negative pivot marks a 2x2 block: it must be given twice, on two "
                      "consecutive rows (as ldl_factor gives it)")
            k += 2


def _grid_sampler(name: str, modes: int) -> Callable[..., None]:
    """``grid_sampler_2d``/``_3d`` take their modes as ints (``F.grid_sample`` names them): another
    value is no case of the kernel's switch."""
    def check(input, grid, interpolation_mode=0, padding_mode=0, *args, **kwargs) -> None:
        if isinstance(interpolation_mode, int) and not 0 <= interpolation_mode < modes:
            _fail(f"{name}(): interpolation_mode must be 0 (bilinear), 1 (nearest)"
                  f"{' or 2 (bicubic)' if modes == 3 else ''}, got {interpolation_mode}")
        if isinstance(padding_mode, int) and not 0 <= padding_mode < 3:
            _fail(f"{name}(): padding_mode must be 0 (zeros), 1 (border) or 2 (reflection), got {padding_mode}")
    check.__name__ = f"_{name}"
    return check


VALUE_CHECKS: dict[str, Callable[..., None]] = {
    "segment_reduce": _segment_reduce,
    "_pad_packed_sequence": _pad_packed,
    **{name: _recurrent(name) for name in ("lstm", "gru", "rnn_tanh", "rnn_relu")},
    "nn.functional.ctc_loss": _ctc_labels,
    "nn.functional.embedding_bag": _embedding_bag,
    "as_strided": _as_strided,
    "linalg.ldl_solve": _ldl_solve,
    "grid_sampler_2d": _grid_sampler("grid_sampler_2d", 3),
    "grid_sampler_3d": _grid_sampler("grid_sampler_3d", 2),
}


def check_of(name: str, *, values: bool = True) -> Callable[..., None] | None:
    """Entry ``name``'s ``OpEntry.check``: its argument contract, then its value check (``values=False``:
    the contract alone, what the value fuzz compares with)."""
    contract = arg_checks.CHECKS.get(name)
    value = VALUE_CHECKS.get(name) if values else None
    if contract is None or value is None:
        return contract or value

    def both(*args: Any, **kwargs: Any) -> None:
        contract(*args, **kwargs)
        value(*args, **kwargs)
    return both
