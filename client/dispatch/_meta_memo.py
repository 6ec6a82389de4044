"""A memo of output metadata, keyed by the op and its arguments' metadata: repeated ops skip inference.

The plain path (``_outputs.infer``) works out an op's outputs from its shape rule: the
cheap rules (broadcasting and type promotion) or torch's meta kernels, which also say
which outputs are views of which inputs with what strides (what ``_views.settle`` reads).
Many meta kernels are torch's Python references (norms, pow, elementwise prims), costly
for an op whose data is tiny, and a training loop asks the same question every step.

This memo keys each question by everything the answer can depend on and keeps the answer:
a repeated op then costs a key and a dictionary look-up instead of a meta kernel (or the
cheap rules). The key holds the op's shape rule and torch callable, and for each argument
in order:

- a RemoteTensor: its shape, strides as the client tracks them, dtype and requires_grad;
  a second use of the same tensor as a back reference (``x * x`` and ``x * y`` differ:
  an output that is a view names the input it is a view of);
- a local tensor: shape, stride, storage offset, dtype and requires_grad;
- a Python value: its type and value (``2``, ``2.0`` and ``True`` are equal in Python but
  not to torch's type promotion); lists, tuples and slices item by item. A value of any
  other type is not keyed: the plain path answers, and nothing is kept;

and the state that changes torch's answers: grad mode, the default dtype, autocast.
Answers name a view's source by position (``_outputs``), never a tensor, so an entry
keeps no handle alive and fits every call with the same key.

``disabled()`` runs the plain path only; ``verifying()`` runs it beside every hit and
raises when the two differ (the tests run training loops so). Size is bounded: two
generations of at most ``CAP`` entries each, an entry used again while in the older one
moved to the newer (a cheap approximation of least-recently-used).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch

from .._core import INFERENCE, RemoteTensor
from . import _outputs
from ._outputs import Answer

CAP = 4096

_PLAIN_TYPES = frozenset({bool, int, float, complex, str, type(None), type(Ellipsis), torch.dtype, torch.device,
                          torch.memory_format, torch.layout})
_SEQUENCES = (list, tuple)  # torch.Size and named tuples too: the key keeps the exact type
_SAME = object()  # key of a RemoteTensor already met in this call: (_SAME, its position)
_GRAD_ENABLED, _DEFAULT_DTYPE, _ANY_AUTOCAST = torch.is_grad_enabled, torch.get_default_dtype, torch._C._is_any_autocast_enabled


class _NoKey(Exception):
    """An argument the key cannot hold faithfully: the plain path answers."""


class MetaMemo:
    """The memo: answers by key, in two generations; counts hits and misses for the bench."""

    def __init__(self, cap: int = CAP) -> None:
        self.cap = cap
        self.enabled, self.verify = True, False
        self.hits = self.misses = 0
        self._new: dict = {}
        self._old: dict = {}

    def answer(self, rule: str, func: Callable | None, args: tuple, kwargs: dict,
               default_dtype: torch.dtype | None = None) -> Answer:
        """What ``_outputs.infer`` answers, from the memo when the same question was asked before.
        ``default_dtype``: torch's, when the caller has read it already."""
        tensors: list = []
        key = None
        if self.enabled:
            try:
                keys = []
                for a in args:  # a loop, not a comprehension: no frame of its own per op
                    if isinstance(a, RemoteTensor):  # _key's RemoteTensor case, inline: most ops' arguments
                        for i, seen in enumerate(tensors):
                            if seen is a:
                                keys.append((_SAME, i))
                                break
                        else:
                            tensors.append(a)
                            keys.append((RemoteTensor, a._shape, a._strides, a._dtype, a._rg))
                    else:
                        keys.append(_key(a, tensors))
                key = (rule, func, tuple(keys),
                       tuple([(k, _key(v, tensors)) for k, v in kwargs.items()]) if kwargs else (),
                       _GRAD_ENABLED(), default_dtype or _DEFAULT_DTYPE(), _ANY_AUTOCAST() and _autocast_state())
                found = self._new.get(key)
            except (_NoKey, TypeError):  # an argument it cannot key, or an unhashable callable
                key, tensors = None, []
        if key is None:
            return _outputs.with_sources(_outputs.infer(rule, func, args, kwargs, tensors), tensors)
        if found is None:
            found = self._old.pop(key, None)
            if found is not None:
                self._store(key, found)
        if found is None:
            self.misses += 1
            found = _outputs.infer(rule, func, args, kwargs, tensors)
            self._store(key, found)
        else:
            self.hits += 1
            if self.verify:
                _check_same(found, _outputs.infer(rule, func, args, kwargs, tensors), func)
        for pos, _, _ in found[2]:  # a view's source to name? (most answers: none, and no call to with_sources)
            if pos is not None:
                return _outputs.with_sources(found, tensors)
        return found

    def _store(self, key, value: Answer) -> None:
        if len(self._new) >= self.cap:
            self._old, self._new = self._new, {}
        self._new[key] = value

    def clear(self) -> None:
        self._new, self._old = {}, {}
        self.hits = self.misses = 0


MEMO = MetaMemo()
# answer(rule, func, args, kwargs[, default_dtype]): ``(metas, container, views)`` of ``func(*args, **kwargs)``
# under shape rule ``rule``, the views' sources as the RemoteTensors themselves; ``(None, None, ())`` to ask the server
answer = MEMO.answer
INFERENCE["outputs"] = answer  # the core's call_op asks it (client/_core's docstring says why a table)


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Every question goes to the plain path (``_outputs.infer``), as without the memo."""
    before, MEMO.enabled = MEMO.enabled, False
    try:
        yield
    finally:
        MEMO.enabled = before


@contextlib.contextmanager
def verifying() -> Iterator[MetaMemo]:
    """Every hit is also answered by the plain path; a difference raises ``AssertionError``."""
    before, MEMO.verify = MEMO.verify, True
    try:
        yield MEMO
    finally:
        MEMO.verify = before


def _check_same(kept: Answer, fresh: Answer, func: Callable) -> None:
    if kept != fresh:
        raise AssertionError(f"meta memo: {func} answered {kept} from the memo, {fresh} from the plain path")


def _autocast_state() -> tuple:
    return tuple((torch.is_autocast_enabled(d), torch.get_autocast_dtype(d))
                 for d in ("cpu", "cuda", torch._C._get_privateuse1_backend_name()))


def _key(v: Any, tensors: list) -> Any:
    tp = type(v)
    if tp in _PLAIN_TYPES:
        return tp, v
    if isinstance(v, RemoteTensor):
        for i, seen in enumerate(tensors):
            if seen is v:
                return _SAME, i
        tensors.append(v)
        return RemoteTensor, v._shape, v._strides, v._dtype, v._rg  # (``answer`` builds a call's first one alike)
    if isinstance(v, torch.Tensor):
        return torch.Tensor, tuple(v.shape), v.stride(), v.storage_offset(), v.dtype, v.requires_grad
    if isinstance(v, _SEQUENCES):
        return tp, *[_key(x, tensors) for x in v]
    if tp is slice:
        return slice, _key(v.start, tensors), _key(v.stop, tensors), _key(v.step, tensors)
    raise _NoKey
