"""The one-training-function models (``tests/models``) compiled with ``backend="remote"``: the model
(``torch.compile(model, backend="remote")``), or the whole training step, trains on ``sess.device`` to
the values local torch gives, bit for bit.

Which local torch: with SGD, eager torch's. With the Adam family, torch's own compiled step: under
``torch.compile`` torch's Adam computes its bias corrections with tensors, where eager Adam uses Python
floats, so a compiled step rounds differently from an eager one in the last bit, on any device and any
backend (``torch.compile(opt.step, backend="eager")`` on the CPU does too). The reference is then local
torch compiled with ``backend="eager"`` (the graph run as it is) and dynamo's own rewrites off, as the
remote backend has them (``_traced._keep_eager_arithmetic``), its optimizers on their foreach path as
remote ones are (``client/tensor/_foreach.py``); eager torch's values are checked too, within 1e-5.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Callable, Iterator

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from ..models import gpt, resnet, transformer_classifier

pytestmark = [pytest.mark.real_model, pytest.mark.usefixtures("fresh_dynamo")]
SEED = 2026


@contextlib.contextmanager
def local_compiled() -> Iterator[Callable]:
    """Local torch's compiled reference: ``backend="eager"``, dynamo's rewrites off, foreach optimizers."""
    def foreach(optimizer, args, kwargs) -> None:
        for group in optimizer.param_groups:
            if group.get("foreach") is None:
                group["foreach"] = True

    hook = register_optimizer_step_pre_hook(foreach)
    try:
        with torch._dynamo.config.patch(enable_dynamo_decompositions=False):
            yield lambda fn: torch.compile(fn, backend="eager")
    finally:
        hook.remove()
        torch._dynamo.reset()


def _run(sess, build: Callable, train: Callable, *args, compile_model: bool, reference: str, **kwargs):
    """Train ``build()`` locally (the reference) and a twin on the session, compiled: equal losses and state."""
    torch.manual_seed(0)
    model = build()
    twin = copy.deepcopy(model)
    if reference == "eager":
        torch.manual_seed(SEED)
        want_losses, want_model = train(model, "cpu", *args, **kwargs)
    else:
        with local_compiled() as compile_local:
            torch.manual_seed(SEED)
            want_losses, want_model = train(compile_local(model) if compile_model else model, "cpu", *args,
                                            **kwargs)
    torch.manual_seed(SEED)
    sess.manual_seed(SEED)
    requests = sess.requests
    got_losses, got_model = train(torch.compile(twin, backend="remote") if compile_model else twin, sess.device,
                                  *args, **kwargs)
    assert sess.requests - requests >= len(want_losses)  # it ran there
    assert got_losses == want_losses
    want = {k.removeprefix("_orig_mod."): v for k, v in want_model.state_dict().items()}
    got = {k.removeprefix("_orig_mod."): v.cpu() for k, v in got_model.state_dict().items()}
    assert got.keys() == want.keys()
    for k in want:
        assert torch.equal(got[k], want[k]), k
    return got_losses


def _gpt_data() -> torch.Tensor:
    return torch.randint(0, 24, (200,), generator=torch.Generator().manual_seed(1))


def test_gpt_compiled_model(sess):
    """nanoGPT's ``model = torch.compile(model)``, with ``backend="remote"``: AdamW, a schedule, clipping, dropout."""
    losses = _run(sess, lambda: gpt.GPT(gpt.GPTConfig(dropout=0.1)), gpt.train, 4, _gpt_data(), compile_model=True,
                  reference="compiled")
    torch.manual_seed(0)
    model = gpt.GPT(gpt.GPTConfig(dropout=0.1))
    torch.manual_seed(SEED)
    eager, _ = gpt.train(model, "cpu", 4, _gpt_data())
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(eager), rtol=1e-5, atol=1e-6)


def test_gpt_compiled_training_step(sess, monkeypatch):
    """The whole step compiled: forward, zero_grad, backward, clipping, AdamW, the schedule and loss.item()."""
    step = gpt.train_step

    def train(model, device, *args):
        compile_fn = (lambda fn: torch.compile(fn, backend="remote")) if device != "cpu" else None
        monkeypatch.setattr(gpt, "train_step", compile_fn(step) if compile_fn else local_step[0])
        return gpt.train(model, device, *args)

    local_step = [None]
    with local_compiled() as compile_local:
        local_step[0] = compile_local(step)
        torch.manual_seed(0)
        model = gpt.GPT(gpt.GPTConfig(dropout=0.1))
        twin = copy.deepcopy(model)
        torch.manual_seed(SEED)
        want_losses, want_model = train(model, "cpu", 4, _gpt_data())
    torch.manual_seed(SEED)
    sess.manual_seed(SEED)
    got_losses, got_model = train(twin, sess.device, 4, _gpt_data())
    assert got_losses == want_losses
    for (k, got), want in zip(got_model.state_dict().items(), want_model.state_dict().values()):
        assert torch.equal(got.cpu(), want), k


def test_resnet_compiled_model_trains_as_eager_torch(sess):
    """BatchNorm's running statistics, in-place ReLU, SGD with momentum: eager torch's values exactly."""
    g = torch.Generator().manual_seed(1)
    images, labels = torch.randn(32, 3, 8, 8, generator=g), torch.randint(0, 5, (32,), generator=g)
    _run(sess, resnet.ResNet, resnet.train, 3, images, labels, compile_model=True, reference="eager")


def test_transformer_classifier_compiled_model(sess):
    tokens, labels = transformer_classifier.make_data()
    _run(sess, lambda: transformer_classifier.TransformerClassifier(dropout=0.0), transformer_classifier.train, 3,
         tokens, labels, compile_model=True, reference="compiled")
