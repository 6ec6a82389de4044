"""torch's device rule beside remote tensors, as beside CUDA ones: a local tensor with dimensions in an op
with remote tensors raises torch's own error at the user's line (no silent upload every step); a 0-d
CPU tensor is a constant; where torch itself takes CPU tensors beside another device's (indices,
``copy_``'s source, a basic assignment's value, packed sequences' lengths) they are uploaded."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from .test_device import recorded  # noqa: F401  (a fixture: a session whose programs are recorded)


def _mixed(sess, other: str = "cpu") -> str:
    return re.escape(f"Expected all tensors to be on the same device, but found at least two devices, {sess.device} "
                     f"and {other}!")


MIXES = {
    "add": lambda x, w, local: x + local,
    "radd": lambda x, w, local: local + x,
    "mul-function": lambda x, w, local: torch.mul(local, x),
    "linear-local-weight": lambda x, w, local: F.linear(x, local.reshape(1, 3)),
    "cat": lambda x, w, local: torch.cat([x, local]),
    "cross-entropy-local-target": lambda x, w, local: F.cross_entropy(w, torch.tensor([0, 2])),
    "embedding-local-indices": lambda x, w, local: F.embedding(torch.tensor([0, 1]), w),
    "where-local-condition": lambda x, w, local: torch.where(local > 0, x, 0.0),
    "in-place-local-operand": lambda x, w, local: x.add_(local),
    "local-module": lambda x, w, local: nn.Linear(3, 2)(x),
}


@pytest.mark.parametrize("name", list(MIXES))
def test_a_local_tensor_with_dimensions_raises_torchs_error_and_uploads_nothing(recorded, name):  # noqa: F811
    sess, recorder = recorded
    x, w = torch.randn(3).to(sess.device), torch.randn(2, 3).to(sess.device)
    sess.sync()
    puts = len(recorder.puts())
    with pytest.raises(RuntimeError, match=_mixed(sess)):  # at the call itself, not at a later flush
        MIXES[name](x, w, torch.randn(3))
    sess.sync()
    assert len(recorder.puts()) == puts, "nothing was uploaded"


def test_a_0d_cpu_tensor_is_a_constant_with_torchs_type_promotion(sess):
    t, i = torch.randn(3), torch.arange(3)
    x, k = t.to(sess.device), i.to(sess.device)
    for remote, local in ((x * torch.tensor(2.0, dtype=torch.float64), t * torch.tensor(2.0, dtype=torch.float64)),
                          (k + torch.tensor(1.5, dtype=torch.float64), i + torch.tensor(1.5, dtype=torch.float64)),
                          (torch.where(x > 0, x, torch.tensor(0.0)), torch.where(t > 0, t, torch.tensor(0.0))),
                          (torch.tensor(3) * k, torch.tensor(3) * i)):
        assert remote.device == sess.device and remote.dtype == local.dtype
        assert torch.equal(remote.cpu(), local)


def test_a_local_tensor_of_another_device_even_0d_is_refused(sess):
    x = torch.randn(3).to(sess.device)
    with pytest.raises(RuntimeError, match=_mixed(sess, "meta")):
        x + torch.tensor(1.0, device="meta")


def test_cpu_indices_work_as_torch_takes_them_for_a_tensor_of_any_device(sess):
    t = torch.arange(12.0).reshape(3, 4)
    x = t.to(sess.device)
    for index in ([0, 2], torch.tensor([2, 0]), torch.tensor([True, False, True]), (torch.tensor([0, 1]), [1, 3]),
                  (slice(None), torch.tensor([[0], [3]]))):
        assert torch.equal(x[index].cpu(), t[index])


def test_assignments_take_local_values_where_torch_does(sess):
    t = torch.zeros(3, 4)
    x = t.to(sess.device)
    for index, value in ((0, torch.arange(4.0)), ((slice(1, None), 2), torch.ones(2)), (..., torch.full((4,), 2.0))):
        x[index] = value  # basic indexing: torch's copy_, which takes a source from any device
        t[index] = value
    x.copy_(x.cpu() + 1)  # load_state_dict's copy_ of local values into remote parameters
    t.copy_(t + 1)
    assert torch.equal(x.cpu(), t)
    with pytest.raises(RuntimeError, match=_mixed(sess)):  # an advanced index is index_put_, which torch refuses
        x[torch.tensor([0, 1])] = torch.ones(2, 4)
    x[torch.tensor([0, 1])] = torch.tensor(5.0)  # ... unless the value is 0-d
    t[torch.tensor([0, 1])] = torch.tensor(5.0)
    assert torch.equal(x.cpu(), t)


def test_calls_that_read_only_another_tensors_shape_take_a_local_one(sess):
    t = torch.arange(6.0)
    x = t.to(sess.device)
    shape = torch.empty(2, 3)  # torch never asks which device `other` is on for these
    for remote, local in ((x.view_as(shape), t.view_as(shape)), (x.reshape_as(shape), t.reshape_as(shape)),
                          (x[:3].expand_as(shape), t[:3].expand_as(shape))):
        assert remote.device == sess.device and torch.equal(remote.cpu(), local)


def test_packed_sequences_keep_their_lengths_on_the_cpu_as_torch_does(sess):
    torch.manual_seed(0)
    lstm = nn.LSTM(3, 4, batch_first=True)
    x, lengths = torch.randn(2, 5, 3), torch.tensor([5, 3])

    def run(model, x):
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True)
        out, _ = model(packed)
        return nn.utils.rnn.pad_packed_sequence(out, batch_first=True)

    want, want_lengths = run(lstm, x)
    got, got_lengths = run(lstm.to(sess.device), x.to(sess.device))
    assert got.device == sess.device and got_lengths.device.type == "cpu"
    torch.testing.assert_close(got.cpu(), want.detach(), rtol=1e-5, atol=1e-6)
    assert torch.equal(got_lengths, want_lengths)


def test_a_local_gradient_for_a_remote_output_is_refused_with_torchs_words(sess):
    x = torch.randn(3).to(sess.device).requires_grad_()
    y = x * 2
    with pytest.raises(RuntimeError, match=re.escape(f"invalid gradient at index 0 - expected device {sess.device} "
                                                     "but got cpu")):
        y.backward(torch.ones(3))
    with pytest.raises(RuntimeError, match="assigned grad has data located on a different device"):
        x.grad = torch.ones(3)
    y.backward(torch.ones(3).to(sess.device))
    assert torch.equal(x.grad.cpu(), torch.full((3,), 2.0))
