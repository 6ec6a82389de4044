"""Random native ops draw from the session's generator: ``session_rng``; ``draws_nothing`` says when
a call of one draws nothing at all.

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


# Random ops that, with these arguments, draw nothing: torch leaves every generator as it was (a
# dropout of probability 0 or out of training, attention without dropout). By wire name: the
# probability's name, position and default, and the training flag's (None: the op has none).
_DRAW_ARGUMENTS = {
    **{f"nn.functional.{name}": (("p", 1, 0.5), ("training", 2, True))
       for name in ("dropout", "dropout1d", "dropout2d", "dropout3d")},
    **{f"nn.functional.{name}": (("p", 1, 0.5), ("training", 2, False))
       for name in ("alpha_dropout", "feature_alpha_dropout")},
    "nn.functional.scaled_dot_product_attention": (("dropout_p", 4, 0.0), None),
}


def draws_nothing(wire_name: str, args, kwargs) -> bool:
    """Whether a call of random op ``wire_name`` with ``args`` and ``kwargs`` (resolved, or as on the wire:
    the numbers are the same) leaves the generator untouched. ``tests/ops/test_draws_nothing.py``
    checks each case against torch's default generator."""
    rule = _DRAW_ARGUMENTS.get(wire_name)
    if rule is None:
        return False
    probability, training = (_argument(args, kwargs, *r) if r is not None else True for r in rule)
    return training is False or (type(probability) in (int, float) and probability == 0)


def _argument(args, kwargs, name: str, position: int, default):
    if name in kwargs:
        return kwargs[name]
    return args[position] if len(args) > position else default
