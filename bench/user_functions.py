"""A user's ``autograd.Function`` and checkpointing on remote tensors (issue 30): what recording a Function's
backward at ``apply`` costs the client beside the same ops written plainly, and the bytes a session holds after
a forward under ``torch.utils.checkpoint`` both ways (each recomputed on the server at the backward), the time
of the forward and backward, and whether the gradients are those of the run without checkpointing."""

from __future__ import annotations

import statistics
import time

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from remote_autograd import client

from ._util import measure, row


class _CustomAdd(torch.autograd.Function):
    """The example this project started from: ``x + alpha * y``, backward ``(g, alpha * g, None)``."""

    @staticmethod
    def forward(ctx, x, y, alpha):
        ctx.alpha = alpha
        return x + alpha * y

    @staticmethod
    def backward(ctx, g):
        return g, ctx.alpha * g, None


def run(url: str | None = None) -> None:
    print("\n[functions] a user's autograd.Function and checkpointing on remote tensors")
    with client.connect(url) as sess:
        x, y = (torch.randn(64, 64).to(sess.device).requires_grad_() for _ in range(2))
        plain = row("x + 0.5 * y, queued (two ops)", measure(lambda: x + 0.5 * y, repeat=300))
        row("CustomAdd.apply(x, y, 0.5), queued + recorded", measure(lambda: _CustomAdd.apply(x, y, 0.5), repeat=300),
            plain)
        with torch.no_grad():
            row("CustomAdd.apply under no_grad (nothing recorded)",
                measure(lambda: _CustomAdd.apply(x, y, 0.5), repeat=300), plain)
    plain = None
    for mode in ("no checkpoint", "use_reentrant=True", "use_reentrant=False"):
        with client.connect(url) as sess:
            torch.manual_seed(0)
            blocks = nn.ModuleList([nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 512))
                                    for _ in range(8)]).to(sess.device)
            x = torch.randn(256, 512).to(sess.device).requires_grad_()
            times, held = [], None
            for _ in range(3):  # bytes held: the first run's (a later one frees the earlier one's tensors meanwhile)
                blocks.zero_grad()
                x.grad = None
                began = time.perf_counter()
                before = sess.stats()["bytes"]
                h = x
                for block in blocks:
                    h = block(h) if mode == "no checkpoint" else checkpoint(block, h,
                                                                            use_reentrant=mode.endswith("True"))
                held = sess.stats()["bytes"] - before if held is None else held
                h.pow(2).mean().backward()
                grads = [t.cpu() for t in (x.grad, *(p.grad for p in blocks.parameters()))]
                times.append(time.perf_counter() - began)
                del h
            plain = grads if plain is None else plain
            same = all(torch.equal(g, w) for g, w in zip(grads, plain, strict=True))
            print(f"  {'8 MLP blocks 512-2048-512, batch 256: ' + mode:<60} {held / 2 ** 20:7.1f} MiB held after "
                  f"the forward; forward+backward {statistics.median(times) * 1e3:6.0f} ms (median of 3); "
                  f"gradients {'equal to' if same else 'DIFFERENT from'} the run without checkpoint")
