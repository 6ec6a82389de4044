"""A user's ``autograd.Function`` and a reentrant checkpoint on remote tensors (issue 30): what recording a
Function's backward at ``apply`` costs the client beside the same ops written plainly, and the bytes a
session holds after a forward under ``torch.utils.checkpoint`` (reentrant: recomputed on the server)."""

from __future__ import annotations

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
    print("\n[functions] a user's autograd.Function and a reentrant checkpoint on remote tensors")
    with client.connect(url) as sess:
        x, y = (torch.randn(64, 64).to(sess.device).requires_grad_() for _ in range(2))
        plain = row("x + 0.5 * y, queued (two ops)", measure(lambda: x + 0.5 * y, repeat=300))
        row("CustomAdd.apply(x, y, 0.5), queued + recorded", measure(lambda: _CustomAdd.apply(x, y, 0.5), repeat=300),
            plain)
        with torch.no_grad():
            row("CustomAdd.apply under no_grad (nothing recorded)",
                measure(lambda: _CustomAdd.apply(x, y, 0.5), repeat=300), plain)
    for mode in ("no checkpoint", "use_reentrant=True", "use_reentrant=False"):
        with client.connect(url) as sess:
            torch.manual_seed(0)
            blocks = nn.ModuleList([nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 512))
                                    for _ in range(8)]).to(sess.device)
            h = torch.randn(256, 512).to(sess.device).requires_grad_()
            before = sess.stats()["bytes"]
            for block in blocks:
                h = block(h) if mode == "no checkpoint" else checkpoint(block, h, use_reentrant=mode.endswith("True"))
            held = sess.stats()["bytes"] - before
            h.pow(2).mean().backward()
            print(f"  {'8 MLP blocks 512-2048-512, batch 256: ' + mode:<60} {held / 2 ** 20:7.1f} MiB held after "
                  "the forward")
