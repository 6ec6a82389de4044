"""The measuring side of the ``wan`` section, run by it inside the client's namespace.

``python -m bench.wan_measure --url URL --master HOST:PORT --ifname IF``: the SDK against the server
at ``URL`` and torch's dist_autograd against its peer (``bench.torch_peer``), both across the
delayed link. Each figure is taken from torch first, then from the SDK, and the SDK's row gives its
ratio to torch's. torch's GPT step has no clipping and no LR schedule (its distributed optimizer has
neither) and one AdamW group; the SDK runs that same step first (``torch_like_gpt_step``: the
batch sent each step, as torch's ``rpc_sync`` sends it), then the model section's own, which does
more.
"""

from __future__ import annotations

import argparse
import contextlib
import time

import httpx
import torch
import torch.distributed.rpc as rpc

from remote_autograd import client

from . import _hot, torch_peer
from ._util import measure, requests_per_step, row, summary
from .real_model import build_gpt, gpt_batch, gpt_data, gpt_step
from .step_parts import print_breakdown, step_parts
from .training import _mlp, _step_fn

UPLOAD_BYTES = 64 << 20


def wait_healthy(url: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/healthz", timeout=5).status_code == 200:
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"no server answered at {url} in {timeout:.0f} s")
        time.sleep(0.2)


def _pair(label: str, torch_times: list[float], sdk_times: list[float], sdk_note: str) -> None:
    base = row(f"{label}: torch dist_autograd", torch_times, unit="ms")
    row(f"{label}: SDK, {sdk_note}", sdk_times, base, "of torch's", unit="ms")


def mlp_step(url: str, repeat: int) -> None:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 784, generator=g), torch.randint(0, 10, (64,), generator=g)
    theirs = measure(torch_peer.training_step("mlp", x, y), repeat=repeat, warmup=3)
    with client.connect(url) as sess:
        model = sess.module(_mlp())
        step = _step_fn(model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                        sess.tensor(x), sess.tensor(y))
        ours = measure(step, repeat=repeat, warmup=3)
        _pair("MLP 64x784 step, SGD", theirs, ours, f"{requests_per_step(sess, step):.1f} requests/step")


def torch_like_gpt_step(sess, x: torch.Tensor, y: torch.Tensor):
    """torch's step (``torch_peer.training_step("gpt", x, y)``) written for ``sess.device``: the batch
    sent, forward and loss, backward, the distributed optimizer's AdamW (one group), the loss as a number."""
    model = build_gpt().to(sess.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)

    def step() -> float:
        loss = model(x.to(sess.device), y.to(sess.device))[1]
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.item()

    return step


def gpt_training_step(url: str, repeat: int) -> None:
    batch = gpt_batch(gpt_data(), torch.Generator().manual_seed(0))
    theirs = measure(torch_peer.training_step("gpt", *batch), repeat=repeat, warmup=3)
    tap = _hot.Tap()
    with client.connect(url, transport=tap) as sess:
        same = torch_like_gpt_step(sess, *batch)
        ours = measure(same, repeat=repeat, warmup=3)
        _pair("GPT step, AdamW", theirs, ours, f"{requests_per_step(sess, same):.1f} requests/step")
        step = gpt_step(build_gpt(), sess.device, gpt_data())
        full = measure(step, repeat=repeat, warmup=3)
        row("GPT step: SDK, the model section's", full, summary(theirs)[0],
            "of torch's (+ clipping, LR schedule, 2 groups)", unit="ms")
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
    _pair(f"{UPLOAD_BYTES >> 20} MiB upload", theirs, ours, "sess.tensor + sync")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.wan_measure")
    parser.add_argument("--url", required=True)
    parser.add_argument("--master", required=True)
    parser.add_argument("--ifname", required=True)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    wait_healthy(args.url)
    torch_peer.join(1, args.master, args.ifname)
    try:
        mlp_step(args.url, args.repeat)
        gpt_training_step(args.url, args.repeat)
        upload(args.url, max(3, args.repeat // 4))
    finally:
        rpc.shutdown()


if __name__ == "__main__":
    main()
