"""Native entries: torch's own op, with torch's own derivative, allow-listed by name.

``native_op("topk", torch.topk, ...)`` registers an entry (kind ``native``) whose
``fn`` calls exactly ``torch.topk``: the value and the gradient are torch's, so the
generated tests (values, grads, gradcheck, gradgradcheck, the remote round trip)
check only that the routing and the samples are right. Only callables named in
the code are ever called; wire names are looked up in the table, never on ``torch``.

Random native ops (``random=True``) draw from the session's generator: torch's
kernels that take no ``generator=`` (dropout inside ``scaled_dot_product_attention``,
``feature_dropout``, an LSTM's inter-layer dropout) read the process's default
generator, so for the length of the call that generator is given the session
generator's state, and the state it ends in is written back to the session.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterable

import torch

from ._context import current
from ._registry import op
from ._samples import Sample

# Steps of different sessions may run on different worker threads; the default generator is one
# per process, so the swap below is held for the whole call.
_DEFAULT_GENERATOR_LOCK = threading.Lock()


def _default_generator_for(gen: torch.Generator) -> torch.Generator:
    if gen.device.type == "cpu":
        return torch.default_generator
    return torch.cuda.default_generators[gen.device.index or 0]


@contextlib.contextmanager
def session_rng():
    """Make torch's default generator (of the session's device) draw from the session's generator."""
    gen = current().generator
    default = _default_generator_for(gen)
    if gen is default:  # outside a program (in-process tests): already the one drawn from
        yield
        return
    with _DEFAULT_GENERATOR_LOCK:
        saved = default.get_state()
        default.set_state(gen.get_state())
        try:
            yield
        finally:
            gen.set_state(default.get_state())
            default.set_state(saved)


def native_op(name: str, torch_fn: Callable[..., Any], *, torch_names: Iterable[str], samples: Iterable[Sample],
              reference: Callable[..., Any] | None = None, random: bool = False, **facts: Any) -> Callable[..., Any]:
    """Register ``torch_fn`` itself as op ``name`` (kind ``native``); ``reference`` defaults to ``torch_fn``.

    ``random``: the op draws random numbers, from the session's generator (``session_rng``);
    such an op is not ``exact`` (gradcheck would redraw).
    """
    if random:
        def call(*args, **kwargs):
            with session_rng():
                return torch_fn(*args, **kwargs)
        facts.setdefault("exact", False)
    else:
        def call(*args, **kwargs):
            return torch_fn(*args, **kwargs)
    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"torch's own {getattr(torch_fn, '__name__', name)} (torch's derivative)"
    facts.setdefault("meta_fn", torch_fn)  # the meta check runs torch's function itself (no generator swap)
    return op(name, torch_names=torch_names, samples=samples, reference=reference or torch_fn, kind="native",
              **facts)(call)
