"""``draws_nothing`` (``service/ops/_native.py``) is true only of calls that leave torch's generator as it was.

The server skips the session-generator swap for those calls, and a CUDA-graph capture takes them
(``graph_signature``): a call that did draw would then draw from the wrong generator, or be
replayed with stale numbers. Each case runs torch's own function and compares the default
generator's state before and after.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from remote_autograd.service.ops._native import draws_nothing

X = torch.randn(2, 4, 8, 8)
CASES = [  # (wire name, args after the input, kwargs, draws?)
    ("nn.functional.dropout", [0.0, True], {}, False),
    ("nn.functional.dropout", [], {"p": 0, "training": True}, False),
    ("nn.functional.dropout", [0.5, False], {}, False),
    ("nn.functional.dropout", [0.5], {}, True),
    ("nn.functional.dropout", [], {}, True),
    ("nn.functional.dropout2d", [0.0], {}, False),
    ("nn.functional.dropout2d", [], {"p": 0.25}, True),
    ("nn.functional.alpha_dropout", [0.5], {}, False),  # training defaults to False there
    ("nn.functional.alpha_dropout", [0.5, True], {}, True),
    ("nn.functional.feature_alpha_dropout", [0.0, True], {}, False),
    ("nn.functional.scaled_dot_product_attention", [X, X], {"is_causal": True}, False),
    ("nn.functional.scaled_dot_product_attention", [X, X], {"dropout_p": 0.0}, False),
    ("nn.functional.scaled_dot_product_attention", [X, X, None, 0.1], {}, True),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_draws_nothing_agrees_with_torchs_generator(case):
    name, args, kwargs, draws = CASES[case]
    fn = getattr(F, name.rpartition(".")[2])
    before = torch.default_generator.get_state()
    fn(X, *args, **kwargs)
    drew = not torch.equal(before, torch.default_generator.get_state())
    assert drew == draws  # the case table is torch's behaviour
    assert draws_nothing(name, [X, *args], kwargs) == (not draws)


def test_other_random_ops_are_never_said_to_draw_nothing():
    assert not draws_nothing("rand_like", [X], {})
    assert not draws_nothing("nn.functional.rrelu", [X, 0.1, 0.3, False], {})
