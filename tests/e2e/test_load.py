"""Load: many sessions train at once on the shared server, with zero errors and no cross-talk.

Each session trains a tiny MLP (8→16→4, with dropout drawn from the session's own
generator) on its own seeded data with ``torch.optim.SGD`` and reads the loss every
step. Run concurrently, every session must end with exactly the losses and parameters
it gets when run alone: sessions share a device and workers, never state or RNG.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from remote_autograd import client

SESSIONS = int(os.environ.get("REMOTE_AUTOGRAD_LOAD_SESSIONS", "32"))
STEPS = int(os.environ.get("REMOTE_AUTOGRAD_LOAD_STEPS", "100"))


def _model(seed: int) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(16, 4))
    with torch.no_grad():
        for p in model.parameters():  # from our generator, not the process's (threads share that one)
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return model


def train(url: str, seed: int, steps: int = STEPS) -> tuple[list[float], list[torch.Tensor]]:
    """One session's run: its losses, one per step, and its final parameters."""
    g = torch.Generator().manual_seed(10_000 + seed)
    x, y = torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g)
    with client.connect(url) as sess:
        sess.manual_seed(seed)
        model = sess.module(_model(seed))
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        xr, yr = sess.tensor(x), sess.tensor(y)
        losses = []
        for _ in range(steps):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(xr), yr)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses, [p.to_torch().detach() for p in model.parameters()]


def test_concurrent_sessions_train_exactly_as_alone(server_url: str):
    start = time.monotonic()
    with ThreadPoolExecutor(SESSIONS) as pool:
        together = list(pool.map(lambda seed: train(server_url, seed), range(SESSIONS)))  # raises on any error
    concurrent_s = time.monotonic() - start
    alone = [train(server_url, seed) for seed in range(SESSIONS)]
    for seed, ((losses, params), (ref_losses, ref_params)) in enumerate(zip(together, alone)):
        assert losses == ref_losses, f"session {seed}: losses differ"
        assert all(torch.equal(p, q) for p, q in zip(params, ref_params)), f"session {seed}: parameters differ"
        assert losses[-1] < losses[0], f"session {seed} did not train"
    assert len({tuple(losses) for losses, _ in together}) == SESSIONS  # each session had its own run
    print(f"{SESSIONS} sessions x {STEPS} steps: {concurrent_s:.1f} s concurrently, "
          f"{time.monotonic() - start - concurrent_s:.1f} s one after another")
