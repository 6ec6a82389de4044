"""The measuring side of the ``wan`` section, run by it inside the client's namespace.

``python -m bench.wan_measure --url URL --master HOST:PORT --ifname IF``: the SDK against the server
at ``URL`` and torch's dist_autograd against its peer (``bench.torch_peer``), both across the
delayed link. Both training steps are the same work on both sides (``torch_like_step``: the batch
sent each step, as torch's ``rpc_sync`` sends it; torch's GPT step has no clipping and no LR
schedule, its distributed optimizer has neither, and one AdamW group), timed in turns, a block of each
per round (``_pair``); the SDK's row gives its ratio to torch's, and so does the same step compiled
(``torch.compile(..., backend="remote")``: one template run per graph), and with ``--compiling-url``
that step once more on a server that compiles its templates (``REMOTE_AUTOGRAD_COMPILE=on``), timed once
they run compiled. The model section's GPT step,
which does more, follows for reference. The upload is timed torch first, then the SDK.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from typing import Callable

import httpx
import torch
import torch.distributed.rpc as rpc
from prometheus_client.parser import text_string_to_metric_families

from remote_autograd import client

from . import _hot, torch_peer
from ._util import measure, requests_per_step, row
from .real_model import build_gpt, gpt_batch, gpt_data, gpt_step
from .step_parts import print_breakdown, step_parts

UPLOAD_BYTES = 64 << 20
COMPILED_FROM_REPEAT = 5  # a compiled step takes seconds to compile: left out of the shortest runs (the tests')
COMPILE_WAIT_S = 300  # how long the compiling server may take to compile a step's templates (inductor, one core)


def wait_healthy(url: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/healthz", timeout=5).status_code == 200:
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"no server answered at {url} in {timeout:.0f} s")
        time.sleep(0.2)


BLOCK = 10  # steps timed together, in turns (the drain closing a block of the SDK's is one round trip more): see _pair


def _pair(label: str, theirs: Callable[[], object], ours: Callable[[], object], sdk_note: str, repeat: int,
          drain: Callable[[], object]) -> float:
    """torch's step and the SDK's, timed in turns (a block of ``BLOCK`` steps of each per round, after a
    warm-up of each), so that the machine's drift over the run weighs on both alike; torch's median time per
    step (microseconds). A block of the SDK's ends with ``drain`` (its session's ``sync``): a compiled
    step's answer may come before its backward and optimizer ran (SPEC §3, running ahead), which then run
    during the next step's Python, as in a training loop; so the block counts them all, and none of them
    runs during torch's block. One step at a time in turns would let them."""
    for _ in range(3):
        theirs(), ours()
    drain()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeat):
        for fn, end, kept in ((theirs, None, times[0]), (ours, drain, times[1])):
            t0 = time.perf_counter()
            for _ in range(BLOCK):
                fn()
            if end is not None:
                end()
            kept.append((time.perf_counter() - t0) / BLOCK)
    base = row(f"{label}: torch dist_autograd", times[0], unit="ms")
    row(f"{label}: SDK, {sdk_note}", times[1], base, "of torch's", unit="ms")
    return base


def torch_like_step(sess, name: str, x: torch.Tensor, y: torch.Tensor) -> Callable[[], float]:
    """torch's step (``torch_peer.training_step(name, x, y)``) written for ``sess.device``: the same model,
    loss and optimizer, the batch sent (as torch's ``rpc_sync`` sends it each step), forward and loss,
    backward, the optimizer's step, the loss as a number."""
    model = torch_peer.build_model(name).to(sess.device)
    kind, options = torch_peer.OPTIMIZERS[name]
    optimizer = kind(model.parameters(), **options)

    def step() -> float:
        loss = torch_peer.model_loss(name, model, x.to(sess.device), y.to(sess.device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.item()

    return step


def compiled_like_step(sess, name: str, x: torch.Tensor, y: torch.Tensor) -> Callable[[], float]:
    """``torch_like_step`` with its step compiled (``torch.compile(..., backend="remote")``): the batch still
    sent each step, the loss read as a number after it."""
    model = torch_peer.build_model(name).to(sess.device)
    kind, options = torch_peer.OPTIMIZERS[name]
    optimizer = kind(model.parameters(), **options)

    @torch.compile(backend="remote")
    def compiled(x, y):
        loss = torch_peer.model_loss(name, model, x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.detach()

    return lambda: compiled(x.to(sess.device), y.to(sess.device)).item()


def _compiled_on(compiling_url: str, label: str, name: str, batch: tuple, theirs: Callable[[], object],
                 repeat: int) -> None:
    """The compiled step on the server at ``compiling_url`` (``REMOTE_AUTOGRAD_COMPILE=on``) beside torch's,
    timed once the server says its templates run compiled (``compiled_templates``' variants, on /metrics):
    until then a run goes as its graph (the default server's way), so timing earlier would mix the two."""
    with client.connect(compiling_url) as sess:
        compiled = compiled_like_step(sess, name, *batch)
        start, ready_before = time.monotonic(), _variants(compiling_url).get("ready", 0)
        while not _compiled(_variants(compiling_url), ready_before):
            for _ in range(5):
                compiled()
            if time.monotonic() - start > COMPILE_WAIT_S:
                print(f"  {label}: the compiling server had not compiled its templates after {COMPILE_WAIT_S} s")
                return
        _pair(label, theirs, compiled, "torch.compile, the server compiling too (REMOTE_AUTOGRAD_COMPILE=on, "
              f"compiled in {time.monotonic() - start:.0f} s)", repeat, sess.sync)


def _variants(url: str) -> dict[str, float]:
    """The server's template variants by state (its /metrics)."""
    return {s.labels["state"]: s.value for family in text_string_to_metric_families(httpx.get(url + "/metrics").text)
            for s in family.samples if s.name == "remote_autograd_template_variants"}


def _compiled(states: dict[str, float], ready_before: float) -> bool:
    """Whether this step's templates run compiled: more variants ``ready`` than before it, none ``compiling``
    (under ``on`` each template's compile is asked for after its first run)."""
    return states.get("ready", 0) > ready_before and states.get("compiling", 0) == 0


def mlp_step(url: str, repeat: int, compiling_url: str | None = None) -> None:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 784, generator=g), torch.randint(0, 10, (64,), generator=g)
    label = "MLP 64x784 step, SGD"
    with client.connect(url) as sess:
        theirs = torch_peer.training_step("mlp", x, y)
        ours = torch_like_step(sess, "mlp", x, y)
        _pair(label, theirs, ours, f"{requests_per_step(sess, ours):.1f} requests/step", repeat, sess.sync)
        if repeat < COMPILED_FROM_REPEAT:
            return
        compiled = compiled_like_step(sess, "mlp", x, y)
        _pair(label, theirs, compiled,
              f"torch.compile(backend=\"remote\"), {requests_per_step(sess, compiled):.1f} requests/step", repeat,
              sess.sync)
    if compiling_url is not None:
        _compiled_on(compiling_url, label, "mlp", (x, y), theirs, repeat)


def gpt_training_step(url: str, repeat: int, compiling_url: str | None = None) -> None:
    batch = gpt_batch(gpt_data(), torch.Generator().manual_seed(0))
    label = "GPT step, AdamW"
    tap = _hot.Tap()
    with client.connect(url, transport=tap) as sess:
        theirs = torch_peer.training_step("gpt", *batch)
        same = torch_like_step(sess, "gpt", *batch)
        base = _pair(label, theirs, same, f"{requests_per_step(sess, same):.1f} requests/step", repeat, sess.sync)
        if repeat >= COMPILED_FROM_REPEAT:
            compiled = compiled_like_step(sess, "gpt", *batch)
            _pair(label, theirs, compiled,
                  f"torch.compile(backend=\"remote\"), {requests_per_step(sess, compiled):.1f} requests/step", repeat,
                  sess.sync)
            if compiling_url is not None:
                _compiled_on(compiling_url, label, "gpt", batch, theirs, repeat)
        step = gpt_step(build_gpt(), sess.device, gpt_data())
        full = measure(step, repeat=repeat, warmup=3)
        row("GPT step: SDK, the model section's", full, base, "of torch's (+ clipping, LR schedule, 2 groups)",
            unit="ms")
        print_breakdown(step_parts(sess, tap, step))  # the request now holds the link's round trip


def upload(url: str, repeat: int) -> None:
    t = torch.randn(UPLOAD_BYTES // 4)
    theirs = measure(torch_peer.upload(t), repeat=repeat, warmup=1)
    ours = []
    with client.connect(url) as sess:
        for i in range(repeat + 1):
            start = time.perf_counter()
            x = sess.tensor(t)
            sess.sync()
            if i:  # the first is the warm-up
                ours.append(time.perf_counter() - start)
            del x
            sess.sync()  # freed before the next: each upload starts from the same server memory
    label = f"{UPLOAD_BYTES >> 20} MiB upload"
    base = row(f"{label}: torch dist_autograd", theirs, unit="ms")
    row(f"{label}: SDK, sess.tensor + sync", ours, base, "of torch's", unit="ms")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.wan_measure")
    parser.add_argument("--url", required=True)
    parser.add_argument("--master", required=True)
    parser.add_argument("--ifname", required=True)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--compiling-url", help="a server with REMOTE_AUTOGRAD_COMPILE=on: the compiled steps on it too")
    args = parser.parse_args()
    wait_healthy(args.url)
    if args.compiling_url:
        wait_healthy(args.compiling_url)
    torch_peer.join(1, args.master, args.ifname)
    try:
        mlp_step(args.url, args.repeat, args.compiling_url)
        gpt_training_step(args.url, args.repeat, args.compiling_url)
        upload(args.url, max(3, args.repeat // 4))
    finally:
        rpc.shutdown()


if __name__ == "__main__":
    main()
