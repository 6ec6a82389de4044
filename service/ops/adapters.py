"""Calls the server adapts before torch's own op runs: what torch asks that the wire cannot give.

torch wants a packed sequence's ``batch_sizes`` (and ``pack_padded_sequence``'s ``lengths``) on the
CPU, as the SDK keeps them (client/handlers/_packed.py); uploaded to a GPU server, they arrive on the GPU.
``ADAPTERS`` (entry name -> wrapper of a spelling's torch callable) moves them back; on a CPU
server the wrapper changes nothing.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch


def batch_sizes_on_cpu(torch_fn: Callable[..., Any]) -> Callable[..., Any]:
    """``torch_fn`` with an int64 second argument (``batch_sizes`` or ``lengths``) moved to the CPU.
    Unpacked calls (a float ``hx`` second) pass unchanged."""
    @functools.wraps(torch_fn)
    def run(input, second, *rest, **kwargs):
        if isinstance(second, torch.Tensor) and second.dtype == torch.int64:
            second = second.cpu()
        return torch_fn(input, second, *rest, **kwargs)
    return run  # the meta check runs it too: meta cannot move those to the CPU, so their bound is charged


ADAPTERS: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
    name: batch_sizes_on_cpu for name in ("lstm", "gru", "rnn_tanh", "rnn_relu", "_pack_padded_sequence",
                                          "_pad_packed_sequence")
}
