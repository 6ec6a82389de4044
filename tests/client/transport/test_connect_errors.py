"""Every error a user can cause on connect says what to do next: no server at the URL, a URL
without its scheme, something else listening there, a missing or a wrong token; and a session
the server lost says what was lost and how to go on (client/transport/_transport.py, client/transport/_errors.py,
service/http/auth.py). A protocol mismatch has its own tests (test_feedback.py)."""

from __future__ import annotations

import httpx
import pytest
import torch
from starlette.applications import Starlette
from starlette.responses import HTMLResponse
from starlette.routing import Route

from remote_autograd import client
from remote_autograd.client.transport._embedded import service_app

from ...conftest import PROTOCOL_HEADERS
from ...servers import _free_port


def test_no_server_at_the_url_says_start_one_or_check_the_url():
    url = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    with pytest.raises(client.RemoteError) as info:
        client.connect(url)
    message = str(info.value)
    assert info.value.code == "connection_error" and url in message
    for advice in ("`make serve`", "`remote-autograd-serve`", "check the URL", "client.connect() without a URL"):
        assert advice in message, message


@pytest.mark.parametrize("given,suggested", [("127.0.0.1:8000", "http://127.0.0.1:8000"),
                                             ("gpu-host:8000", "http://gpu-host:8000"),
                                             ("localhost", "http://localhost"),
                                             ("ftp://gpu-host:8000", "http://gpu-host:8000")])
def test_a_url_without_its_scheme_says_how_to_write_it(given: str, suggested: str):
    with pytest.raises(ValueError) as info:
        client.connect(given)
    message = str(info.value)
    assert repr(given) in message and repr(suggested) in message and "http:// or https://" in message
    assert "REMOTE_AUTOGRAD_URL" in message  # where else the URL may have come from


def test_https_to_a_plain_http_server_says_it_speaks_http(server_url: str):
    tls_url = server_url.replace("http://", "https://")
    with pytest.raises(client.RemoteError) as info:
        client.connect(tls_url)
    message = str(info.value)
    assert info.value.code == "connection_error" and "it speaks plain http" in message, message
    assert f"Connect to {server_url!r}" in message and "TLS proxy" in message
    assert "Start one there" not in message  # the server runs: starting one is not the answer


@pytest.mark.parametrize("path", ["/v1", "/v1/", "/v1/sessions"])
def test_a_url_with_the_api_path_asks_for_the_base_url(path: str):
    with pytest.raises(ValueError) as info:
        client.connect("http://gpu-host:8000" + path)
    message = str(info.value)
    assert "base URL, 'http://gpu-host:8000'" in message and "REMOTE_AUTOGRAD_URL" in message, message


def test_a_path_the_server_does_not_serve_asks_for_the_base_url():
    with pytest.raises(client.RemoteError) as info:  # the real service, asked under a path it has no routes at
        client.connect("http://127.0.0.1:8080/api", transport=client.InProcessTransport(service_app()))
    message = str(info.value)
    assert info.value.status == 404 and "POST /api/v1/sessions" in message, message
    assert "the server's base URL" in message and "'http://gpu-host:8000'" in message


def test_something_else_at_the_url_is_named_as_such():
    async def not_found(request):
        return HTMLResponse("<h1>Not Found</h1>", status_code=404)

    other = client.InProcessTransport(Starlette(routes=[Route("/{rest:path}", not_found, methods=["GET", "POST"])]))
    with pytest.raises(client.RemoteError) as info:
        client.connect("http://127.0.0.1:8080", transport=other)
    message = str(info.value)
    assert "http://127.0.0.1:8080 answered HTTP 404 in text/html" in message and "check the URL" in message


@pytest.fixture
def with_tokens():
    """The service with one token (a new app each time: an app's lifespan runs once)."""
    return service_app(tokens=("sesame",))


@pytest.mark.parametrize("token,says", [(None, "missing bearer token"), ("wrong", "wrong bearer token")])
def test_missing_and_wrong_tokens_say_which_and_where_a_token_goes(with_tokens, monkeypatch: pytest.MonkeyPatch,
                                                                   token: str | None, says: str):
    monkeypatch.delenv("REMOTE_AUTOGRAD_TOKEN", raising=False)
    with pytest.raises(client.RemoteError) as info:
        client.connect(token=token, transport=client.InProcessTransport(with_tokens))
    message = str(info.value)
    assert info.value.code == "unauthorized" and info.value.status == 401
    assert message.startswith(says) and "token=" in message and "REMOTE_AUTOGRAD_TOKEN" in message, message
    assert "sesame" not in message


def test_the_right_token_connects(with_tokens):
    with client.connect(token="sesame", transport=client.InProcessTransport(with_tokens)) as sess:
        assert sess.tensor([1.0, 2.0]).sum().item() == 3.0


def test_a_lost_session_says_what_went_and_what_to_do(server_url: str):
    sess = client.connect(server_url)
    w = sess.tensor(torch.ones(2), requires_grad=True)
    sess.sync()
    with httpx.Client(base_url=server_url, headers=PROTOCOL_HEADERS) as c:  # as a restart would: the session goes
        assert c.delete(f"/v1/sessions/{sess.id}").status_code == 204
    with pytest.raises(client.SessionLost) as info:
        (w * 2).sum().item()
    message = str(info.value)
    assert info.value.session_id == sess.id and info.value.status == 404
    assert f"unknown session {sess.id!r}" in info.value.server_message  # the server's own words, kept
    for words in (f"session {sess.id} is gone on the server", "the server restarted",
                  "its tensors, their grads and its random generator state", "Open a new session",
                  "load your last checkpoint"):
        assert words in message, message
    sess.close()  # nothing more to say: closing a lost session is quiet
