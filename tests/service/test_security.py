"""Closed by default: tokens on every route but health, sessions as tenants, nothing but the op table runs."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tokenize
from pathlib import Path
from typing import Iterator

import msgpack
import pytest

from remote_autograd import client

from ..servers import ROOT
from ..servers import AUTH, api, call, error_of, program, put, ref, running

TOKEN_A, TOKEN_B = "tok-alpha-0123456789", "tok-beta-9876543210"
OPERATOR = "tok-operator-5555555555"  # REMOTE_AUTOGRAD_METRICS_TOKEN: no tenant's


def unauthorized(message: str) -> dict:
    return {"error": {"code": "unauthorized", "message": message, "step": None, "op": None}, "results": []}


MISSING = ("missing bearer token: this server needs one of its tokens (the Python SDK: connect(token=...) or "
           "REMOTE_AUTOGRAD_TOKEN; HTTP: Authorization: Bearer <token>)")
WRONG = ("wrong bearer token: this server has no such token; check the one you send (the Python SDK: "
         "connect(token=...) or REMOTE_AUTOGRAD_TOKEN; HTTP: Authorization: Bearer <token>)")
UNAUTHORIZED = unauthorized(MISSING)


@pytest.fixture(scope="module")
def secured() -> Iterator[str]:
    """A server with two tokens (and an operator's for /metrics) and without the test-only ops."""
    with running(REMOTE_AUTOGRAD_TOKENS=f"{TOKEN_A}, {TOKEN_B}", REMOTE_AUTOGRAD_METRICS_TOKEN=OPERATOR) as server:
        yield server.url


# -- authentication -----------------------------------------------------------------------


def test_health_routes_need_no_token(secured: str):
    with api(secured) as c:
        assert c.get("/healthz").json()["status"] == "ok"
        assert c.get("/readyz").json()["status"] == "ready"


PROTECTED = [("GET", "/redoc"), ("GET", "/openapi.json"), ("GET", "/docs/oauth2-redirect"), ("GET", "/docs/assets/x.js"),
             ("GET", "/metrics"), ("GET", "/v1/ops"), ("POST", "/v1/sessions"), ("GET", "/v1/sessions/abc"),
             ("DELETE", "/v1/sessions/abc"), ("POST", "/v1/sessions/abc/programs"),
             ("GET", "/v1/sessions/abc/tensors/t"), ("GET", "/no/such/route"), ("PUT", "/healthz/x")]
# Each with the message it gets: no token at all, or one the server does not hold.
BAD_CREDENTIALS = [(None, MISSING), ("Bearer", MISSING), (f"Basic {TOKEN_A}", MISSING),
                   (f"{TOKEN_A}", MISSING), ("Bearer wrong", WRONG), ("bearer  x", WRONG),
                   (f"Bearer {TOKEN_A[:-1]}", WRONG), (f"Bearer {TOKEN_A}x", WRONG),
                   (f"Bearer {TOKEN_A},{TOKEN_B}", WRONG)]


@pytest.mark.parametrize("method,path", PROTECTED)
def test_every_other_route_needs_a_valid_token(secured: str, method: str, path: str):
    with api(secured) as c:
        bodies = set()
        for credentials, message in BAD_CREDENTIALS:
            headers = {AUTH: credentials} if credentials is not None else {}
            r = c.request(method, path, headers=headers, json={"id": "p", "steps": []})
            assert r.status_code == 401, (credentials, r.status_code, r.text[:200])
            assert r.json() == unauthorized(message) and r.headers["www-authenticate"] == "Bearer", credentials
            bodies.add(r.content)
        assert len(bodies) == 2  # a near miss reads as any wrong token: nothing says how close it came
        r = c.request(method, path, headers={"Accept": "application/msgpack"})
        assert r.status_code == 401 and msgpack.unpackb(r.content) == UNAUTHORIZED


@pytest.mark.parametrize("path", ["/openapi.json", "/metrics"])
def test_docs_and_metrics_answer_with_a_token(secured: str, path: str):
    with api(secured, TOKEN_B) as c:
        r = c.get(path)
        assert r.status_code == 200 and r.content


def test_metrics_show_a_tenant_only_its_own_figures_and_the_operator_everything(secured: str):
    with api(secured, TOKEN_A) as a, api(secured, TOKEN_B) as b, api(secured, OPERATOR) as operator:
        sid = a.post("/v1/sessions").json()["session_id"]
        r = program(a, sid, [put("x", [0.5] * 1000), call("cosh", ref("x"), out=["y"])])  # an op only A ran
        assert r.status_code == 200, r.text
        mine, theirs, everything = (c.get("/metrics") for c in (a, b, operator))
        assert mine.status_code == theirs.status_code == everything.status_code == 200
        assert "remote_autograd_token_sessions 1.0" in mine.text
        assert "remote_autograd_token_bytes_held 8000.0" in mine.text
        assert "remote_autograd_token_sessions 0.0" in theirs.text
        assert "remote_autograd_token_bytes_held 0.0" in theirs.text
        for other_tenants in ("cosh", "8000", "remote_autograd_bytes_held ", "remote_autograd_sessions ",
                              "remote_autograd_requests", "remote_autograd_op_seconds"):
            assert other_tenants not in theirs.text, other_tenants
        assert 'op="cosh"' in everything.text and "remote_autograd_bytes_held 8000.0" in everything.text
        assert "remote_autograd_sessions 1.0" in everything.text
        # the operator's token opens /metrics and nothing else
        error_of(operator.post("/v1/sessions"), 401, "unauthorized")
        a.delete(f"/v1/sessions/{sid}")


def test_sessions_belong_to_the_token_that_made_them(secured: str):
    with api(secured, TOKEN_A) as a, api(secured, TOKEN_B) as b:
        sid = a.post("/v1/sessions").json()["session_id"]
        assert program(a, sid, [put("secret", [4.0, 2.0], requires_grad=True)]).status_code == 200
        foreign = [b.get(f"/v1/sessions/{sid}"), b.get(f"/v1/sessions/{sid}/tensors/secret"),
                   program(b, sid, [{"kind": "fetch", "id": "secret"}]), b.delete(f"/v1/sessions/{sid}"),
                   program(b, sid, [put("planted", [1.0])])]
        for r in foreign:
            error_of(r, 404, "unknown_session", sid)
            assert "4.0" not in r.text and "secret" not in r.text
        # B's own session cannot reach A's tensor ids either
        own = b.post("/v1/sessions").json()["session_id"]
        error_of(program(b, own, [call("mul", ref("secret"), 2.0, out=["y"])]), 404, "unknown_tensor")
        # A's session is untouched by all of it
        r = a.get(f"/v1/sessions/{sid}/tensors/secret")
        assert r.status_code == 200 and r.json()["value"]["data"] == [4.0, 2.0]
        assert a.get(f"/v1/sessions/{sid}").json()["tensors"] == 1
        assert a.delete(f"/v1/sessions/{sid}").status_code == 204
        assert b.delete(f"/v1/sessions/{own}").status_code == 204


def test_sessions_of_one_token_are_isolated_too(secured: str):
    with api(secured, TOKEN_A) as a:
        one, two = (a.post("/v1/sessions").json()["session_id"] for _ in range(2))
        assert program(a, one, [put("x", [1.0, 2.0])]).status_code == 200
        error_of(a.get(f"/v1/sessions/{two}/tensors/x"), 404, "unknown_tensor")
        for steps in ([{"kind": "fetch", "id": "x"}], [call("add", ref("x"), 1.0, out=["y"])],
                      [{"kind": "set_grad", "id": "x", "grad": None}], [{"kind": "backward", "tensors": ["x"]}]):
            r = program(a, two, steps)
            error_of(r, 404, "unknown_tensor", "x")
            assert r.json()["results"] == []
        # freeing the other session's id is a no-op, not a reach across
        assert program(a, two, [{"kind": "free", "ids": ["x"]}]).status_code == 200
        assert a.get(f"/v1/sessions/{one}/tensors/x").json()["value"]["data"] == [1.0, 2.0]
        for sid in (one, two):
            a.delete(f"/v1/sessions/{sid}")


def test_client_sends_the_token(secured: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("REMOTE_AUTOGRAD_TOKEN", raising=False)
    with pytest.raises(client.RemoteError) as info:
        client.connect(secured)
    assert info.value.status == 401 and info.value.code == "unauthorized"
    with client.connect(secured, token=TOKEN_A) as sess:
        assert (sess.tensor([1.0, 2.0]) * 3).tolist() == [3.0, 6.0]
    monkeypatch.setenv("REMOTE_AUTOGRAD_TOKEN", TOKEN_B)
    with client.connect(secured) as sess:
        assert (sess.tensor([1.0, 2.0]) + 1).tolist() == [2.0, 3.0]


# -- where the server listens -------------------------------------------------------------


def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REMOTE_AUTOGRAD_")}
    return {**env, **extra}


def test_refuses_a_public_address_without_tokens():
    r = subprocess.run([sys.executable, "-m", "remote_autograd.service", "--host", "0.0.0.0", "--port", "9"], cwd=ROOT,
                       env=_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert "refusing to listen on 0.0.0.0" in r.stderr and "REMOTE_AUTOGRAD_TOKENS" in r.stderr
    assert "REMOTE_AUTOGRAD_INSECURE=1" in r.stderr


@pytest.mark.parametrize("host,env", [("0.0.0.0", {"REMOTE_AUTOGRAD_TOKENS": "t"}),
                                      ("0.0.0.0", {"REMOTE_AUTOGRAD_INSECURE": "1"}),
                                      ("::", {"REMOTE_AUTOGRAD_TOKENS": "t"}),
                                      ("127.0.0.1", {}), ("localhost", {}), ("::1", {})])
def test_tokens_or_insecure_or_loopback_may_listen(monkeypatch: pytest.MonkeyPatch, host: str, env: dict):
    from remote_autograd.service import __main__ as entry
    from remote_autograd.service import logs

    for k in [k for k in os.environ if k.startswith("REMOTE_AUTOGRAD_")]:
        monkeypatch.delenv(k)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    served = []

    def serve(server) -> None:  # no socket is opened
        served.append(server.config)
        server.started = True

    monkeypatch.setattr(entry._AnnouncingServer, "run", serve)
    monkeypatch.setattr(logs, "configure", lambda level: None)  # leave pytest's logging alone
    assert entry.main(["--host", host, "--port", "9"]) == 0
    assert served[0].host == host


# -- nothing but the op table runs ---------------------------------------------------------

FORBIDDEN_NAMES = ["save", "load", "__class__", "__import__", "ops.aten.add", "sys", "os.system", "torch.save",
                   "eval", "__getattribute__", "exec", "getattr", "open", "torch.ops.aten.add", "add.__globals__",
                   "save_", "load_", "os.system_", "torch.load", "builtins.eval", "Tensor.data_ptr", "__init__",
                   "Tensor.untyped_storage", "Tensor.share_memory_", "Tensor.set_", "from_file", "Tensor.apply_",
                   "_test_oom_", "/tmp/pwned", "../add"]


def _listing(*dirs: Path) -> set:
    return {p for d in dirs for p in d.iterdir()}


@pytest.mark.parametrize("where", ["test_ops_on", "secured"])
def test_only_op_table_names_run(where: str, request: pytest.FixtureRequest, tmp_path: Path):
    url, token = (request.getfixturevalue("server_url"), None) if where == "test_ops_on" else (
        request.getfixturevalue("secured"), TOKEN_A)
    target = tmp_path / "pwned"
    before = _listing(tmp_path, ROOT, Path("/tmp"))
    with api(url, token) as c:
        sid = c.post("/v1/sessions").json()["session_id"]
        assert program(c, sid, [put("x", [1.0, 2.0])]).status_code == 200
        args = [ref("x"), str(target), "/tmp/pwned", "import os; os.system('touch /tmp/pwned')"]
        for name in FORBIDDEN_NAMES:
            r = program(c, sid, [call(name, *args, out=["y"], f=str(target), path="/tmp/pwned")])
            error_of(r, 404, "unknown_op", repr(name))
        r = program(c, sid, [call("_test_oom", ref("x"), out=["y"])])
        if where == "test_ops_on":
            error_of(r, 507, "out_of_memory")
        else:  # test-only ops exist only where the settings load them
            error_of(r, 404, "unknown_op", "'_test_oom'")
        # objects that are not values of the protocol are refused, not looked up
        for weird in ({"__import__": "os"}, {"eval": "1+1"}, {"ref": "x", "extra": 1}, {"dtype": "os.system"}):
            r = program(c, sid, [call("add", ref("x"), weird, out=["y"])])
            assert r.status_code == 400, (weird, r.text)
        assert c.get(f"/v1/sessions/{sid}").json()["tensors"] == 1
        c.delete(f"/v1/sessions/{sid}")
    assert not target.exists()
    new = _listing(tmp_path, ROOT, Path("/tmp")) - before
    assert not [p for p in new if "pwned" in p.name], new


_BANNED_MODULES = {"pickle", "cPickle", "_pickle", "cloudpickle", "dill", "marshal", "shelve", "joblib"}
_BANNED_CALLS = {"eval", "exec", "__import__", "compile"}


def _violations(path: Path) -> list[str]:
    """Banned names in code (comments and strings are skipped: docstrings may say "no pickle")."""
    toks = [t for t in tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
            if t.type in (tokenize.NAME, tokenize.OP)]
    found = []
    for i, t in enumerate(toks):
        prev = toks[i - 1].string if i else ""
        nxt = toks[i + 1].string if i + 1 < len(toks) else ""
        after = toks[i + 2].string if i + 2 < len(toks) else ""
        if t.type != tokenize.NAME:
            continue
        if t.string in _BANNED_MODULES:
            found.append(f"{path}:{t.start[0]}: {t.string}")
        elif t.string in _BANNED_CALLS and nxt == "(" and prev != ".":
            found.append(f"{path}:{t.start[0]}: {t.string}(")
        elif t.string == "torch" and nxt == "." and after in ("load", "jit"):
            found.append(f"{path}:{t.start[0]}: torch.{after}")
    return found


def test_server_source_never_unpickles_or_evaluates(tmp_path: Path):
    files = sorted((ROOT / "service").rglob("*.py")) + sorted((ROOT / "proto").rglob("*.py"))
    assert len(files) > 10
    assert [v for f in files for v in _violations(f)] == []
    # the scanner itself finds what it looks for, and not what it should not
    probe = tmp_path / "probe.py"
    probe.write_text("import pickle\nx = eval('1')\ny = torch.load('f')\nz = m.eval()\n'''pickle'''  # exec(\n")
    assert len(_violations(probe)) == 3
