"""Training steps: remote pipelined vs remote eager vs local, requests per step counted on the wire."""

from __future__ import annotations

import copy

import torch
from torch import nn

from remote_autograd import client
from remote_autograd.client.dispatch import _meta_memo

from . import _hot
from ._util import measure, requests_per_step, row
from .step_parts import breakdown


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))


def _cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(16 * 7 * 7, 10),
    )


def _step_fn(model, opt, x, y):
    def step():
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    return step


def _case(label: str, make_model, make_opt, x_shape, url: str, repeat: int) -> None:
    print(f"\n[training] {label}")
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(*x_shape, generator=g), torch.randint(0, 10, (x_shape[0],), generator=g)
    base = make_model()
    local_model = copy.deepcopy(base)
    local = row("local torch", measure(_step_fn(local_model, make_opt(local_model), x, y), repeat=repeat, warmup=5))
    for pipeline in (True, False):
        tap = _hot.Tap()
        with client.connect(url, pipeline=pipeline, transport=tap) as sess, _hot.recording(tap) as programs:
            model = sess.module(copy.deepcopy(base))  # moved in place: each session gets its own copy
            opt = make_opt(model)
            xr, yr = sess.tensor(x), sess.tensor(y)
            step = _step_fn(model, opt, xr, yr)
            times = measure(step, repeat=repeat, warmup=5)
            name = "remote pipelined" if pipeline else "remote eager"
            row(name, times, local, f"{requests_per_step(sess, step, 10):.1f} requests/step")
            if pipeline:
                breakdown(sess, tap, step)
                _parts_alone(sess, tap, step, programs(), local, repeat)
                meta_memo_rows(sess, tap, step, repeat)


def meta_memo_rows(sess, tap: _hot.Tap, step, repeat: int) -> None:
    """The client alone (answers from memory) with and without the meta memo: what it saves."""
    hits, misses = _meta_memo.MEMO.hits, _meta_memo.MEMO.misses
    with_memo = _hot.median_us(_hot.client_alone(tap, sess, step, repeat))
    rate = (_meta_memo.MEMO.hits - hits) / max(1, _meta_memo.MEMO.hits - hits + _meta_memo.MEMO.misses - misses)
    with _meta_memo.disabled():
        without = _hot.median_us(_hot.client_alone(tap, sess, step, repeat))
    print(f"  {'client alone, warm caches: meta memo':<48} {with_memo:6.0f} us with ({100 * rate:.0f} % hits), "
          f"{without:6.0f} us without = {without / with_memo:5.2f}x")


def _parts_alone(sess, tap: _hot.Tap, step, programs: list, local: float, repeat: int) -> None:
    """The same step's parts each timed alone with warm caches (``bench._hot``): their sum against the
    round trip shows what running them interleaved on the same cores costs."""
    # ``programs``: the step's own, decoded before what follows here is recorded too
    empty_us = _hot.median_us(measure(_hot.empty_program(sess), repeat=repeat, warmup=10))
    client_us = _hot.median_us(_hot.client_alone(tap, sess, step, repeat))
    server_us = _hot.median_us(_hot.server_alone(programs, repeat))
    total = client_us + server_us + empty_us
    print(f"  {'parts alone, warm caches':<48} client {client_us:6.0f} us + server in process {server_us:6.0f} us "
          f"+ empty request {empty_us:5.0f} us = {total:6.0f} us  {total / local:5.2f}x")


def run(url: str) -> None:
    _case("MLP 64x784->128->10, cross-entropy, SGD(momentum=0.9), loss.item() every step", _mlp,
          lambda m: torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9), (64, 784), url, 100)
    _case("same MLP with Adam", _mlp, lambda m: torch.optim.Adam(m.parameters(), lr=1e-3), (64, 784), url, 100)
    _case("small CNN 64x1x28x28 (conv-bn-relu-pool x2, linear), SGD(momentum=0.9)", _cnn,
          lambda m: torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9), (64, 1, 28, 28), url, 40)
