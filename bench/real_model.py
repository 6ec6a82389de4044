"""One real-model training step, local vs remote: the small GPT of the model tests.

The model, its AdamW groups, cosine schedule and gradient clipping are the test
suite's own (``tests/models/gpt.py``), so the bench times the code the tests
prove equal on both devices. The remote side is the same loop given
``sess.device``; requests per step are counted on the wire.
"""

from __future__ import annotations

import copy

import torch

from remote_autograd import client
from remote_autograd.service.settings import Settings
from tests.models.gpt import GPT, GPTConfig, cosine_with_warmup, get_batch, train_step

from . import _hot
from ._util import measure, requests_per_step, row
from .step_parts import breakdown, print_client_cost
from .training import meta_memo_rows

_CONFIG = GPTConfig(vocab_size=64, block_size=32, n_layer=2, n_head=4, n_embd=64, dropout=0.0)
BATCH = 8


def build_gpt() -> GPT:
    """The bench's GPT, on the CPU, from a fixed seed."""
    torch.manual_seed(0)
    return GPT(_CONFIG)


def gpt_data() -> torch.Tensor:
    return torch.randint(0, _CONFIG.vocab_size, (4096,), generator=torch.Generator().manual_seed(1))


def gpt_batch(data: torch.Tensor, gen: torch.Generator, device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    return get_batch(data, _CONFIG.block_size, BATCH, gen, device)


def gpt_step(model: GPT, device, data: torch.Tensor):
    """The model tests' training step on ``device``, each call on the next batch."""
    model.to(device)
    optimizer = model.configure_optimizers(weight_decay=0.1, lr=3e-4)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, cosine_with_warmup(warmup=10, total=1000))
    batches = torch.Generator().manual_seed(0)

    def step() -> float:
        return train_step(model, optimizer, scheduler, *gpt_batch(data, batches, device))

    return step


HEADER = (f"small GPT ({_CONFIG.n_layer} layers, {_CONFIG.n_embd} wide, context {_CONFIG.block_size}, batch {BATCH}): "
          "forward, backward, clip_grad_norm_, AdamW, LR schedule, loss.item() every step")


def run(url: str, repeat: int = 30) -> None:
    print(f"\n[model] {HEADER}")
    base, data = build_gpt(), gpt_data()
    local = row("local torch", measure(gpt_step(copy.deepcopy(base), "cpu", data), repeat=repeat, warmup=3))
    tap = _hot.Tap()
    with client.connect(url, transport=tap) as sess, _hot.recording(tap) as programs:
        step = gpt_step(copy.deepcopy(base), sess.device, data)
        times = measure(step, repeat=repeat, warmup=3)
        row("remote, the same loop on sess.device", times, local, f"{requests_per_step(sess, step):.1f} requests/step")
        print_client_cost(breakdown(sess, tap, step))
        meta_memo_rows(sess, tap, step, 10)
        replay_rows(programs(), 10)


def replay_rows(programs: list, last: int, rounds: int = 5) -> None:
    """The server alone (every program of the session so far, replayed in process) with the plan
    of a repeated program (``service/engine/program_plan.py``) and without (``REMOTE_AUTOGRAD_REPLAY=off``),
    in alternating rounds: the median of the ``last`` programs' times, best round of each."""
    best = {"on": float("inf"), "off": float("inf")}
    for _ in range(rounds):
        for replay in best:
            times = _hot.server_alone(programs, last, Settings.from_env({}, replay=replay))
            best[replay] = min(best[replay], _hot.median_us(times))
    calls = sum(s.get("kind") == "call" for s in programs[-1]["steps"])
    on, off = best["on"], best["off"]
    print(f"  {'server alone, warm caches: replayed plan':<48} {on:6.0f} us with, {off:6.0f} us without "
          f"(REMOTE_AUTOGRAD_REPLAY=off) = {off / on:5.2f}x; {(off - on) / max(1, calls):4.1f} us less per call "
          f"({calls} calls)")
