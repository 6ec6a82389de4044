"""What never runs on the server, and why: the deny-list of the surface generator (``derive.py``).

``DENY`` is written by hand and short: patterns of spellings (``fnmatch``) with the reason, copied
into ``surface.json`` as its ``deny`` section. Most of it never appears among the recorded calls
(nothing in torch's databases calls ``torch.load``); it is listed so the file says so. The rest of a
refusal is derived: an entry whose outputs torch's meta kernels cannot derive is refused unless
``arg_checks.CHECKS`` has a contract for it, and a data-dependent one unless ``bounds.BOUNDS`` bounds
its outputs (the server charges every output's bytes before the kernel runs).
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Any

from remote_autograd.service.ops import arg_checks, bounds

_IO = "file or network I/O: the server reads and writes no files for a session"
_GLOBAL = "process-global state: shared by every session of the server (seed the session with sess.manual_seed)"
_STORAGE = "storage and pointer access: the server's memory is not the client's to address"
_SPARSE = "sparse layouts: not tested on the server yet"
_CALLABLE = "takes a Python callable: no code travels to the server"
_AUTOGRAD = "autograd state the SDK keeps itself (requires_grad_, retain_grad, grads: steps of their own)"
_ATEN = "ATen internals (torch.ops.aten.*): below the Python surface the SDK routes"
_MOVE = "a move between devices: the SDK's .to(device)/.cpu() move tensors, the server keeps them where they are"

DENY: dict[str, str] = {
    "torch.load": _IO, "torch.save": _IO, "torch.from_file": _IO, "torch.Tensor.tofile": _IO,
    "torch.frombuffer": _IO, "torch.from_numpy": _IO, "torch.Tensor.numpy": _IO, "torch.from_dlpack": _IO,
    "torch.Tensor.__dlpack__": _IO, "torch.Tensor.__reduce_ex__": _IO,
    "torch.set_num_threads": _GLOBAL, "torch.set_num_interop_threads": _GLOBAL, "torch.set_default_dtype": _GLOBAL,
    "torch.set_default_device": _GLOBAL, "torch.set_default_tensor_type": _GLOBAL, "torch.manual_seed": _GLOBAL,
    "torch.seed": _GLOBAL, "torch.set_rng_state": _GLOBAL, "torch.random.*": _GLOBAL,
    "torch.use_deterministic_algorithms": _GLOBAL, "torch.set_flush_denormal": _GLOBAL,
    "torch.set_printoptions": _GLOBAL, "torch.autograd.*": _GLOBAL, "torch.cuda.*": _GLOBAL,
    "torch.Tensor.data_ptr": _STORAGE, "torch.Tensor.untyped_storage": _STORAGE, "torch.Tensor.storage": _STORAGE,
    "torch.Tensor._typed_storage": _STORAGE, "torch.Tensor.share_memory_": _STORAGE, "torch.Tensor.set_": _STORAGE,
    "torch.Tensor.pin_memory": _STORAGE, "torch.Tensor.record_stream": _STORAGE, "torch.Tensor._fix_weakref": _STORAGE,
    "torch.Tensor.data.__set__": _STORAGE,
    "*sparse*": _SPARSE, "torch.Tensor.to_mkldnn": _SPARSE,
    "torch.Tensor.apply_": _CALLABLE, "torch.Tensor.map_": _CALLABLE, "torch.Tensor.map2_": _CALLABLE,
    "torch.Tensor.register_*hook": _CALLABLE, "torch.cond": _CALLABLE, "torch.vmap": _CALLABLE,
    "torch.func.*": _CALLABLE,
    "torch.Tensor.requires_grad_": _AUTOGRAD, "torch.Tensor.retain_grad": _AUTOGRAD,
    "torch.Tensor.backward": _AUTOGRAD, "torch.Tensor.grad.*": _AUTOGRAD, "torch.Tensor.detach_": _AUTOGRAD,
    "torch.detach_": _AUTOGRAD, "torch.Tensor.data.__get__": _AUTOGRAD,
    "torch.Tensor.cpu": _MOVE, "torch.Tensor.cuda": _MOVE, "aten.*": _ATEN, "torch.ops.*": _ATEN,
}

NO_META = "no meta kernel: its arguments cannot be checked before the kernel runs"
NO_BOUND = "data-dependent output size with no bound: its outputs' bytes cannot be charged before the kernel runs"
NOT_RUN = "its recorded samples do not run on a CPU build of torch"


def denied(spelling: str) -> str | None:
    for pattern, why in DENY.items():
        if fnmatchcase(spelling, pattern):
            return why
    return None


def refusal(name: str, ran: bool, facts: dict[str, Any]) -> str | None:
    """Why entry ``name`` is refused as a whole (its spellings passed ``denied``), or None."""
    if not ran:
        return NOT_RUN
    if facts["meta"] == "data_dependent":
        return None if name in bounds.BOUNDS else NO_BOUND
    if facts["meta"] == "missing" and name not in arg_checks.CHECKS:
        return NO_META
    return None
