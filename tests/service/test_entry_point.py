"""What an operator reads first: ``remote-autograd-serve --help``, the one line printed once the
server listens, and the log lines of a restart at the default level (service/__main__.py,
service/logs.py)."""

from __future__ import annotations

import io
import json
import logging

import pytest

from remote_autograd.service import __main__ as entry
from remote_autograd.service import logs
from remote_autograd.service.settings import Settings


def test_help_explains_each_option_tokens_and_the_environment(capsys: pytest.CaptureFixture):
    with pytest.raises(SystemExit) as done:
        entry.main(["--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps to the terminal's width
    for option, words in {"--host": "address to listen on", "--port": "any free one", "--device": "where tensors live",
                          "--log-level": "a line per request"}.items():
        assert option in text and words in text, (option, text)
    for env in ("REMOTE_AUTOGRAD_HOST", "REMOTE_AUTOGRAD_PORT", "REMOTE_AUTOGRAD_DEVICE", "REMOTE_AUTOGRAD_LOG_LEVEL"):
        assert env in text
    assert "REMOTE_AUTOGRAD_TOKENS=tok1,tok2" in text and "Authorization: Bearer <token>" in text
    assert "REMOTE_AUTOGRAD_INSECURE=1" in text and "loopback only" in text
    assert "REMOTE_AUTOGRAD_<NAME>" in text and ".env.example" in text and "REMOTE_AUTOGRAD_STATE_DIR" in text


URL = "http://127.0.0.1:8000"


@pytest.mark.parametrize("settings,says", [
    (Settings(), "no tokens: this machine only; sessions end with the process (no REMOTE_AUTOGRAD_STATE_DIR)"),
    (Settings(tokens=("alpha-secret",)), "1 token (REMOTE_AUTOGRAD_TOKENS)"),
    (Settings(tokens=("alpha-secret", "beta-secret"), state_dir="/var/lib/ra"),
     "2 tokens (REMOTE_AUTOGRAD_TOKENS); sessions saved to /var/lib/ra on SIGTERM"),
    (Settings(host="0.0.0.0", insecure=True), "no tokens: open to anyone who reaches it (REMOTE_AUTOGRAD_INSECURE=1)"),
])
def test_the_startup_line_says_how_many_tokens_and_where_sessions_are_saved(settings: Settings, says: str):
    line = entry.startup_line(settings, URL)
    assert line.startswith(f"remote-autograd is serving on {URL} (API docs: {URL}/docs); ")
    assert says in line and line.endswith("; Ctrl-C stops it") and "\n" not in line
    assert "secret" not in line  # how many tokens, never one of them


@pytest.fixture
def logged(monkeypatch: pytest.MonkeyPatch):
    """``logs.configure(level)`` writing to a buffer; pytest's logging is put back afterwards."""
    root, lifecycle = logging.getLogger(), logging.getLogger(logs.LIFECYCLE)
    saved = root.handlers[:], root.level, lifecycle.level
    buffer = io.StringIO()

    def configure(level: str) -> io.StringIO:
        with monkeypatch.context() as m:  # in the test's own phase: pytest sets sys.stderr anew for each
            m.setattr(logs.sys, "stderr", buffer)
            logs.configure(level)
        return buffer

    yield configure
    root.handlers[:], root.level = saved[0], saved[1]
    lifecycle.setLevel(saved[2])


@pytest.mark.parametrize("level,shown", [("warning", True), ("info", True), ("error", False)])
def test_saves_and_restores_are_info_lines_the_default_level_shows(logged, level: str, shown: bool):
    buffer = logged(level)
    logging.getLogger(logs.LIFECYCLE).info("3 session(s) saved for the next start")
    logging.getLogger("remote_autograd.service.access").info("POST /v1/sessions 200")  # a request's line
    lines = [json.loads(line) for line in buffer.getvalue().splitlines()]
    saves = [line for line in lines if "saved" in line["message"]]
    assert [line["level"] for line in saves] == (["info"] if shown else [])
    assert any("POST" in line["message"] for line in lines) == (level == "info")  # the default stays quiet
