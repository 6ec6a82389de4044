"""Argument contracts for torch kernels whose meta check is missing or too lax.

torch's CPU fused optimizers (``_fused_sgd_``, ``_fused_adam_``, ``_fused_adamw_``,
``_fused_adagrad_``) trust their caller: each walks ``params[i].numel()`` elements through the
raw pointers of ``grads[i]``, ``exp_avgs[i]``, ... without checking that those tensors are as
long, so a grad of 256 elements beside a param of 4096 reads whatever memory follows it, and a
momentum buffer of one element is written past its end. Their meta kernels do not check either
(``_fused_sgd_`` has none; ``_fused_adam_``'s accepts anything). CUDA's kernels refuse such lists
(``check_fast_path_restrictions``: the same sizes, strides, dtype and device, tensor by tensor);
the contracts below refuse what CUDA refuses, before any kernel runs, so a bad list is a 422
naming the argument and no tensor was touched (a dtype mismatch found midway through the CPU
kernel would otherwise leave the first parameters updated).

A contract takes the call's real arguments and raises ``RuntimeError`` (the runner's 422).
It stands in for the meta run: these kernels write their lists in place and make no new tensor.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

_FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def _tensor_list(name: str, value: Any) -> list[torch.Tensor]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(t, torch.Tensor) for t in value):
        raise RuntimeError(f"{name} must be a list of tensors")
    return list(value)


def _dense(t: torch.Tensor) -> bool:
    """Every element at its own address and no gaps: what a kernel walking ``numel()`` elements from
    ``data_ptr()`` needs (torch's ``is_non_overlapping_and_dense``: sorted by stride, each dimension's
    stride is the product of the sizes below it)."""
    expected = 1
    for stride, size in sorted((st, sz) for sz, st in zip(t.shape, t.stride()) if sz != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _like_params(op: str, params: list[torch.Tensor], lists: dict[str, list[torch.Tensor]]) -> None:
    """Each list has one tensor per param, each of its param's shape, strides, dtype and device;
    every written tensor is dense (CUDA's ``check_fast_path_restrictions``, with the argument named)."""
    for name, tensors in lists.items():
        if len(tensors) != len(params):
            raise RuntimeError(f"{op}: {name} has {len(tensors)} tensors but params has {len(params)}: "
                               "every list must have one tensor per param")
    for i, p in enumerate(params):
        if p.dtype not in _FLOAT_DTYPES:
            raise RuntimeError(f"{op}: params[{i}] has dtype {p.dtype}: fused optimizers take floating params")
        if not _dense(p):
            raise RuntimeError(f"{op}: params[{i}] is not dense (a view with gaps or repeated elements): "
                               "fused optimizers need every element once, in order")
        for name, tensors in lists.items():
            t = tensors[i]
            if t.shape != p.shape:
                raise RuntimeError(f"{op}: {name}[{i}] has shape {list(t.shape)} but params[{i}] has "
                                   f"{list(p.shape)}")
            if t.dtype != p.dtype or t.device != p.device:
                raise RuntimeError(f"{op}: {name}[{i}] is {t.dtype} on {t.device} but params[{i}] is {p.dtype} on "
                                   f"{p.device}: params, grads and states must have same dtype, device, and layout")
            if t.stride() != p.stride():
                raise RuntimeError(f"{op}: {name}[{i}] has strides {list(t.stride())} but params[{i}] has "
                                   f"{list(p.stride())}: params, grads and states must have same dtype, device, "
                                   "and layout")


def _one_element(op: str, name: str, value: Any, dtypes: Sequence[torch.dtype] | None = None) -> None:
    if value is None:
        return
    if not isinstance(value, torch.Tensor) or value.numel() != 1:
        raise RuntimeError(f"{op}: {name} must be a tensor of one element")
    if dtypes is not None and value.dtype not in dtypes:
        raise RuntimeError(f"{op}: {name} must be float32, got {value.dtype}")


def _steps(op: str, params: list[torch.Tensor], steps: list[torch.Tensor]) -> None:
    if len(steps) != len(params):
        raise RuntimeError(f"{op}: state_steps has {len(steps)} tensors but params has {len(params)}")
    for i, step in enumerate(steps):
        _one_element(op, f"state_steps[{i}]", step)


def _scaling(op: str, kwargs: dict) -> None:
    """GradScaler's ``grad_scale`` and ``found_inf``: read through a float pointer, one element."""
    _one_element(op, "grad_scale", kwargs.get("grad_scale"), (torch.float32,))
    _one_element(op, "found_inf", kwargs.get("found_inf"), (torch.float32,))
    lr = kwargs.get("lr")
    if isinstance(lr, torch.Tensor):
        _one_element(op, "lr", lr)


def _distinct(op: str, lists: dict[str, list[torch.Tensor]]) -> None:
    """Written tensors that share memory would be updated twice per element: torch's in-place rule
    ("more than one element of the written-to tensor refers to a single memory location") across lists."""
    spans = sorted((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size(), f"{name}[{i}]")
                   for name, tensors in lists.items() for i, t in enumerate(tensors) if t.numel())
    # dense tensors (checked first) occupy [data_ptr, data_ptr + nbytes): sorted by start, two overlap
    # exactly when one starts before the furthest end seen so far
    furthest, owner = 0, ""
    for start, end, name in spans:
        if start < furthest:
            raise RuntimeError(f"{op}: {name} and {owner} share memory: unsupported operation: some elements "
                               "of the written-to tensors refer to a single memory location")
        if end > furthest:
            furthest, owner = end, name


def fused_adam(op: str) -> Callable[..., None]:
    """The contract of ``_fused_adam_`` and ``_fused_adamw_`` (one signature)."""

    def check(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, **kwargs) -> None:
        params = _tensor_list("params", params)
        lists = {"grads": _tensor_list("grads", grads), "exp_avgs": _tensor_list("exp_avgs", exp_avgs),
                 "exp_avg_sqs": _tensor_list("exp_avg_sqs", exp_avg_sqs)}
        maxes = _tensor_list("max_exp_avg_sqs", max_exp_avg_sqs)
        if kwargs.get("amsgrad"):
            lists["max_exp_avg_sqs"] = maxes
        elif maxes:
            raise RuntimeError(f"{op}: max_exp_avg_sqs must be empty unless amsgrad=True")
        _like_params(op, params, lists)
        _steps(op, params, _tensor_list("state_steps", state_steps))
        _scaling(op, kwargs)
        _distinct(op, {"params": params, **lists})

    return check


def fused_sgd(params, grads, momentum_buffer_list, **kwargs) -> None:
    """The contract of ``_fused_sgd_``: momentum buffers only with momentum, one per param."""
    op = "_fused_sgd_"
    params = _tensor_list("params", params)
    lists = {"grads": _tensor_list("grads", grads)}
    buffers = _tensor_list("momentum_buffer_list", momentum_buffer_list)
    if kwargs.get("momentum", 0.0) != 0.0:
        lists["momentum_buffer_list"] = buffers
    elif buffers:
        raise RuntimeError(f"{op}: momentum_buffer_list must be empty when momentum is 0")
    _like_params(op, params, lists)
    _scaling(op, kwargs)
    _distinct(op, {"params": params, **lists})


def fused_adagrad(params, grads, state_sums, state_steps, **kwargs) -> None:
    """The contract of ``_fused_adagrad_``."""
    op = "_fused_adagrad_"
    params = _tensor_list("params", params)
    lists = {"grads": _tensor_list("grads", grads), "state_sums": _tensor_list("state_sums", state_sums)}
    _like_params(op, params, lists)
    _steps(op, params, _tensor_list("state_steps", state_steps))
    _scaling(op, kwargs)
    _distinct(op, {"params": params, **lists})


# name of the table entry -> its contract (the entries are registered in foreach.py, or derived)
CONTRACTS: dict[str, Callable[..., None]] = {
    "_fused_adam_": fused_adam("_fused_adam_"),
    "_fused_adamw_": fused_adam("_fused_adamw_"),
    "_fused_sgd_": fused_sgd,
    "_fused_adagrad_": fused_adagrad,
}
