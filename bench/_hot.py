"""The parts of a remote op or step timed apart, with warm caches: what the round trip costs beyond them.

Over loopback on a small machine the client, the event loop and the worker take turns on
the same cores, so each part runs with caches the others just used. Timing each part alone
(the client with its answer from memory, the server's programs replayed in this process)
shows how much of a round trip is that, rather than work a leaner path could remove.
"""

from __future__ import annotations

import contextlib
import itertools
import statistics
import time
from typing import Callable, Iterator

import httpx

from remote_autograd.client.transport._lean import LeanTransport
from remote_autograd.proto import decode_body, encode_body
from remote_autograd.proto.codec import is_frames, unpack_frames
from remote_autograd.proto.messages import validate_program
from remote_autograd.service.engine.runner import run_program
from remote_autograd.service.sessions.store import SessionStore
from remote_autograd.service.settings import Settings

from ._util import measure


class Tap(httpx.BaseTransport):
    """A session's transport (``connect(url, transport=Tap())``) with the benchmark's hooks: it keeps
    the bytes of each program sent while ``recorded`` is a list, adds the seconds each request waits
    for its answer's head to ``spent``, keeps the answers whole while ``keeping``, and while
    ``replaying`` answers every request with the last one kept, sending nothing. Otherwise it
    hands the inner transport's answer on untouched (what a timed request pays is one call)."""

    def __init__(self, inner: httpx.BaseTransport | None = None) -> None:
        self._inner = inner if inner is not None else LeanTransport()
        self.recorded: list[tuple[bytes, str | None]] | None = None
        self.keeping = self.replaying = False
        self.spent = 0.0
        self.forwarded = 0  # requests that reached the server
        self._kept: tuple[int, httpx.Headers, bytes] | None = None

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self.recorded is not None and request.url.path.endswith("/programs"):
            self.recorded.append((request.read(), request.headers.get("content-type")))
        if self.replaying and self._kept is not None:
            return self._answer(request)
        start = time.perf_counter()
        response = self._inner.handle_request(request)
        self.spent += time.perf_counter() - start
        self.forwarded += 1
        if not self.keeping:
            return response
        try:
            self._kept = (response.status_code, response.headers, b"".join(response.iter_raw()))
        finally:
            response.close()
        return self._answer(request)

    def _answer(self, request: httpx.Request) -> httpx.Response:
        status, headers, body = self._kept
        return httpx.Response(status, headers=headers, stream=httpx.ByteStream(body), request=request)

    def close(self) -> None:
        self._inner.close()


@contextlib.contextmanager
def recording(tap: Tap) -> Iterator[Callable[[], list[dict]]]:
    """While inside, ``tap`` keeps what it sends; yields a function giving every program so far, in order
    (decoded when asked, so recording adds no decoding to a timed request). A recording inside another
    adds to the outer one's list too and gives only its own part."""
    outer = tap.recorded
    tap.recorded = recorded = [] if outer is None else outer
    span = [len(recorded), None]  # [first, end): the end is set on leaving
    try:
        yield lambda: [unpack_frames(body) if is_frames(ctype) else decode_body(body, ctype)
                       for body, ctype in recorded[span[0]:span[1]]]
    finally:
        span[1] = len(recorded)
        tap.recorded = outer


def client_alone(tap: Tap, session, fn: Callable[[], object], repeat: int) -> list[float]:
    """Seconds per ``fn()`` when every request is answered at once from memory, less what its requests
    cost the client as requests (each priced as an empty program, replayed the same way): the client's
    work for ``fn`` beyond the request it rides in, as a round trip "over the empty program" counts it."""
    empty = empty_program(session)
    per_request = statistics.median(_replayed(tap, empty, repeat))
    before = tap.forwarded
    times = _replayed(tap, fn, repeat)
    requests = tap.forwarded - before  # fn's own, sent once for real: the answer to repeat
    return [t - requests * per_request for t in times]


def _replayed(tap: Tap, fn: Callable[[], object], repeat: int) -> list[float]:
    tap.keeping = True
    try:
        fn()  # one real round trip gives the answer to repeat
    finally:
        tap.keeping = False
    tap.replaying = True
    try:
        return measure(fn, repeat=repeat, warmup=max(1, repeat // 10))
    finally:
        tap.replaying = False


def server_alone(programs: list[dict], last: int, settings: Settings | None = None) -> list[float]:
    """Seconds to validate and run each of the ``last`` programs, replaying all of them in order on a
    store in this process (the same work the program route gives its worker thread)."""
    settings = settings or Settings()
    store = SessionStore(settings)
    session = store.create()
    times = []
    for body in programs:
        key = encode_body(body, True)
        start = time.perf_counter()
        outcome = run_program(session, validate_program(body), key, False, settings)
        times.append(time.perf_counter() - start)
        if outcome.status != 200:
            raise RuntimeError(f"replaying program {body['id']}: {outcome.body.get('error')}")
    return times[-last:]


def empty_program(session) -> Callable[[], object]:
    """A call that sends ``session`` a program of no steps, through the SDK's transport."""
    ids, path = itertools.count(), session._path + "/programs"
    return lambda: session._transport.request("POST", path, {"id": f"empty-{next(ids)}", "steps": []}, big=False)


def median_us(times: list[float]) -> float:
    return statistics.median(times) * 1e6
