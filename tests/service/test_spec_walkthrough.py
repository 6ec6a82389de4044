"""SPEC.md's walkthrough runs as written: each ``<!-- example -->`` curl block is sent to a real
server and its answer matches the ``<!-- response -->`` block after it.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import torch

from remote_autograd.proto import decode_tensor

from .wire import checked_client

SPEC = Path(__file__).resolve().parents[2] / "proto" / "SPEC.md"


NO_BODY = object()


def _spec_examples() -> list[dict]:
    """The ``<!-- example: NAME -->`` curl blocks of SPEC.md with their ``<!-- response: NAME STATUS -->``."""
    text = SPEC.read_text()
    block = r"\s*```(\w+)\n(.*?)```"
    requests = {m.group(1): m.group(3) for m in re.finditer(r"<!-- example: ([\w-]+) -->" + block, text, re.S)}
    responses = {m.group(1): (int(m.group(2)), m.group(4))
                 for m in re.finditer(r"<!-- response: ([\w-]+) (\d+) -->" + block, text, re.S)}
    order = re.findall(r"<!-- example: ([\w-]+) -->", text)
    assert order and set(order) == set(responses), (order, sorted(responses))
    # an empty response block documents an answer without a body
    return [{"name": n, "curl": requests[n], "status": responses[n][0],
             "response": json.loads(responses[n][1]) if responses[n][1].strip() else NO_BODY} for n in order]


def _parse_curl(cmd: str, env: dict) -> tuple[str, str, dict, bytes | None]:
    words = shlex.split(cmd.replace("\\\n", " "))
    assert words[0] == "curl", words
    method, url, headers, body = "GET", None, {}, None
    i = 1
    while i < len(words):
        w = words[i]
        if w == "-s":
            pass
        elif w == "-X":
            i += 1
            method = words[i]
        elif w == "-H":
            i += 1
            k, _, v = words[i].partition(":")
            headers[k.strip()] = v.strip()
        elif w == "-d":
            i += 1
            body = words[i].encode()
            if method == "GET":
                method = "POST"
        else:
            assert url is None, f"unexpected curl argument {w!r}"
            url = w
        i += 1
    for k, v in env.items():
        url = url.replace("$" + k, v)
    assert "$" not in url, url
    return method, url, headers, body


def _matches(documented: Any, actual: Any, where: str = "") -> None:
    if isinstance(documented, str) and documented.startswith("<") and documented.endswith(">"):
        return  # stands for any value
    if isinstance(documented, dict):
        assert isinstance(actual, dict) and set(actual) == set(documented), (where, documented, actual)
        for k in documented:
            _matches(documented[k], actual[k], f"{where}.{k}")
    elif isinstance(documented, list):
        assert isinstance(actual, list) and len(actual) == len(documented), (where, documented, actual)
        for i, (d, a) in enumerate(zip(documented, actual)):
            _matches(d, a, f"{where}[{i}]")
    else:
        assert type(documented) is type(actual) or {type(documented), type(actual)} <= {int, float}, (where, documented, actual)
        assert documented == actual, (where, documented, actual)


def test_spec_walkthrough(server_url: str):
    examples = _spec_examples()
    names = [e["name"] for e in examples]
    assert names[0] == "create-session" and {"upload", "forward-backward", "read-grad"} <= set(names)
    env = {"URL": server_url}
    with checked_client(server_url) as c:
        for ex in examples:
            method, url, headers, body = _parse_curl(ex["curl"], env)
            assert headers.get("Remote-Autograd-Protocol") == "1", ex["name"]
            if body is not None:
                json.loads(body)  # the documented body is valid JSON as written
            r = c.request(method, url, headers=headers, content=body)
            assert r.status_code == ex["status"], (ex["name"], r.status_code, r.text)
            if ex["response"] is NO_BODY:
                assert r.content == b"" and "content-type" not in r.headers, (ex["name"], r.headers)
                continue
            actual = r.json()
            _matches(ex["response"], actual, ex["name"])
            if ex["name"] == "create-session":
                env["SID"] = actual["session_id"]
    # and the gradient it read is the true one
    x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    (x * torch.tensor([4.0, 5.0, 6.0])).sum().backward()
    read_grad = next(e for e in examples if e["name"] == "read-grad")["response"]
    assert torch.equal(decode_tensor(read_grad["grad"]), x.grad)
