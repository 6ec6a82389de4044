"""Recurrent layers and cells, as ``nn.RNN`` / ``nn.LSTM`` / ``nn.GRU`` and their cells call them.

``nn.LSTM.forward`` ends in ``torch._VF.lstm(input, hx, self._flat_weights, ...)``
(``torch.lstm`` as ``__torch_function__`` names it), the cells in ``torch._VF.lstm_cell``
and friends: torch's own kernels and derivatives (on CPU and without cuDNN they are
compositions of matmuls and pointwise ops, so twice differentiable). The flat weights
arrive as a list of the module's parameters; ``RNNBase.flatten_parameters`` does
nothing off CUDA, so the parameters stay the module's own. The layers take
``dropout`` between layers in training, drawn from the session's generator;
samples use ``dropout=0`` so gradcheck sees one function.
"""

from __future__ import annotations

import math

import torch

from ._native import native_op
from ._samples import S, T

_IN, _H, _N, _L = 2, 2, 2, 3  # input features, hidden size, batch, sequence length


def _weights(gates: int, layers: int = 1, directions: int = 1, bias: bool = True) -> list[T]:
    """A layer's flat weights in torch's order: per layer and direction w_ih, w_hh[, b_ih, b_hh]."""
    out = []
    for layer in range(layers):
        inp = _IN if layer == 0 else _H * directions
        for _ in range(directions):
            out += [T((gates * _H, inp), low=-0.7, high=0.7), T((gates * _H, _H), low=-0.7, high=0.7)]
            if bias:
                out += [T((gates * _H,), low=-0.5, high=0.5), T((gates * _H,), low=-0.5, high=0.5)]
    return out


def _h(layers: int = 1, directions: int = 1) -> T:
    return T((layers * directions, _N, _H), low=-0.5, high=0.5)


def _packed_bound(data, batch_sizes, hx, *rest):
    """Elements a packed recurrent call ``(data, batch_sizes, hx, params, has_biases, num_layers,
    dropout, train, bidirectional)`` makes: an output row of ``hidden x directions`` per packed row,
    and the final states (shaped as ``hx``). Unpacked calls are derived on meta and never get here."""
    states = hx if isinstance(hx, (list, tuple)) else [hx]
    hidden = states[0].shape[-1] if states[0].dim() else 1
    bidirectional = len(rest) > 5 and rest[5] is True
    return data.shape[0] * hidden * (2 if bidirectional else 1) + sum(h.numel() for h in states)


def _padded_bound(data, batch_sizes, batch_first, padding_value, total_length):
    """``_pad_packed_sequence``'s output: the longest length (or ``total_length``) x the batch x a
    row's elements, and the lengths."""
    steps, batch = max(len(batch_sizes), total_length), (int(batch_sizes[0]) if len(batch_sizes) else 0)
    return steps * batch * math.prod(data.shape[1:]) + batch


def _batch_sizes_on_cpu(torch_fn):
    """``torch_fn`` with an int64 second argument (a packed sequence's ``batch_sizes`` or ``lengths``)
    moved to the CPU, where torch requires it; a GPU server keeps uploads on the GPU. Unpacked calls
    (a float ``hx`` second) pass unchanged."""
    def run(input, second, *rest, **kwargs):
        if isinstance(second, torch.Tensor) and second.dtype == torch.int64:
            second = second.cpu()
        return torch_fn(input, second, *rest, **kwargs)
    run.__name__ = torch_fn.__name__
    return run


_SEQ = T((_L, _N, _IN))
_SEQ_BATCH_FIRST = T((_N, _L, _IN))

# torch.lstm(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first)
_PACKED, _BATCH_SIZES = T((5, _IN)), torch.tensor([2, 2, 1])  # packed data of lengths 3 and 2, and its batch sizes

native_op("lstm", _batch_sizes_on_cpu(torch.lstm), torch_names=("torch.lstm",), reference=torch.lstm,
          data_dependent=True, output_bound=_packed_bound, random=True,
          exact=True,
          samples=(S(_SEQ, [_h(), _h()], _weights(4), True, 1, 0.0, True, False, False),
                   # the packed overload: (data, batch_sizes, hx, params, has_biases, layers, dropout, train, bidir)
                   S(_PACKED, _BATCH_SIZES, [_h(1, 2), _h(1, 2)], _weights(4, 1, 2), True, 1, 0.0, True, True),
                   S(_SEQ_BATCH_FIRST, [_h(2, 2), _h(2, 2)], _weights(4, 2, 2), True, 2, 0.0, True, True, True),
                   S(_SEQ, [_h(1, 2), _h(1, 2)], _weights(4, 1, 2, bias=False), False, 1, 0.0, False, True, False)))
native_op("gru", _batch_sizes_on_cpu(torch.gru), torch_names=("torch.gru",), reference=torch.gru,
          data_dependent=True, output_bound=_packed_bound, random=True,
          exact=True,
          samples=(S(_SEQ, _h(), _weights(3), True, 1, 0.0, True, False, False),
                   S(_SEQ_BATCH_FIRST, _h(2, 2), _weights(3, 2, 2), True, 2, 0.0, True, True, True)))
native_op("rnn_tanh", _batch_sizes_on_cpu(torch.rnn_tanh), torch_names=("torch.rnn_tanh",), reference=torch.rnn_tanh,
          data_dependent=True, output_bound=_packed_bound,
          random=True, exact=True,
          samples=(S(_SEQ, _h(), _weights(1), True, 1, 0.0, True, False, False),
                   S(_SEQ, _h(2, 2), _weights(1, 2, 2), True, 2, 0.0, True, True, False)))
native_op("rnn_relu", _batch_sizes_on_cpu(torch.rnn_relu), torch_names=("torch.rnn_relu",), reference=torch.rnn_relu,
          data_dependent=True, output_bound=_packed_bound,
          random=True, exact=True,
          samples=(S(_SEQ_BATCH_FIRST, _h(), _weights(1), True, 1, 0.0, True, False, True),))

_X, _HX = T((_N, _IN)), T((_N, _H), low=-0.5, high=0.5)


def _cell(gates: int, bias: bool = True) -> list[T]:
    return _weights(gates, bias=bias)


# torch.lstm_cell(input, (h, c), w_ih, w_hh, b_ih, b_hh) -> (h, c); the others return h
native_op("lstm_cell", torch.lstm_cell, torch_names=("torch.lstm_cell",),
          samples=(S(_X, [_HX, _HX], *_cell(4)), S(_X, [_HX, _HX], *_cell(4, bias=False))))
native_op("gru_cell", torch.gru_cell, torch_names=("torch.gru_cell",),
          samples=(S(_X, _HX, *_cell(3)), S(_X, _HX, *_cell(3, bias=False))))
native_op("rnn_tanh_cell", torch.rnn_tanh_cell, torch_names=("torch.rnn_tanh_cell",),
          samples=(S(_X, _HX, *_cell(1)),))
native_op("rnn_relu_cell", torch.rnn_relu_cell, torch_names=("torch.rnn_relu_cell",),
          samples=(S(_X, _HX, *_cell(1)),))


# Packed sequences: pack_padded_sequence / pad_packed_sequence call these; the layers then take
# torch.lstm's packed overload (data, batch_sizes, hx, params, ...). ``lengths`` and ``batch_sizes``
# are int64 tensors that torch wants on the CPU, as they are on a CPU server.
_LENGTHS = torch.tensor([3, 2])  # the lengths of _SEQ's two sequences
native_op("_pack_padded_sequence", _batch_sizes_on_cpu(torch._pack_padded_sequence),
          reference=torch._pack_padded_sequence, torch_names=("torch._pack_padded_sequence",), data_dependent=True,
          samples=(S(_SEQ, _LENGTHS, False), S(_SEQ_BATCH_FIRST, _LENGTHS, True)))
native_op("_pad_packed_sequence", _batch_sizes_on_cpu(torch._pad_packed_sequence),
          reference=torch._pad_packed_sequence, torch_names=("torch._pad_packed_sequence",), data_dependent=True,
          output_bound=_padded_bound,
          samples=(S(_PACKED, _BATCH_SIZES, False, 0.0, 3), S(_PACKED, _BATCH_SIZES, True, -1.0, 4)))
