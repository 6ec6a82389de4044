"""How a program's kernels are captured once and launched again: ``CudaGraph`` (torch's
``torch.cuda.CUDAGraph``), and ``RecordedGraph``, a stand-in with the same rules on any device,
so the bookkeeping around a capture (``graph_steps``) is tested where there is no GPU.

The rules ``graph_steps`` builds on, kept by both:

- Capturing launches nothing: a step run while capturing has done none of its device work
  until ``replay``. (``RecordedGraph`` computes out-of-place results, whose values nothing may
  read, and skips every write into an existing tensor, which is what a reader could see.)
- A replay launches the same kernels on the same addresses: a tensor made while capturing is
  rewritten by every replay. Python is not replayed: no ``.grad`` is assigned, no version
  counter moves, no tensor object is made.
- Nothing may read a device value on the host while capturing (``.item()``, a copy to the
  host): CUDA refuses it, and ``RecordedGraph`` raises too.
"""

from __future__ import annotations

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class CudaGraph:
    """One ``torch.cuda.CUDAGraph`` with a memory pool of its own."""

    def __init__(self) -> None:
        self.graph = torch.cuda.CUDAGraph()

    def capturing(self) -> contextlib.AbstractContextManager:
        # thread_local: another session's program on another thread may allocate or synchronize
        # while this one captures (the default mode, "global", would make those calls fail)
        return torch.cuda.graph(self.graph, capture_error_mode="thread_local")

    def replay(self) -> None:
        self.graph.replay()

    def release(self) -> None:
        self.graph.reset()


class RecordedGraph:
    """Every aten call made on a real device while capturing, called again by ``replay`` below
    autograd and version counting (``_AutoDispatchBelowADInplaceOrView``), out-of-place results
    copied into the tensors the capture made: a CUDA graph's semantics, on the CPU."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def capturing(self) -> contextlib.AbstractContextManager:
        return _Recorder(self.calls)

    def replay(self) -> None:
        with torch._C._AutoDispatchBelowADInplaceOrView(), torch.no_grad():
            for func, args, kwargs, made in self.calls:
                result = func(*args, **kwargs)
                for static, (_, fresh) in zip(made, _returned(func._schema, result)):
                    if static is not None:
                        static.copy_(fresh)

    def release(self) -> None:
        self.calls.clear()


class _Recorder(TorchDispatchMode):
    def __init__(self, calls: list) -> None:
        super().__init__()
        self.calls = calls

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not _on_a_device(args, kwargs):  # the meta checks, and calls on no tensor at all
            return func(*args, **kwargs)
        if _reads_on_host(func, args, kwargs):
            raise RuntimeError(f"{func}: a value read on the host while capturing (CUDA refuses it)")
        schema = func._schema
        if schema.is_mutable:  # nothing written while capturing: the replay writes it
            self.calls.append((func, args, kwargs, ()))
            return _written(schema, args, kwargs)
        result = func(*args, **kwargs)
        # a returned alias of an argument (a view) sees the replay's writes: nothing to copy into it
        made = tuple(None if aliased else t for aliased, t in _returned(schema, result))
        self.calls.append((func, args, kwargs, made))
        return result


class HostReads(TorchDispatchMode):
    """Notes whether anything read a device value on the host while it was on (``seen``): a warm-up run
    watched this way tells whether capturing its program would be refused. It changes no value."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.seen and _reads_on_host(func, args, kwargs) and _on_a_device(args, kwargs):
            self.seen = True
        return func(*args, **kwargs)


def _reads_on_host(func, args, kwargs) -> bool:
    """A call that hands a device value to the host: ``.item()``, ``torch.equal``, a tensor's truth, or a
    copy from a device tensor into host memory (``.cpu()``, ``.tolist()`` on CUDA)."""
    if func in _HOST_READS:
        return True
    if func is torch.ops.aten._to_copy.default:
        device = kwargs.get("device")
        return device is not None and torch.device(device).type == "cpu" and args[0].device.type != "cpu"
    if func is torch.ops.aten.copy_.default:
        return args[0].device.type == "cpu" and args[1].device.type not in ("cpu", "meta")
    return False


_HOST_READS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.equal.default,
               torch.ops.aten.is_nonzero.default}


def _returned(schema, result) -> list[tuple[bool, torch.Tensor | None]]:
    """Each tensor a call returned, in order, with whether it aliases an argument: a schema's return
    may be one tensor or a list of them (``_foreach_add``'s ``Tensor[]``)."""
    values = result if len(schema.returns) > 1 else (result,)
    out = []
    for r, value in zip(schema.returns, values):
        aliased = r.alias_info is not None
        for t in value if isinstance(value, (list, tuple)) else (value,):
            out.append((aliased, t if isinstance(t, torch.Tensor) else None))
    return out


def _on_a_device(args, kwargs) -> bool:
    """Whether a tensor argument is a real one (not meta)."""
    stack = [*args, *kwargs.values()]
    while stack:
        a = stack.pop()
        if isinstance(a, torch.Tensor):
            if a.device.type != "meta":
                return True
        elif isinstance(a, (list, tuple)):
            stack.extend(a)
    return False


def _written(schema, args, kwargs):
    """What an in-place call returns (the arguments its schema writes), without running it."""
    by_alias = {}
    for position, argument in enumerate(schema.arguments):
        if argument.alias_info is not None and argument.alias_info.is_write:
            value = kwargs.get(argument.name, args[position] if position < len(args) else None)
            by_alias[frozenset(argument.alias_info.before_set)] = value
    returned = [by_alias.get(frozenset(r.alias_info.before_set)) if r.alias_info is not None else None
                for r in schema.returns]
    if not returned:
        return None
    return returned[0] if len(returned) == 1 else tuple(returned)
