"""What the SDK tells its user about the connection (client/transport/_protocol_advice.py,
client/session/_banner.py, client/transport/_progress.py): one clear error on a protocol mismatch, a one-line summary on connect in notebooks only, and
progress bars for big transfers only where someone watches.
"""

from __future__ import annotations

import pytest
import torch
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from remote_autograd import client
from remote_autograd.client.session import _banner
from remote_autograd.client.transport import _progress


def server_speaking(protocol: str) -> client.InProcessTransport:
    """A stand-in for a server of another protocol version, in process: /healthz says which it
    speaks, /v1 refuses ours."""

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "device": "cpu", "protocol": protocol})

    async def refuse(request: Request) -> JSONResponse:
        sent = request.headers.get("Remote-Autograd-Protocol")
        message = f"protocol version mismatch: client sent Remote-Autograd-Protocol: {sent}, server speaks {protocol}"
        return JSONResponse({"error": {"code": "protocol_mismatch", "message": message, "step": None, "op": None},
                             "results": []}, status_code=400)

    return client.InProcessTransport(Starlette(routes=[Route("/healthz", health),
                                                       Route("/v1/{rest:path}", refuse, methods=["GET", "POST"])]))


@pytest.mark.parametrize("theirs, advice", [
    ("2", ["upgrade this client", "pip install -U remote-autograd"]),  # a newer server
    ("0", ["upgrade the server"]),  # an older server
])
def test_a_protocol_mismatch_says_which_side_to_upgrade(theirs, advice):
    with pytest.raises(client.RemoteError) as info:
        client.connect(transport=server_speaking(theirs))
    message = str(info.value)
    assert info.value.code == "protocol_mismatch"
    assert "speaks protocol 1" in message and f"speaks protocol {theirs}" in message
    assert all(words in message for words in advice), message


def test_other_errors_on_connect_are_unchanged():
    """Only a protocol mismatch is rewritten: a wrong token still reads as the server said."""
    from ...conftest import start_server

    with start_server(REMOTE_AUTOGRAD_TOKENS="sesame") as url:
        with pytest.raises(client.RemoteError) as info:
            client.connect(url, token="wrong")
    assert info.value.code == "unauthorized" and "protocol" not in str(info.value)


def test_summary_names_server_device_and_gpu():
    info = {"session_id": "s1", "protocol": "1", "device": "cuda:0", "server_version": "0.1.0",
            "gpu_name": "NVIDIA H200", "gpu_memory_bytes": 150 * 2**30}
    line = _banner.summary(info, "http://gpu-host:8000")
    assert line == ("remote-autograd: session s1 on http://gpu-host:8000: server 0.1.0 (protocol 1), "
                    "cuda:0, NVIDIA H200 (150 GiB)")
    assert "\n" not in line
    cpu = _banner.summary({**info, "device": "cpu", "gpu_name": None, "gpu_memory_bytes": None}, "u")
    assert cpu.endswith("(protocol 1), cpu")


def test_summary_is_printed_in_notebooks_only(server_url: str, capsys: pytest.CaptureFixture,
                                               monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("REMOTE_AUTOGRAD_PROGRESS", raising=False)
    with client.connect(server_url):
        pass
    assert capsys.readouterr().out == ""  # a script or a test: quiet
    monkeypatch.setattr(_progress, "in_notebook", lambda: True)
    with client.connect(server_url) as sess:
        pass
    assert capsys.readouterr().out.strip() == f"remote-autograd: session {sess.id} on {server_url}: server " \
        f"{sess.server_version} (protocol 1), {sess.remote_device}"
    monkeypatch.setenv("REMOTE_AUTOGRAD_PROGRESS", "0")
    with client.connect(server_url):
        pass
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("setting, shown", [("1", True), ("0", False), ("", False)])
def test_progress_bars_for_big_transfers(server_url: str, capsys: pytest.CaptureFixture,
                                         monkeypatch: pytest.MonkeyPatch, setting: str, shown: bool):
    """Forced on, off, and automatic (stderr is not a terminal here: off). The threshold is
    lowered so that a 20 kB tensor counts as big; the values arrive intact either way."""
    monkeypatch.setattr(_progress, "THRESHOLD", 10_000)
    monkeypatch.setenv("REMOTE_AUTOGRAD_PROGRESS", setting)
    local = torch.randn(5_000)
    with client.connect(server_url) as sess:
        remote = sess.tensor(local)
        sess.sync()
        back = remote.to_torch()
    assert torch.equal(back, local)
    err = capsys.readouterr().err
    assert ("upload POST" in err and "download" in err) == shown, err
    if not shown:
        assert err == ""
