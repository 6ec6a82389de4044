"""What README.md and docs/known-differences.md say works does, and what they give as refused
still is (issue 33: `nn.LSTM`, `Tensor.digamma`, `torch.equal` had been named as refused long after
they worked). Each backticked example of those sentences must have its check here, so a new
example without one fails too."""

from __future__ import annotations

import copy
import io
import re
from pathlib import Path
from typing import Callable, Iterator

import pytest
import torch
from torch import nn

from remote_autograd import client

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
DIFFERENCES = (ROOT / "docs" / "known-differences.md").read_text()


@pytest.fixture(scope="module")
def sess() -> Iterator[client.Session]:
    with client.connect(transport=client.InProcessTransport()) as s:
        yield s


def _ticked(text: str) -> list[str]:
    return re.findall(r"`([^`]+)`", " ".join(text.split()))


def _x(sess) -> torch.Tensor:
    return torch.randn(3, 3).to(sess.device)


# what each example of a refusal runs
REFUSED: dict[str, Callable] = {
    "torch.linalg.lstsq": lambda s: torch.linalg.lstsq(_x(s), _x(s)),
    "linalg.lstsq": lambda s: torch.linalg.lstsq(_x(s), _x(s)),
    "Tensor.geqrf": lambda s: _x(s).geqrf(),
    "geqrf": lambda s: torch.geqrf(_x(s)),
    "histogramdd": lambda s: torch.histogramdd(_x(s), bins=2),
    "istft": lambda s: torch.istft(torch.randn(9, 5, dtype=torch.complex64).to(s.device), 16,
                                   window=torch.hann_window(16).to(s.device)),
    "torch.linspace": lambda s: torch.linspace(_x(s)[0, 0], _x(s)[0, 1], 5),
    "tril_indices": lambda s: torch.tril_indices(3, 3, device=s.device),
    "triu_indices": lambda s: torch.triu_indices(3, 3, device=s.device),
    "torch.meshgrid": lambda s: torch.meshgrid([_x(s)[0], _x(s)[1]], indexing="ij"),
}


# The examples of a refusal: README's "naming what you wrote (...)", known-differences' "meta kernel (...:"
# and "Not yet: ...." lists.
README_REFUSED = _ticked(re.search(r"naming what you wrote \(([^)]*)\)", README).group(1))
NO_META = _ticked(re.search(r"meta kernel \(([^:]*):", DIFFERENCES).group(1))
NOT_YET = _ticked(re.sub(r"\(`\w+` works\)", "", re.search(r"Not yet: (.*?)\.\s", DIFFERENCES, re.S).group(1)))


@pytest.mark.parametrize("name", sorted({*README_REFUSED, *NO_META, *NOT_YET}))
def test_what_the_docs_give_as_refused_is_refused_loudly(sess, name: str):
    for spelling in name.split("/"):  # `tril_indices`/`triu_indices`
        assert spelling in REFUSED, f"the docs name {spelling!r} as refused: add a call of it to REFUSED"
        with pytest.raises((NotImplementedError, RuntimeError)):
            REFUSED[spelling](sess)
    if name in README_REFUSED:  # the SDK's own refusal: it names the call and how to run it anyway
        with pytest.raises(NotImplementedError) as info:
            REFUSED[name](sess)
        assert name in str(info.value) and "`x.detach().cpu()`" in str(info.value)


def test_the_readme_and_the_differences_name_their_examples():
    assert README_REFUSED == ["torch.linalg.lstsq", "Tensor.geqrf"]
    assert len(NO_META) >= 3 and len(NOT_YET) >= 3


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 2)

    def forward(self, x):
        return self.lin(x)


def _torch_load(s) -> None:
    buf = io.BytesIO()
    torch.save(_Net().state_dict(), buf)
    buf.seek(0)
    loaded = torch.load(buf, map_location=s.device, weights_only=True)
    assert all(v.device == s.device for v in loaded.values())


def _module_built_on(s) -> None:
    with torch.device(s.device):
        model = _Net()
    assert model.lin.weight.device == s.device


# what each "works as with cuda" example of README's device bullet runs (each asserts its result)
WORKS: dict[str, Callable] = {
    "x.to(device)": lambda s: torch.ones(2).to(s.device).device == s.device,
    "model.to(device)": lambda s: _Net().to(s.device).lin.weight.device == s.device,
    "torch.zeros(..., device=device)": lambda s: torch.zeros(2, device=s.device).sum().item() == 0.0,
    "x.new_zeros(...)": lambda s: _x(s).new_zeros(2).device == s.device,
    "x.new(...)": lambda s: _x(s).new([1.0, 2.0]).tolist() == [1.0, 2.0],
    "with torch.device(device): model = Net()": lambda s: _module_built_on(s) is None,
    "x.cpu()": lambda s: type(torch.ones(2).to(s.device).cpu()) is torch.Tensor,
    "copy.deepcopy": lambda s: copy.deepcopy(_Net().to(s.device)).lin.weight.device == s.device,
    "torch.load(path, map_location=device)": lambda s: _torch_load(s) is None,
    "x.cuda()": None,  # says to use the device instead: below
    "nn.LazyLinear(3).to(device)": lambda s: nn.LazyLinear(3).to(s.device)(_x(s)).shape == (3, 3),
    "logspace": lambda s: _logspace_like_cpu(_x(s)),
}


def _logspace_like_cpu(x: torch.Tensor) -> bool:
    return torch.equal(torch.logspace(x[0, 0], x[0, 1], 5).cpu(), torch.logspace(*x.cpu()[0, :2], 5))


def test_what_the_readme_says_works_like_cuda_works(sess):
    bullet = re.search(r"`sess.device` is a torch device .*?\n- ", README, re.S).group(0)
    lazy = re.search(r"\(Lazy modules work: (.*?)\)", DIFFERENCES, re.S).group(1)
    working = re.findall(r"\(`(\w+)` works\)", DIFFERENCES)  # an exception in the "Not yet" list
    claimed = [t for t in _ticked(bullet.split("):", 1)[1]) if t != '"cuda"'] + _ticked(lazy) + working
    assert claimed and not [c for c in claimed if c not in WORKS], "add a check of each to WORKS"
    for claim in claimed:
        if WORKS[claim] is not None:
            assert WORKS[claim](sess), claim
    with pytest.raises(RuntimeError, match="Use `device = sess.device`"):
        _x(sess).cuda()
