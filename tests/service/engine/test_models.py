"""Big models without uploading their weights: safetensors files in the server's model directory
(``REMOTE_AUTOGRAD_MODEL_DIR``) are listed (``GET /v1/models``), described, and loaded by a
``load`` step, and ``sess.load_weights`` fills a model on the device with the same result as
``model.load_state_dict(safetensors.torch.load_file(path))`` locally. Names are names only:
paths, ``..``, links out of the directory and other files are refused, loudly. The files are
written by the tests; one is a pickle under a .safetensors name, which must not run.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Iterator

import httpx
import pytest
import safetensors.torch
import torch

from remote_autograd import client
from remote_autograd.client.transport._embedded import service_app

from ...bits import assert_same_bits
from ...conftest import PROTOCOL_HEADERS

MODEL = "tiny/model.safetensors"


def _net() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.ReLU(), torch.nn.Linear(3, 2))


class _Pwned:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    (root / "tiny").mkdir(parents=True)
    torch.manual_seed(3)
    trained = _net()
    trained[1].running_mean.add_(1.5)
    trained[1].num_batches_tracked.add_(7)
    safetensors.torch.save_file({k: v.detach().clone() for k, v in trained.state_dict().items()}, root / MODEL)
    safetensors.torch.save_file({"w": torch.arange(6, dtype=torch.float64).reshape(2, 3), "b": torch.ones(2)},
                                root / "small.safetensors")
    (root / "tiny" / "notes.txt").write_text("not a model")
    (root / "pickle.safetensors").write_bytes(pickle.dumps(_Pwned()))  # a pickle by another name
    outside = tmp_path / "secret.safetensors"
    safetensors.torch.save_file({"k": torch.zeros(1)}, outside)
    (root / "escape.safetensors").symlink_to(outside)  # a link out of the directory
    (root / "inside.safetensors").symlink_to(root / "small.safetensors")  # a link that stays in
    return root


@pytest.fixture
def app(model_dir: Path):
    return service_app(model_dir=str(model_dir), max_session_bytes=1 << 20)


@pytest.fixture
def http(app) -> Iterator[httpx.Client]:
    with httpx.Client(transport=client.InProcessTransport(app), base_url="http://in-process",
                      headers=PROTOCOL_HEADERS) as c:
        yield c


def test_models_lists_the_safetensors_files_by_relative_name(http: httpx.Client, model_dir: Path):
    r = http.get("/v1/models")
    assert r.status_code == 200
    names = [m["name"] for m in r.json()["models"]]
    assert names == ["inside.safetensors", "pickle.safetensors", "small.safetensors", MODEL]  # no link out
    assert r.json()["models"][3]["bytes"] == (model_dir / MODEL).stat().st_size


def test_without_a_model_dir_nothing_is_listed_and_a_load_says_why():
    with httpx.Client(transport=client.InProcessTransport(service_app()), base_url="http://in-process",
                      headers=PROTOCOL_HEADERS) as c:
        assert c.get("/v1/models").json() == {"models": []}
        r = c.get(f"/v1/models/{MODEL}")
        assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_model"
        assert "REMOTE_AUTOGRAD_MODEL_DIR" in r.json()["error"]["message"]


def test_a_model_is_described_in_the_order_load_file_gives(http: httpx.Client, model_dir: Path):
    info = http.get(f"/v1/models/{MODEL}").json()
    local = safetensors.torch.load_file(model_dir / MODEL)
    assert [t["key"] for t in info["tensors"]] == list(local)
    by_key = {t["key"]: t for t in info["tensors"]}
    assert by_key["1.num_batches_tracked"] == {"key": "1.num_batches_tracked", "dtype": "int64", "shape": []}
    assert by_key["0.weight"]["shape"] == [3, 4] and by_key["0.weight"]["dtype"] == "float32"


@pytest.mark.parametrize("name,rule", [
    ("/etc/passwd", "not a path"),
    ("../secret.safetensors", "'..' parts"),
    ("tiny/../../secret.safetensors", "'..' parts"),
    ("./small.safetensors", "'.' or '..' parts"),
    ("tiny//model.safetensors", "empty"),
    ("escape.safetensors", "leads outside the model directory"),
    ("tiny/notes.txt", "only .safetensors files"),
    ("tiny", "only .safetensors files"),
])
def test_names_outside_the_rules_are_refused_naming_the_rule(http: httpx.Client, name: str, rule: str):
    # in a URL, '.' and '..' segments go percent-encoded (a client would drop them); the server decodes them
    url = "/v1/models/" + "/".join("%2E" * len(p) if p in (".", "..") else p for p in name.split("/"))
    for r in (http.get(url), _program(http, [_load(name, {"k": "x"})])):
        assert r.status_code == 400, (name, r.text)
        assert r.json()["error"]["code"] == "bad_request" and rule in r.json()["error"]["message"], r.text


def test_a_pickle_is_not_a_safetensors_file_and_never_runs(http: httpx.Client, model_dir: Path):
    r = _program(http, [_load("pickle.safetensors", {"k": "x"})])
    assert r.status_code == 422 and "not a readable safetensors file" in r.json()["error"]["message"]
    assert not (model_dir / "pwned").exists() and not Path("pwned").exists()


def test_a_missing_file_is_404(http: httpx.Client):
    r = http.get("/v1/models/tiny/other.safetensors")
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_model"


# -- the load step ------------------------------------------------------------------------------


def _load(file: str, tensors: dict) -> dict:
    return {"kind": "load", "file": file, "tensors": tensors}


def _program(http: httpx.Client, steps: list, sid: str | None = None) -> httpx.Response:
    sid = sid or http.post("/v1/sessions").json()["session_id"]
    return http.post(f"/v1/sessions/{sid}/programs", json={"id": os.urandom(6).hex(), "steps": steps})


def test_load_makes_tensors_of_the_files_values_and_counts_their_bytes(http: httpx.Client, model_dir: Path):
    sid = http.post("/v1/sessions").json()["session_id"]
    r = _program(http, [_load("inside.safetensors", {"w": "W", "b": "B"}), {"kind": "fetch", "id": "W"}], sid)
    assert r.status_code == 200, r.text
    assert r.json()["results"][0] == {"tensors": [
        {"id": "W", "dtype": "float64", "shape": [2, 3], "requires_grad": False},
        {"id": "B", "dtype": "float32", "shape": [2], "requires_grad": False}]}
    assert r.json()["results"][1]["tensor"]["value"]["data"] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    info = http.get(f"/v1/sessions/{sid}").json()
    assert info["tensors"] == 2 and info["bytes"] == 6 * 8 + 2 * 4


def test_a_failing_load_leaves_nothing(http: httpx.Client):
    sid = http.post("/v1/sessions").json()["session_id"]
    cases = [(_load("small.safetensors", {"w": "W", "nope": "N"}), 404, "unknown_tensor", "has no tensor 'nope'"),
             (_load("small.safetensors", {"w": "W", "b": "W"}), 409, "conflict", "repeat"),
             (_load("tiny/missing.safetensors", {"w": "W"}), 404, "unknown_model", "GET /v1/models")]
    for step, status, code, words in cases:
        r = _program(http, [step], sid)
        assert r.status_code == status and r.json()["error"]["code"] == code, r.text
        assert words in r.json()["error"]["message"] and r.json()["error"]["op"] == "load"
        assert http.get(f"/v1/sessions/{sid}").json()["tensors"] == 0


def test_a_load_over_the_session_limit_is_413_before_it_reads(tmp_path: Path, model_dir: Path):
    safetensors.torch.save_file({"big": torch.zeros(1 << 18)}, model_dir / "big.safetensors")  # 1 MiB
    app = service_app(model_dir=str(model_dir), max_session_bytes=(1 << 20) - 1)
    with httpx.Client(transport=client.InProcessTransport(app), base_url="http://in-process",
                      headers=PROTOCOL_HEADERS) as c:
        sid = c.post("/v1/sessions").json()["session_id"]
        r = _program(c, [_load("big.safetensors", {"big": "X"})], sid)
        assert r.status_code == 413 and "max_session_bytes" in r.json()["error"]["message"]
        info = c.get(f"/v1/sessions/{sid}").json()
        assert info["tensors"] == 0 and info["bytes"] == 0


# -- the SDK: sess.load_weights -----------------------------------------------------------------


@pytest.fixture
def sess(app) -> Iterator[client.Session]:
    with client.connect(transport=client.InProcessTransport(app)) as s:
        yield s


def test_load_weights_gives_what_load_state_dict_of_load_file_gives(sess: client.Session, model_dir: Path):
    local = _net()
    want = local.load_state_dict(safetensors.torch.load_file(model_dir / MODEL))
    with torch.device(sess.device):
        remote = _net()
    held = sess.stats()["tensors"]
    got = sess.load_weights(remote, MODEL)
    assert got == want and sess.models()[-1] == MODEL
    assert sess.stats()["tensors"] == held  # the file's tensors are freed once copied
    for (name, w), (_, r) in zip(local.state_dict().items(), remote.state_dict().items()):
        assert_same_bits(r.cpu(), w)
    assert all(p.requires_grad for p in remote.parameters())
    x = torch.randn(5, 4)
    assert torch.allclose(remote(x.to(sess.device)).cpu(), local(x), atol=1e-6)


def test_load_weights_casts_as_load_state_dict_does(sess: client.Session, model_dir: Path):
    local = torch.nn.Linear(3, 2)
    local.load_state_dict({"weight": safetensors.torch.load_file(model_dir / "small.safetensors")["w"],
                           "bias": torch.ones(2)})
    safetensors.torch.save_file({"weight": torch.arange(6, dtype=torch.float64).reshape(2, 3),
                                 "bias": torch.ones(2, dtype=torch.float16)}, model_dir / "mixed.safetensors")
    with torch.device(sess.device):
        remote = torch.nn.Linear(3, 2)
    sess.load_weights(remote, "mixed.safetensors")  # float64 and float16 into float32 parameters
    assert_same_bits(remote.weight.detach().cpu(), local.weight.detach())
    assert_same_bits(remote.bias.detach().cpu(), local.bias.detach())


def _local_error(model: torch.nn.Module, path: Path, strict: bool = True) -> str:
    with pytest.raises(RuntimeError) as info:
        model.load_state_dict(safetensors.torch.load_file(path), strict=strict)
    return str(info.value)


@pytest.mark.parametrize("make", [lambda: torch.nn.Linear(4, 3), lambda: torch.nn.Sequential(torch.nn.Linear(4, 5)),
                                  lambda: torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3),
                                                              torch.nn.ReLU(), torch.nn.Linear(3, 2),
                                                              torch.nn.Linear(2, 2))],
                         ids=["other-keys", "size-mismatch", "missing-keys"])
def test_mismatches_raise_torchs_own_error(sess: client.Session, model_dir: Path, make):
    want = _local_error(make(), model_dir / MODEL)
    with torch.device(sess.device):
        remote = make()
    with pytest.raises(RuntimeError) as info:
        sess.load_weights(remote, MODEL)
    assert str(info.value) == want
    assert "Error(s) in loading state_dict for" in want


def test_strict_false_answers_the_keys_as_torch_does(sess: client.Session, model_dir: Path):
    make = lambda: torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))  # noqa: E731
    local = make()
    want = local.load_state_dict(safetensors.torch.load_file(model_dir / MODEL), strict=False)
    with torch.device(sess.device):
        remote = make()
    assert sess.load_weights(remote, MODEL, strict=False) == want and want.unexpected_keys
    assert_same_bits(remote[0].weight.detach().cpu(), local[0].weight.detach())


def test_load_weights_wants_the_model_on_the_device(sess: client.Session):
    with pytest.raises(RuntimeError, match=r"move the model first \(model.to\(sess.device\)\)"):
        sess.load_weights(_net(), MODEL)


def test_load_weights_refuses_a_traversal(sess: client.Session):
    with torch.device(sess.device):
        remote = _net()
    before = [p.cpu() for p in remote.parameters()]
    with pytest.raises(client.RemoteError) as info:
        sess.load_weights(remote, "../secret.safetensors")
    assert info.value.status == 400 and "'..' parts" in str(info.value)
    assert all(torch.equal(a, p.cpu()) for a, p in zip(before, remote.parameters()))
