"""Reading a program's answer: the outputs a step's result names, the template a failed run asked for."""

from __future__ import annotations

from typing import Any

import torch

from remote_autograd.proto import dtype_from_name


def meta_from_result(result: dict) -> list[tuple[str, tuple[int, ...], torch.dtype, bool] | None]:
    """(id, shape, dtype, requires_grad) of each output a step's result describes (None: no tensor there)."""
    out = []
    for m in result["tensors"]:
        out.append(None if m is None else (m["id"], tuple(m["shape"]), dtype_from_name(m["dtype"]), m["requires_grad"]))
    return out


def lost_template(body: Any, steps: list) -> str | None:
    """The template a ``run_template`` step (or a ``function`` step, its ``backward``) asked for that the server
    did not hold (``unknown_template``)."""
    err = (body or {}).get("error") if isinstance(body, dict) else None
    k = (err or {}).get("step")
    if (err or {}).get("code") != "unknown_template" or not isinstance(k, int) or k >= len(steps):
        return None
    return steps[k].get("template") or steps[k].get("backward")
