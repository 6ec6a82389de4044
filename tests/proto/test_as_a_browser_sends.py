"""Requests as a JavaScript client makes them (Node's ``fetch``, a browser), bytes on a raw socket:
SPEC §1's advice for model names survives a WHATWG URL parser, and its advice for connections the
server closed when idle (resend the same program) gets the first answer without running it twice.

A WHATWG parser removes ``.`` and ``..`` path segments, percent-encoded ones included, before
anything is sent; Python's ``urllib`` does not, so ``whatwg_path`` reproduces the rule (URL
Standard, "path state": single-dot and double-dot segments) and, where ``node`` is installed,
is checked against Node's own ``URL``.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from typing import Iterator
from urllib.parse import quote

import pytest
import safetensors.torch
import torch

from ..servers import Server, read_answer, running

_SINGLE_DOT = {".", "%2e"}
_DOUBLE_DOT = {"..", ".%2e", "%2e.", "%2e%2e"}


def whatwg_path(path: str) -> str:
    """The path a WHATWG URL parser sends for ``path`` (of an http URL, ASCII): dot segments resolved,
    their percent-encoded spellings (any case) too; ``%2F`` is no separator and stays."""
    out: list[str] = []
    parts = path.split("/")[1:]
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if part.lower() in _DOUBLE_DOT:
            if out:
                out.pop()
            if last:
                out.append("")
        elif part.lower() in _SINGLE_DOT:
            if last:
                out.append("")
        else:
            out.append(part)
    return "/" + "/".join(out)


NAMES = ["tiny/model.safetensors", "small.safetensors", "tiny/../small.safetensors", "./small.safetensors",
         "tiny/./model.safetensors", "a/b/../../small.safetensors"]
PLAIN = {name: "/v1/models/" + name for name in NAMES}  # the name with its / as they are
OLD_ADVICE = {name: "/v1/models/" + "/".join("%2E" * len(p) if p in (".", "..") else p for p in name.split("/"))
              for name in NAMES}  # SPEC's former advice: the dots percent-encoded
ADVISED = {name: "/v1/models/" + quote(name, safe="") for name in NAMES}  # encodeURIComponent(name)


def test_the_reproduced_rule_is_nodes():
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    paths = sorted({*PLAIN.values(), *OLD_ADVICE.values(), *ADVISED.values(), "/v1/models/x/.%2E/y", "/a/%2e"})
    script = "const paths = JSON.parse(require('fs').readFileSync(0, 'utf8'));" \
             "console.log(JSON.stringify(paths.map((p) => new URL('http://h:1' + p).pathname)));"
    out = subprocess.run([node, "-e", script], input=json.dumps(paths), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [whatwg_path(p) for p in paths]


def test_only_the_advised_spelling_reaches_the_server_as_written():
    for name in NAMES:
        assert whatwg_path(ADVISED[name]) == ADVISED[name], name
    dotted = [n for n in NAMES if "." in n.split("/")[:-1] or ".." in n.split("/")]
    assert dotted and all(whatwg_path(OLD_ADVICE[n]) != OLD_ADVICE[n] for n in dotted)  # the old advice did not
    assert whatwg_path(PLAIN["tiny/../small.safetensors"]) == "/v1/models/small.safetensors"  # another file


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    models = tmp_path_factory.mktemp("models")
    (models / "tiny").mkdir()
    for name in ("tiny/model.safetensors", "small.safetensors"):
        safetensors.torch.save_file({"w": torch.ones(2, 3)}, models / name)
    with running(REMOTE_AUTOGRAD_MODEL_DIR=str(models), REMOTE_AUTOGRAD_IDLE_TIMEOUT_SECONDS="1") as server:
        yield server


def _send(server: Server, raw: bytes, sock: socket.socket | None = None) -> tuple[int, dict, socket.socket]:
    sock = sock or socket.create_connection(("127.0.0.1", server.port), timeout=10)
    sock.sendall(raw)
    answer = read_answer(sock)
    status = int(answer.split(" ", 2)[1])
    return status, json.loads(answer.split("\r\n\r\n", 1)[1] or "null"), sock


def _get(server: Server, path: str) -> tuple[int, dict]:
    status, body, sock = _send(server, f"GET {path} HTTP/1.1\r\nHost: h\r\nRemote-Autograd-Protocol: 1\r\n"
                                       f"Accept: application/json\r\n\r\n".encode())
    sock.close()
    return status, body


@pytest.mark.parametrize("name", NAMES)
def test_a_name_sent_as_advised_is_served_or_refused_by_its_rule(server: Server, name: str):
    status, body = _get(server, whatwg_path(ADVISED[name]))  # what Node's fetch sends
    if ".." in name.split("/") or "." in name.split("/"):
        assert status == 400 and "'..' parts" in body["error"]["message"], body  # the load step's rule, by name
    else:
        assert status == 200 and body["name"] == name and body["tensors"][0]["key"] == "w"


def _program(sid: str, pid: str) -> bytes:
    body = json.dumps({"id": pid, "steps": [
        {"kind": "put", "id": f"t{pid}", "value": {"dtype": "float32", "shape": [1], "data": [2.0]}}]}).encode()
    return (f"POST /v1/sessions/{sid}/programs HTTP/1.1\r\nHost: h\r\nRemote-Autograd-Protocol: 1\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body


def test_an_idle_connection_closed_by_the_server_and_the_program_resent(server: Server):
    """A pooled connection the server closed for idleness fails the next request before any answer;
    the same bytes, the same id, on a new connection are answered from the first run."""
    status, created, sock = _send(server, b"POST /v1/sessions HTTP/1.1\r\nHost: h\r\nRemote-Autograd-Protocol: 1\r\n"
                                          b"Content-Length: 0\r\n\r\n")
    sid = created["session_id"]
    first_status, first, _ = _send(server, _program(sid, "p1"), sock)
    assert first_status == 200
    time.sleep(1.5)  # past idle_timeout_seconds: the server closes the connection
    try:
        sock.sendall(_program(sid, "p1"))
        assert sock.recv(65536) == b""  # closed, no status line
    except (ConnectionResetError, BrokenPipeError):  # Node's ECONNRESET / EPIPE
        pass
    sock.close()
    again_status, again, fresh = _send(server, _program(sid, "p1"))
    fresh.close()
    assert (again_status, again) == (first_status, first)  # the first answer; the put did not run twice
    status, info = _get(server, f"/v1/sessions/{sid}")
    assert status == 200 and info["tensors"] == 1
