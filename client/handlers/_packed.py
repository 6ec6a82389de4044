"""Packed sequences: ``pack_padded_sequence`` / ``pad_packed_sequence`` on RemoteTensors.

torch insists that a ``PackedSequence``'s ``batch_sizes`` (and the ``lengths`` that
``pad_packed_sequence`` returns) live on the CPU. Both depend only on the lengths,
never on the data, so they are computed here on a one-wide local tensor, while the
data is packed (or padded) on the server by the same torch op; the copy of the
lengths the server also returns is dropped.
"""

from __future__ import annotations

import torch

from .._core import RemoteTensor, call_op
from ._handler_table import HandlerTable

HANDLERS = HandlerTable()
_answers = HANDLERS.on


def _local_copy(t):
    """``lengths`` / ``batch_sizes`` as torch wants them: a local CPU tensor (read back if remote)."""
    return t.to_torch() if isinstance(t, RemoteTensor) else t


def _server_half(func, args: tuple, kwargs: dict):
    """``func(*args)`` run on the server: the first output (the data) of its two."""
    return call_op(args[0]._session, func, args, kwargs)[0]


@_answers(torch._pack_padded_sequence)
def _pack_padded_sequence(input, lengths, batch_first):
    lengths = _local_copy(lengths)
    width = torch.zeros(*input.shape[:2], 1)  # torch refuses to pack an empty tensor
    _, batch_sizes = torch._pack_padded_sequence(width, lengths, batch_first)
    return _server_half(torch._pack_padded_sequence, (input, lengths, batch_first), {}), batch_sizes


@_answers(torch._pad_packed_sequence)
def _pad_packed_sequence(data, batch_sizes, batch_first, padding_value, total_length):
    batch_sizes = _local_copy(batch_sizes)
    _, lengths = torch._pad_packed_sequence(torch.zeros(data.shape[0], 1), batch_sizes, batch_first, padding_value,
                                            total_length)
    args = (data, batch_sizes, batch_first, padding_value, total_length)
    return _server_half(torch._pad_packed_sequence, args, {}), lengths
