"""The meta memo (``client/dispatch/_meta_memo.py``) against the plain path it stands in for
(``client/dispatch/_outputs.py``).

Every op of the training tests' loops (the models of ``tests/models`` and the optimizers of
``tests/e2e/test_training.py``) runs twice: with the memo verifying (each hit is also worked
out by the plain path, and any difference in the outputs' metadata or views raises), and with
the memo off. Both runs must send the same steps and get the same losses. Then each part of
the key is changed on its own: a memo that left it out would answer from a stale entry.
"""

from __future__ import annotations

import pytest
import torch

from bench import _hot
from remote_autograd import client
from remote_autograd.client.dispatch import _meta_memo
from remote_autograd.client.dispatch._meta_memo import MEMO
from tests.e2e.test_training import OPTIMIZERS, _data, _mlp, _train
from tests.models import char_lstm, dcgan, gpt, resnet, sine_lstm, transformer_classifier, vae


def _gpt(device):
    torch.manual_seed(0)
    data = torch.randint(0, 24, (200,), generator=torch.Generator().manual_seed(1))
    losses, model = gpt.train(gpt.GPT(gpt.GPTConfig()).double(), device, 3, data)
    return losses, gpt.sample(model, device, torch.tensor([[1], [5]]), 3, top_k=5)


def _char_lstm(device):
    torch.manual_seed(0)
    text, vocab = char_lstm.encode()
    return char_lstm.train(char_lstm.CharLSTM(vocab), device, 3, text)[0]


def _dcgan(device):
    torch.manual_seed(0)
    images = torch.rand(24, 1, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 2 - 1
    return dcgan.train(dcgan.DCGAN().double(), device, 3, images)[0]


def _vae(device):
    torch.manual_seed(0)
    return vae.train(vae.VAE(), device, 3, torch.rand(32, 16, generator=torch.Generator().manual_seed(1)))[0]


def _resnet(device):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    images, labels = torch.randn(32, 3, 8, 8, generator=g), torch.randint(0, 5, (32,), generator=g)
    losses, model = resnet.train(resnet.ResNet(), device, 3, images, labels)
    return losses, resnet.evaluate(model, device, images, labels, topk=(1, 3))


def _transformer(device):
    torch.manual_seed(0)
    tokens, labels = transformer_classifier.make_data()
    return transformer_classifier.train(transformer_classifier.TransformerClassifier().double(), device, 3,
                                        tokens, labels)[0]


def _sine_lstm(device):
    torch.manual_seed(0)
    return sine_lstm.train(sine_lstm.SineLSTM().double(), device, 2)[0]


def _optimizers(device):
    X, Y = _data()
    losses = []
    for make in OPTIMIZERS.values():
        model = _mlp().to(device)
        losses += _train(model, make(model.parameters()), X.to(device), Y.to(device), steps=3, clip=1.0)
    return losses


LOOPS = {"gpt": _gpt, "char_lstm": _char_lstm, "dcgan": _dcgan, "vae": _vae, "resnet": _resnet,
         "transformer": _transformer, "sine_lstm": _sine_lstm, "optimizers": _optimizers}


def _run(loop, memo):
    """``loop`` on a fresh session under ``memo`` (a context manager); the steps it sent and what it returned."""
    tap = _hot.Tap(client.InProcessTransport())
    with client.connect(transport=tap) as sess, _hot.recording(tap) as programs:
        sess.manual_seed(0)
        with memo:
            result = loop(sess.device)
        sess.sync()
        # frees follow the garbage collector's timing, which neither path decides
        return [s for body in programs() for s in body["steps"] if s["kind"] != "free"], result


# the optimizers' loop in the fast loop; the models' (seconds each) in `make test`
@pytest.mark.parametrize("name", [name if name == "optimizers" else pytest.param(name, marks=pytest.mark.slow)
                                  for name in LOOPS])
def test_a_training_loop_is_the_same_with_and_without_the_memo(name):
    MEMO.clear()
    with_memo = _run(LOOPS[name], _meta_memo.verifying())  # every hit checked against the plain path
    assert MEMO.hits > MEMO.misses, "the loop's later steps were answered from the memo"
    without = _run(LOOPS[name], _meta_memo.disabled())
    assert with_memo[1] == without[1]
    assert with_memo[0] == without[0]


@pytest.fixture
def sess():
    with client.connect(transport=client.InProcessTransport()) as s:
        yield s


def _misses(fn) -> int:
    before = MEMO.misses
    fn()
    return MEMO.misses - before


def test_the_same_shape_with_other_strides_gives_other_strides(sess):
    local = torch.randn(4, 6)
    contiguous, transposed = sess.tensor(local.t().contiguous()), sess.tensor(local).t()  # both (6, 4)
    assert contiguous.stride() != transposed.stride()
    for _ in range(2):
        assert contiguous.transpose(0, 1).stride() == local.t().contiguous().transpose(0, 1).stride()
        assert transposed.transpose(0, 1).stride() == local.stride()
        assert transposed[1:].stride() == local.t()[1:].stride()


def test_dtype_shape_and_python_values_are_keyed(sess):
    ints, floats = sess.tensor(torch.arange(6).reshape(2, 3)), sess.tensor(torch.rand(2, 3, dtype=torch.float64))
    for _ in range(2):
        assert torch.linalg.vector_norm(floats, 2.0).dtype == torch.float64
        assert torch.linalg.vector_norm(floats.float(), 2.0).dtype == torch.float32
        assert floats.sum(0).shape == (3,) and floats.sum(1).shape == (2,)
        assert floats[0].sum(0).shape == ()
        # 2, 2.0 and True are equal (and hash alike) in Python, not to torch's type promotion
        assert [(ints * v).dtype for v in (2, 2.0, True)] == [torch.int64, torch.float32, torch.int64]
        assert [torch.mul(ints, v).dtype for v in (True, 2.0, 2)] == [torch.int64, torch.float32, torch.int64]


def test_the_default_dtype_is_keyed(sess):
    ints = sess.tensor(torch.arange(4))
    assert ints.sqrt().dtype == torch.float32
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert ints.sqrt().dtype == torch.float64
        assert torch.true_divide(ints, 2).dtype == torch.float64
    finally:
        torch.set_default_dtype(before)
    assert ints.sqrt().dtype == torch.true_divide(ints, 2).dtype == torch.float32


def test_requires_grad_grad_mode_and_autocast_are_keyed(sess):
    x, w = sess.tensor(torch.randn(3, 4)), sess.tensor(torch.randn(3, 4), requires_grad=True)
    norm = lambda t: torch.linalg.vector_norm(t, 2.0)  # noqa: E731  (a meta-kernel op)
    norm(x)
    assert _misses(lambda: norm(x)) == 0
    assert _misses(lambda: norm(w)) == 1 and norm(w).requires_grad and not norm(x).requires_grad
    with torch.no_grad():
        assert _misses(lambda: norm(w)) == 1 and not norm(w).requires_grad
    torch.set_autocast_enabled("cpu", True)  # leaves remote ops alone, but is part of the state
    try:
        assert _misses(lambda: norm(x)) == 1
    finally:
        torch.set_autocast_enabled("cpu", False)


def test_local_tensors_are_keyed_by_offset_and_stride():
    memo, base = _meta_memo.MetaMemo(), torch.arange(12.0)
    for t in (base[:6], base[6:], base[::2], base[:6].clone(), base[:6]):
        memo.answer("meta", torch.neg, (t,), {})
    assert (memo.misses, memo.hits) == (3, 2)  # a clone of base[:6] has its shape, stride and offset


def _second_viewed(a, b):
    return b.view(-1)


def test_which_argument_an_output_views_follows_the_arguments_identity(sess):
    x, y = sess.tensor(torch.randn(2, 2)), sess.tensor(torch.randn(2, 2))
    (_, _, views), = [_meta_memo.answer("meta", _second_viewed, (x, y), {})]
    assert views[0][0] is y
    # the same metadata, but one tensor twice: the view's source is x (a memo keyed by metadata
    # alone would answer "the second tensor", which this call does not have)
    _, _, views = _meta_memo.answer("meta", _second_viewed, (x, x), {})
    assert views[0][0] is x
    _, _, views = _meta_memo.answer("meta", _second_viewed, (y, x), {})
    assert views[0][0] is x


def test_arguments_it_cannot_key_take_the_plain_path(sess):
    x = sess.tensor(torch.randn(4))
    before = (MEMO.hits, MEMO.misses)
    metas, _, _ = _meta_memo.answer("meta", lambda t, obj: t.view(-1), (x, object()), {})
    assert metas == (((4,), torch.float32),) and (MEMO.hits, MEMO.misses) == before


def test_the_memo_is_bounded():
    memo = _meta_memo.MetaMemo(cap=4)
    for n in range(20):
        memo.answer("meta", torch.zeros, (n,), {"device": "meta"})
    assert len(memo._new) + len(memo._old) <= 8 and memo.misses == 20
    memo.answer("meta", torch.zeros, (19,), {"device": "meta"})
    assert memo.hits == 1
