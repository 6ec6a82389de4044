"""The value checks (``service/ops/value_checks.py``) refuse what a kernel would index memory by, and nothing torch runs.

Each crashing call issue 31 found (``tests/fuzz/_calls.known``) is refused by the server's check
before its kernel (``meta_check.check_call``: on the code before the checks these passed it, and the
kernel crashed the process; ``tests/ops/test_value_fuzz.py`` shows the crashes in children). Where torch
refuses a bad value itself (with its safe flag, or on another device), the check answers torch's
words; valid calls of every checked op (packed sequences, padded targets with padding past their
lengths, 2x2 pivot blocks) pass and compute what torch computes.
"""

from __future__ import annotations

import pytest
import torch

from remote_autograd.proto import ProtocolError
from remote_autograd.service.engine import meta_check
from remote_autograd.service.ops import OP_TABLE, value_checks

from ..fuzz import _calls

F = torch.nn.functional


def _check(op: str, args: list, kwargs: dict | None = None) -> int:
    """The bytes the call's new outputs will hold, once the meta check passed it."""
    entry = OP_TABLE.get(op)
    return meta_check.check_call(entry, list(args), dict(kwargs or {}), inplace=False, grad_enabled=False).bytes


def _refusal(op: str, args: list, kwargs: dict | None = None) -> str:
    with pytest.raises(ProtocolError) as caught:
        _check(op, args, kwargs)
    assert caught.value.status == 422, caught.value
    return caught.value.message


@pytest.mark.parametrize("call", _calls.known(), ids=lambda c: f"{c.op}-{c.kwargs.get('mode', '')}{list(c.kwargs)}")
def test_each_crasher_is_refused_before_its_kernel(call):
    _refusal(call.op, call.args, call.kwargs)


def _torch_says(fn, *args, **kwargs) -> str:
    with pytest.raises(Exception) as caught:
        fn(*args, **kwargs)
    return str(caught.value).split("\n")[0]


def test_torch_refusals_keep_torch_wording():
    """What torch itself refuses (segment_reduce under unsafe=False, embedding_bag's offsets) is refused
    in torch's words: with unsafe=True too, where torch would have skipped the check."""
    data = torch.arange(4.0)
    for lengths in ([3, -1, 2], [1, 1]):
        want = _torch_says(torch.segment_reduce, data, "sum", lengths=torch.tensor(lengths))
        assert _refusal("segment_reduce", [data, "sum"], {"lengths": torch.tensor(lengths)}) == want
    assert _refusal("segment_reduce", [data, "sum"], {"lengths": torch.tensor([3, -1, 2]), "unsafe": True}) \
        == "lengths contains negative value!"
    weight = torch.randn(10, 3)
    for offsets in ([1, 2], [0, 9]):
        want = _torch_says(F.embedding_bag, torch.tensor([1, 2, 3]), weight, torch.tensor(offsets))
        assert _refusal("nn.functional.embedding_bag", [torch.tensor([1, 2, 3]), weight, torch.tensor(offsets)]) == want


def _lstm_params(gates: int, directions: int, hidden: int = 3, inputs: int = 2) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=g) for _ in range(directions)
            for s in ((gates * hidden, inputs), (gates * hidden, hidden), (gates * hidden,), (gates * hidden,))]


def _valid_calls():
    """(op, args, kwargs, torch callable): calls torch runs, some on the edge the checks draw."""
    g = torch.Generator().manual_seed(0)
    packed = torch.randn(6, 2, generator=g)
    for op, gates in (("lstm", 4), ("gru", 3), ("rnn_tanh", 1), ("rnn_relu", 1)):
        for directions in (1, 2):
            h0 = torch.zeros(directions, 3, 3)
            hx = [h0, h0] if op == "lstm" else h0
            yield op, [packed, torch.tensor([3, 2, 1]), hx, _lstm_params(gates, directions), True, 1, 0.0, False,
                       directions == 2], {}, getattr(torch, op)
    yield "_pad_packed_sequence", [packed, torch.tensor([3, 2, 1]), True, -1.0, 5], {}, torch._pad_packed_sequence
    log_probs = torch.randn(6, 2, 5, generator=g).log_softmax(2)
    padded = torch.tensor([[1, 4, 2], [3, -1, 99]])  # the second's padding past its length: never read
    yield "nn.functional.ctc_loss", [log_probs, padded, torch.tensor([6, 4]), torch.tensor([3, 1])], {}, F.ctc_loss
    yield "nn.functional.ctc_loss", [log_probs, torch.tensor([1, 4, 3]), [6, 5], [2, 1]], {}, F.ctc_loss
    weight = torch.randn(10, 3, generator=g)
    yield "nn.functional.embedding_bag", [torch.tensor([1, 2, 3, 9]), weight, torch.tensor([0, 2, 2, 4])], \
        {"include_last_offset": True, "mode": "max"}, F.embedding_bag
    yield "nn.functional.embedding_bag", [torch.tensor([1, 2, 3]), weight, torch.tensor([0, 0, 3])], {}, F.embedding_bag
    data = torch.arange(12.0).reshape(2, 6)
    yield "segment_reduce", [data, "sum"], {"lengths": torch.tensor([[2, 4], [6, 0]]), "axis": 1}, torch.segment_reduce
    yield "segment_reduce", [data, "max"], {"lengths": torch.tensor([[1, 2], [3, 0]]), "axis": 1, "unsafe": True}, \
        torch.segment_reduce
    yield "segment_reduce", [data, "mean"], {"offsets": torch.tensor([[0, 2, 6], [0, 3, 3]]), "axis": 1}, \
        torch.segment_reduce
    indefinite = torch.tensor([[0.0, 1.0, 2.0], [1.0, 0.0, 3.0], [2.0, 3.0, 1.0]], dtype=torch.float64)
    ld, pivots, _ = torch.linalg.ldl_factor_ex(indefinite)
    assert (pivots < 0).any()  # a 2x2 block, as the check reads them
    yield "linalg.ldl_solve", [ld, pivots, torch.eye(3, dtype=torch.float64)], {}, torch.linalg.ldl_solve
    image, grid = torch.randn(1, 1, 3, 3, generator=g), torch.rand(1, 2, 2, 2, generator=g) * 2 - 1
    yield "grid_sampler_2d", [image, grid, 2, 2, True], {}, torch.grid_sampler_2d
    yield "grid_sampler_3d", [image[None], torch.rand(1, 2, 2, 2, 3, generator=g), 1, 1, False], {}, \
        torch.grid_sampler_3d


@pytest.mark.parametrize("op,args,kwargs,fn", list(_valid_calls()),
                         ids=lambda v: v if isinstance(v, str) else None)
def test_valid_calls_pass_and_compute_what_torch_does(op, args, kwargs, fn):
    _check(op, args, kwargs)
    entry = OP_TABLE.get(op)
    ours, theirs = entry.fn(*args, **kwargs), fn(*args, **kwargs)
    for a, b in zip(*(x if isinstance(x, tuple) else (x,) for x in (ours, theirs))):
        if isinstance(a, torch.Tensor):
            torch.testing.assert_close(a, b, equal_nan=True)


@pytest.mark.parametrize("op,args,kwargs,words", [
    ("segment_reduce", [torch.arange(4.0), "sum"], {"offsets": torch.tensor([0, 3, 2, 4])}, "non-decreasing"),
    ("segment_reduce", [torch.arange(4.0), "sum"], {"offsets": torch.tensor([-4, 0, 4])}, "[0, 4]"),
    ("segment_reduce", [torch.arange(8.0).reshape(2, 4), "sum"], {"lengths": torch.tensor([4]), "axis": 1},
     "before axis"),
    ("segment_reduce", [torch.arange(4.0), "sum"], {"lengths": torch.tensor([1 << 62] * 4), "unsafe": True},
     "sum to more"),
    ("_pad_packed_sequence", [torch.randn(3, 2), torch.tensor([1, 2]), False, 0.0, 0], {}, "not increase"),
    ("_pad_packed_sequence", [torch.randn(3, 2), torch.tensor([2, 0, 1]), False, 0.0, 0], {}, "positive"),
    ("_pad_packed_sequence", [torch.randn(3, 2), torch.tensor([1 << 62] * 4), False, 0.0, 0], {}, "sum to"),
    ("gru", [torch.randn(3, 2), torch.tensor([3]), torch.zeros(1, 2, 3), _lstm_params(3, 1), True, 1, 0.0, False,
             False], {}, "hidden state's batch"),
    ("nn.functional.ctc_loss", [torch.randn(5, 1, 4).log_softmax(2), torch.tensor([[1, 4]]), [5], [2]], {}, "[0, 4)"),
    ("nn.functional.ctc_loss", [torch.randn(5, 2, 4).log_softmax(2), torch.tensor([1, 2, 3]), [5, 5],
                                [1 << 62, 1 << 62]], {}, "sum to more"),
    ("nn.functional.embedding_bag", [torch.tensor([1, 2, 3]), torch.randn(10, 3), torch.tensor([0, 2, 1])],
     {"mode": "max"}, "non-decreasing"),
    ("nn.functional.embedding_bag", [torch.tensor([1, 2, 3]), torch.randn(10, 3), torch.tensor([0, 2])],
     {"include_last_offset": True}, "CSR"),
    ("linalg.ldl_solve", [torch.eye(3), torch.tensor([1, -1, 3], dtype=torch.int32), torch.eye(3)], {}, "2x2"),
    ("linalg.ldl_solve", [torch.eye(3), torch.tensor([1, 0, 3], dtype=torch.int32), torch.eye(3)], {}, "[1, 3]"),
    ("grid_sampler_3d", [torch.randn(1, 1, 2, 2, 2), torch.rand(1, 1, 1, 1, 3), 9, 0, False], {}, "interpolation_mode"),
    ("grid_sampler_2d", [torch.randn(1, 1, 2, 2), torch.rand(1, 1, 1, 2), 0, 3, False], {}, "padding_mode"),
])
def test_values_a_kernel_would_misuse_are_refused_by_name(op, args, kwargs, words):
    assert words in _refusal(op, args, kwargs)


def test_every_check_is_its_entrys_and_keeps_the_entrys_contract():
    for name in value_checks.VALUE_CHECKS:
        entry = OP_TABLE.get(name)
        assert entry is not None and entry.check is not None, name
    # ctc_loss has both: the lengths contract (arg_checks.py: it stands in for a meta kernel torch lacks), then the labels
    log_probs = torch.randn(5, 1, 4).log_softmax(2)
    assert "target_lengths" in _refusal("nn.functional.ctc_loss", [log_probs, torch.tensor([[1]]), [5], [-1]])
    assert "class indices" in _refusal("nn.functional.ctc_loss", [log_probs, torch.tensor([[-3]]), [5], [1]])
    assert value_checks.check_of("nn.functional.ctc_loss", values=False) is not None


def test_a_view_torch_reckons_past_int64_is_refused():
    """``x.as_strided_([2**62], [1])`` of a 4-byte storage: torch's bounds check wraps around and passes."""
    x = torch.zeros(1)
    torch.zeros(1).as_strided_([1 << 62], [1])  # torch itself lets it through: the check is the server's
    inplace = OP_TABLE.resolve("Tensor.as_strided_")
    with pytest.raises(ProtocolError, match="requiring a storage size of 18446744073709551616"):
        meta_check.check_call(inplace.entry, [x, [1 << 62], [1]], {}, inplace=True, grad_enabled=False,
                              fn=inplace.fn, writes=inplace.writes)
    assert _check("as_strided", [torch.zeros(4), [2], [2]], {"storage_offset": 1}) == 0
    want = _torch_says(torch.as_strided, torch.zeros(4), [3], [2])
    assert _refusal("as_strided", [torch.zeros(4), [3], [2]]) == want
