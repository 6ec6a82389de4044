"""``compile``: a training step under ``torch.compile(..., backend="remote")`` beside the same step eager, and
beside local torch eager and compiled (inductor, on this CPU).

Remote compiled two ways: the whole training step (forward, backward, the optimizer's step: graphs
between torch's own eager code), and the model alone (``torch.compile(model)``, nanoGPT's way: the
forward a template, the backward one step, the optimizer eager). For the MLP (SGD with momentum) and
the model section's small GPT (AdamW in two groups, clipping, a
cosine schedule, ``loss.item()`` every step): the step's time, its requests and request bytes, the
client's part (every request answered at once from memory: ``_hot.client_alone``), the server's (each
answer's ``Server-Timing``), and the compile times: the first call, and each later call that recompiled
(a new learning rate makes one, then the rate is an input of the graph).
"""

from __future__ import annotations

import copy
import statistics
import time
from typing import Callable

import torch
from torch import nn

from remote_autograd import client
from tests.models.gpt import cosine_with_warmup, train_step

from . import _hot
from ._util import measure, requests_per_step, row
from .real_model import HEADER, build_gpt, gpt_batch, gpt_data
from .step_parts import step_parts
from .training import _mlp

WARM_CALLS = 6  # the first calls, each timed alone: compiles and recompiles show there


def _mlp_step(model: nn.Module, device, compile_with: Callable | None) -> Callable[[], float]:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 784, generator=g).to(device), torch.randint(0, 10, (64,), generator=g).to(device)
    model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step(model, optimizer, x, y):
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss.item()

    run = compile_with(step) if compile_with else step
    return lambda: run(model, optimizer, x, y)


def _gpt_step(model: nn.Module, device, compile_with: Callable | None) -> Callable[[], float]:
    """The model section's step (``tests/models/gpt.train_step``), its batches from the same generator."""
    data, batches = gpt_data(), torch.Generator().manual_seed(0)
    model.to(device)
    optimizer = model.configure_optimizers(weight_decay=0.1, lr=3e-4)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, cosine_with_warmup(warmup=10, total=1000))
    run = compile_with(train_step) if compile_with else train_step
    return lambda: run(model, optimizer, scheduler, *gpt_batch(data, batches, device))


def _warm_up(step: Callable[[], object]) -> list[float]:
    """The first calls' seconds, each alone."""
    times = []
    for _ in range(WARM_CALLS):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return times


def _compile_times(first: list[float], steady: float) -> str:
    recompiles = [t for t in first[1:] if t > 3 * steady + 0.05]
    text = f"compile: first call {first[0]:5.1f} s"
    if recompiles:
        text += ", recompiles " + ", ".join(f"{t:4.1f} s" for t in recompiles)
    return text


def _bytes_per_step(tap: _hot.Tap, step: Callable[[], object], n: int = 5) -> float:
    with _hot.recording(tap):
        tap.recorded.clear()
        for _ in range(n):
            step()
        return sum(len(body) for body, _ in tap.recorded) / n


def _case(label: str, build: Callable[[], nn.Module], make_step: Callable, url: str, repeat: int) -> None:
    print(f"\n[compile] {label}")
    base = build()
    local = row("local torch, eager", measure(make_step(copy.deepcopy(base), "cpu", None), repeat=repeat, warmup=3))
    torch._dynamo.reset()
    try:
        inductor = make_step(copy.deepcopy(base), "cpu", torch.compile)
        first = _warm_up(inductor)
        times = measure(inductor, repeat=repeat, warmup=2)
        row("local torch, torch.compile (inductor)", times, local, _compile_times(first, statistics.median(times)))
    except Exception as exc:  # inductor needs a C++ compiler on the CPU
        print(f"  local torch.compile (inductor): not measured here: {type(exc).__name__}: {str(exc)[:120]}")
    for compiled in ("no", "step", "model"):
        torch._dynamo.reset()
        tap = _hot.Tap()
        with client.connect(url, transport=tap) as sess:
            compile_with = (lambda fn: torch.compile(fn, backend="remote")) if compiled == "step" else None
            model = copy.deepcopy(base)
            if compiled == "model":  # nanoGPT's way: the model compiled, backward and optimizer eager
                model = torch.compile(model, backend="remote")
            step = make_step(model, sess.device, compile_with)
            first = _warm_up(step)
            times = measure(step, repeat=repeat, warmup=2)
            name = {"no": "remote, eager", "step": "remote, the step compiled (backend=\"remote\")",
                    "model": "remote, the model compiled (backend=\"remote\")"}[compiled]
            extra = f"{requests_per_step(sess, step):.1f} requests/step, {_bytes_per_step(tap, step):6.0f} bytes/step"
            row(name, times, local, extra)
            parts = step_parts(sess, tap, step, repeat=repeat)
            client_us = _hot.median_us(_hot.client_alone(tap, sess, step, repeat))
            print(f"  {'  its parts (median step)':<48} client alone {client_us:6.0f} us | worker "
                  f"{parts.worker * 1e6:6.0f} us (steps {parts.steps * 1e6:6.0f} us) | {parts.queued:.0f} steps "
                  f"queued per step")
            if compiled != "no":
                print(f"  {'  ' + _compile_times(first, statistics.median(times)):<48}")
    torch._dynamo.reset()


def run(url: str, repeat: int = 30) -> None:
    _case("MLP 64x784, SGD with momentum, loss.item() every step", _mlp, _mlp_step, url, repeat)
    _case(HEADER, build_gpt, _gpt_step, url, repeat)
