"""Random native ops draw from the session's generator: ``session_rng``.

Torch's kernels that take no ``generator=`` (dropout inside ``scaled_dot_product_attention``,
``feature_dropout``, an LSTM's inter-layer dropout) read the process's default
generator, so for the length of the call that generator is given the session
generator's state, and the state it ends in is written back to the session.
"""

from __future__ import annotations

import contextlib
import threading
import torch

from ._context import current

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
