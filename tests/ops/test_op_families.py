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
from ..bits import fit

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
    remote = sess.module(copy.deepcopy(module))  # sess.module moves in place, as module.to(device)
    local_in = [_local_copy(x) for x in inputs]
    remote_in = [_to_remote(x, sess) for x in local_in]
    remote_kwargs = {k: v.to(sess.device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    local_out, remote_out = _flat(module(*local_in, **kwargs)), _flat(remote(*remote_in, **remote_kwargs))
    assert len(local_out) == len(remote_out)
    seeds = [_data(*o.shape, seed=7 + i, dtype=o.dtype) for i, o in enumerate(local_out)]
    torch.autograd.backward(local_out, seeds)
    torch.autograd.backward(remote_out, [seed.to(sess.device) for seed in seeds])
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


class _Seq2Seq(nn.Module):
    """nn.Transformer with a causal target mask made on the input's device, as model code writes it."""

    def __init__(self):
        super().__init__()
        self.transformer = nn.Transformer(8, 2, 1, 1, 16, dropout=0.0, batch_first=True, dtype=torch.float64)

    def forward(self, src, tgt):
        mask = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1], device=tgt.device, dtype=tgt.dtype)
        return self.transformer(src, tgt, tgt_mask=mask, tgt_is_causal=True)


def test_transformer_with_a_causal_mask(sess):
    torch.manual_seed(0)
    _run_both(sess, _Seq2Seq(), _data(2, 5, 8), _data(2, 4, 8, seed=2))


def test_attention_dropout_draws_from_the_session_generator(sess):
    q = _data(2, 4, 3, dtype=torch.float32)
    sess.manual_seed(5)
    torch.manual_seed(5)
    remote = F.scaled_dot_product_attention(*[client.RemoteTensor.from_torch(q, sess)] * 3, dropout_p=0.5)
    local = F.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
    torch.testing.assert_close(remote.to_torch(), local, **TOL)


# -- optimizers ------------------------------------------------------------------------------------

def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)).double()


def _train(model, opt, steps=6):
    """A few steps of regression on fixed data (on the model's device); the losses and the final parameters."""
    device = next(model.parameters()).device
    return fit(model, opt, F.mse_loss, _data(16, 6, seed=4).to(device), _data(16, 3, seed=5).to(device), steps)


OPTIMIZERS = {
    "adam-foreach": lambda p: torch.optim.Adam(p, lr=0.01, foreach=True),
    "adamw-foreach-amsgrad": lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1, amsgrad=True, foreach=True),
    "adam-amsgrad": lambda p: torch.optim.Adam(p, lr=0.01, amsgrad=True, foreach=False),
    "adamax": lambda p: torch.optim.Adamax(p, lr=0.01, foreach=False),
    "adamax-foreach": lambda p: torch.optim.Adamax(p, lr=0.01, foreach=True),
    "sgd-foreach-momentum": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3,
                                                      foreach=True),
    "rmsprop-foreach": lambda p: torch.optim.RMSprop(p, lr=0.01, momentum=0.5, centered=True, foreach=True),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizers_match_local_torch(sess, name):
    local = _mlp()
    remote = sess.module(copy.deepcopy(local))
    want = _train(local, OPTIMIZERS[name](local.parameters()))
    got = _train(remote, OPTIMIZERS[name](remote.parameters()))
    torch.testing.assert_close(got, want, **TOL)
    for k, v in local.state_dict().items():
        torch.testing.assert_close(remote.state_dict()[k].cpu(), v, **TOL, msg=k)


def test_out_argument_writes_the_given_tensor(sess):
    a, b = _data(3, 4), _data(3, 4, seed=2)
    ra, rb = client.RemoteTensor.from_torch(a, sess), client.RemoteTensor.from_torch(b, sess)
    out = client.RemoteTensor.from_torch(torch.zeros(3, 4, dtype=torch.float64), sess)
    returned = torch.maximum(ra, rb, out=out)
    assert returned is out
    torch.testing.assert_close(out.to_torch(), torch.maximum(a, b))


def test_out_argument_refuses_a_graph_like_torch(sess):
    ra = client.RemoteTensor.from_torch(_data(3).requires_grad_(), sess)
    out = client.RemoteTensor.from_torch(torch.zeros(3, dtype=torch.float64), sess)
    with pytest.raises(RuntimeError, match="out=... arguments don't support automatic differentiation"):
        torch.maximum(ra, ra * 2, out=out)
    with pytest.raises(RuntimeError, match="out= has shape"):
        torch.maximum(ra.detach(), ra.detach(), out=client.RemoteTensor.from_torch(torch.zeros(2), sess))


def test_foreach_inplace_with_grad_is_refused_loudly(sess):
    params = [client.RemoteTensor.from_torch(_data(3).requires_grad_(), sess)]
    with pytest.raises(RuntimeError, match=r"_foreach_add_ .*torch.no_grad"):
        torch._foreach_add_([p * 1 for p in params], 1.0)


@pytest.mark.parametrize("line_search", [None, "strong_wolfe"])
def test_lbfgs_matches_local_torch(sess, line_search):
    """LBFGS reads values every iteration (``float(closure())``, ``.dot``, comparisons): it must still
    follow local torch step for step."""
    def run(model):
        device = next(model.parameters()).device
        x, y = _data(16, 6, seed=4).to(device), _data(16, 3, seed=5).to(device)
        opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=5, history_size=4, line_search_fn=line_search)
        losses = []

        def closure():
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            return loss

        for _ in range(3):
            losses.append(opt.step(closure).item())
        return losses

    local = _mlp()
    remote = sess.module(copy.deepcopy(local))
    want, got = run(local), run(remote)
    torch.testing.assert_close(got, want, **TOL)
    for k, v in local.state_dict().items():
        torch.testing.assert_close(remote.state_dict()[k].cpu(), v, **TOL, msg=k)


def _scaled_training(model, steps=4, grads_inf_at=2):
    """GradScaler steps; at step ``grads_inf_at`` one grad is made inf, so that step is skipped
    and the scale backs off, as in torch."""
    device = next(model.parameters()).device
    x, y = _data(16, 6, seed=4).to(device), _data(16, 3, seed=5).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    device_type = device.type  # "cpu", or "remote": the scaler of the model's device
    scaler = torch.amp.GradScaler(device_type, init_scale=2.0 ** 4, growth_interval=1)
    scales = []
    for step in range(steps):
        opt.zero_grad()
        scaler.scale(F.mse_loss(model(x), y)).backward()
        if step == grads_inf_at:
            with torch.no_grad():
                model[0].bias.grad.mul_(float("inf"))
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    return scales


def test_grad_scaler_unscales_and_skips_inf_steps_on_the_server(sess):
    local = _mlp()
    remote = sess.module(copy.deepcopy(local))
    want, got = _scaled_training(local), _scaled_training(remote)
    assert got == want and want[2] < want[1]  # the inf step backed off
    for k, v in local.state_dict().items():
        torch.testing.assert_close(remote.state_dict()[k].cpu(), v, **TOL, msg=k)


def test_packed_sequences_through_an_lstm(sess):
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    class Packed(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(3, 4, num_layers=2, bidirectional=True, dtype=torch.float64)

        def forward(self, x, hx):
            out, _ = self.lstm(pack_padded_sequence(x, [5, 3], enforce_sorted=True), hx)
            return pad_packed_sequence(out, total_length=6)[0]

    torch.manual_seed(0)
    _run_both(sess, Packed(), _data(6, 2, 3), _hx("LSTM", 4))


@pytest.mark.parametrize("name", ["Adam", "AdamW", "SGD"])
def test_fused_optimizers_match_local_torch(sess, name):
    make = lambda p: getattr(torch.optim, name)(p, lr=0.01, fused=True)  # noqa: E731
    local = _mlp()
    remote = sess.module(copy.deepcopy(local))
    want, got = _train(local, make(local.parameters())), _train(remote, make(remote.parameters()))
    torch.testing.assert_close(got, want, **TOL)
