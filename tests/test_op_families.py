"""The op families real models use, end to end through the SDK against local torch.

Each test builds a torch module (or optimizer) with a fixed seed, runs it locally and
on remote parameters (``sess.module``) on the same data, and compares outputs, the
input's gradient and every parameter's gradient (float64 where the comparison would
otherwise be dominated by float32 rounding).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from remote_autograd import client

TOL = dict(rtol=1e-5, atol=1e-6)


def _data(*shape, seed=1, dtype=torch.float64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _flat(out):
    """Every tensor in a module's output (``(output, (h, c))`` and the like), in order."""
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for o in out if o is not None for t in _flat(o)]


def _local_copy(v):
    """A fresh local input: floating tensors require grad (tuples, as ``(h, c)``, element-wise)."""
    if isinstance(v, tuple):
        return tuple(_local_copy(t) for t in v)
    return v.clone().requires_grad_(v.is_floating_point())


def _to_remote(v, sess):
    if isinstance(v, tuple):
        return tuple(_to_remote(t, sess) for t in v)
    return client.RemoteTensor.from_torch(v, sess)


def _run_both(sess, module, *inputs, **kwargs):
    """``module(*inputs)`` locally and on the server; the outputs, the first input's grad and every
    parameter's grad must match. Returns the remote module."""
    remote = sess.module(module)
    local_in = [_local_copy(x) for x in inputs]
    remote_in = [_to_remote(x, sess) for x in local_in]
    local_out, remote_out = _flat(module(*local_in, **kwargs)), _flat(remote(*remote_in, **kwargs))
    assert len(local_out) == len(remote_out)
    seeds = [_data(*o.shape, seed=7 + i, dtype=o.dtype) for i, o in enumerate(local_out)]
    torch.autograd.backward(local_out, seeds)
    torch.autograd.backward(remote_out, seeds)
    for r, l in zip(remote_out, local_out):
        torch.testing.assert_close(r.to_torch().detach(), l.detach(), **TOL)
    for r, l in zip(_flat(remote_in), _flat(local_in)):
        if l.grad is not None:
            torch.testing.assert_close(r.grad.to_torch(), l.grad, **TOL)
    local_params, remote_params = dict(module.named_parameters()), dict(remote.named_parameters())
    for name, p in local_params.items():
        assert remote_params[name].grad is not None, f"{name} got no gradient on the server"
        torch.testing.assert_close(remote_params[name].grad.to_torch(), p.grad, **TOL, msg=name)
    return remote


def _recurrent(kind, **kwargs):
    torch.manual_seed(0)
    return getattr(nn, kind)(3, 4, dtype=torch.float64, **kwargs)


def _hx(kind, layers_times_directions):
    h = _data(layers_times_directions, 2, 4, seed=2)
    return (h, _data(layers_times_directions, 2, 4, seed=3)) if kind == "LSTM" else h


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
def test_bidirectional_multilayer_recurrent_layers(sess, kind):
    layer = _recurrent(kind, num_layers=2, bidirectional=True)
    _run_both(sess, layer, _data(5, 2, 3), _hx(kind, 4))


@pytest.mark.xfail(strict=True, raises=NotImplementedError,
                   reason="hx=None makes torch.zeros(..., device=input.device): needs `remote` as a real device "
                          "(issue 13 point 1, the DEVICE branch); drop this mark when that lands")
def test_recurrent_layer_without_hx(sess):
    _run_both(sess, _recurrent("LSTM"), _data(5, 2, 3))


def test_batch_first_lstm_with_hx_and_grads(sess):
    torch.manual_seed(0)
    layer = _recurrent("LSTM", batch_first=True, bias=False)
    _run_both(sess, layer, _data(2, 5, 3), _hx("LSTM", 1))


@pytest.mark.parametrize("kind", ["LSTMCell", "GRUCell", "RNNCell"])
def test_cells(sess, kind):
    hx = _hx("LSTM", 1) if kind == "LSTMCell" else _hx("GRU", 1)
    _run_both(sess, _recurrent(kind), _data(2, 3), tuple(h[0] for h in hx) if kind == "LSTMCell" else hx[0])


def test_multihead_attention_with_masks(sess):
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, dtype=torch.float64)
    x = _data(5, 3, 8)
    causal = torch.triu(torch.ones(5, 5, dtype=torch.bool), 1)
    padding = torch.zeros(3, 5, dtype=torch.bool)
    padding[1, 4] = True
    _run_both(sess, mha, x, x, x, attn_mask=causal, key_padding_mask=padding)


def test_transformer_encoder(sess):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True, dtype=torch.float64)
    encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    _run_both(sess, encoder, _data(2, 5, 8))


def test_transformer_decoder_layer(sess):
    torch.manual_seed(0)
    layer = nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0, dtype=torch.float64)
    _run_both(sess, layer, _data(4, 2, 8), _data(5, 2, 8, seed=2))


def test_attention_dropout_draws_from_the_session_generator(sess):
    q = _data(2, 4, 3, dtype=torch.float32)
    sess.manual_seed(5)
    torch.manual_seed(5)
    remote = F.scaled_dot_product_attention(*[client.RemoteTensor.from_torch(q, sess)] * 3, dropout_p=0.5)
    local = F.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
    torch.testing.assert_close(remote.to_torch(), local, **TOL)
