"""A step's cost (``service/engine/step_cost.py``): this device's FLOP rate beside the default the server
assumes, a convolution's count beside its time, the conv2d of issue 31 refused, and what counting
adds to a call's derivation on meta (a memo miss; a hit reads the count with the rest)."""

from __future__ import annotations

import time

import torch

from remote_autograd.service.engine import meta_check, step_cost
from remote_autograd.service.ops import OP_TABLE
from remote_autograd.service.settings import Settings

from ._util import measure, row


def run(url: str | None = None) -> None:
    settings = Settings()
    device = settings.resolved_device()
    print(f"\n[cost] a step's cost on {device.type} (defaults: max_step_flops={settings.max_step_flops}, "
          f"device_flops_per_second={settings.device_flops_per_second:g})")
    n = 2048
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    best = _best(lambda: a @ b, device)
    print(f"  {'float32 matmul 2048x2048, this device':<48} {2 * n ** 3 / best / 1e9:9.1f} GFLOP/s")
    # a one-channel convolution of expanded tensors (issue 31's, 1/64 of its size): counted vs timed
    x, w = (torch.ones(1, device=device).expand(1, 1, s, s) for s in (512, 256))
    conv = OP_TABLE.get("nn.functional.conv2d")
    meta_check.forget()
    counted = meta_check.check_call(conv, [x, w], {}, inplace=False, grad_enabled=False).flops
    took = _best(lambda: torch.nn.functional.conv2d(x, w), device, repeat=1)
    print(f"  {'one-channel conv2d 512^2 by 256^2: counted':<48} {counted:9.3g} FLOPs = "
          f"{counted / settings.device_flops_per_second:.2f} s at the default rate; ran {took:.2f} s")
    # issue 31's conv2d: refused on its count, never run
    big = [torch.ones(1, device=device).expand(1, 1, s, s) for s in (2048, 1024)]
    meta_check.forget()
    start = time.perf_counter()
    counted = meta_check.check_call(conv, big, {}, inplace=False, grad_enabled=False).flops
    print(f"  {'issue 31 conv2d 2048^2 by 1024^2: counted':<48} {counted:9.3g} FLOPs in "
          f"{(time.perf_counter() - start) * 1e3:.1f} ms (refused over {settings.max_step_flops:g})")
    _derivation_rows()


def _derivation_rows() -> None:
    """A call derived on meta, as a memo miss does it, without and with the count."""
    m = lambda *s: torch.empty(*s, device="meta")  # noqa: E731
    calls = {
        "linear 64x256 by 256x256": lambda: torch.nn.functional.linear(m(64, 256), m(256, 256), m(256)),
        "layer_norm 64x256": lambda: torch.nn.functional.layer_norm(m(64, 256), [256]),
        "scaled_dot_product_attention 4x8x64x32": lambda: torch.nn.functional.scaled_dot_product_attention(
            m(4, 8, 64, 32), m(4, 8, 64, 32), m(4, 8, 64, 32), is_causal=True),
    }
    for label, call in calls.items():
        plain = row(f"meta: {label}", measure(call, repeat=200, warmup=20))

        def counted(call=call):
            with step_cost.counting():
                call()

        row("  the same, its work counted", measure(counted, repeat=200, warmup=20), baseline=plain)


def _best(fn, device: torch.device, repeat: int = 3) -> float:
    fn()
    best = float("inf")
    for _ in range(repeat):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best
