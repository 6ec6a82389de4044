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
from typing import Any, Callable, Iterator

from remote_autograd.proto import encode_body
from remote_autograd.proto.messages import validate_program
from remote_autograd.service.settings import Settings
from remote_autograd.service.store import SessionStore

from ._util import measure


@contextlib.contextmanager
def intercepted(session, wrap: Callable[[Callable], Callable]) -> Iterator[None]:
    """While inside, ``session`` sends through ``wrap(its transport's request)``; the real one after."""
    transport = session._transport
    original = transport.request
    transport.request = wrap(original)
    try:
        yield
    finally:
        transport.request = original


@contextlib.contextmanager
def recording(session) -> Iterator[list[dict]]:
    """Every program ``session`` sends while inside, in order (its answers go on as usual)."""
    programs: list[dict] = []

    def wrap(original: Callable) -> Callable:
        def request(method: str, path: str, body: Any = None, **kwargs: Any):
            if path.endswith("/programs"):
                programs.append(body)
            return original(method, path, body, **kwargs)
        return request

    with intercepted(session, wrap):
        yield programs


def client_alone(session, fn: Callable[[], object], repeat: int) -> list[float]:
    """Seconds per ``fn()`` when every program is answered at once with the session's last answer."""
    answers: list = []

    def remember(original: Callable) -> Callable:
        def request(method: str, path: str, body: Any = None, **kwargs: Any):
            answers.append(original(method, path, body, **kwargs))
            return answers[-1]
        return request

    with intercepted(session, remember):
        fn()  # one real round trip gives the answer to repeat
    status, answer = answers[-1]

    def from_memory(original: Callable) -> Callable:
        return lambda method, path, body=None, **kwargs: (status, {**answer, "id": body["id"]})

    with intercepted(session, from_memory):
        return measure(fn, repeat=repeat, warmup=max(1, repeat // 10))


def server_alone(programs: list[dict], last: int) -> list[float]:
    """Seconds to validate and run each of the ``last`` programs, replaying all of them in order on a
    store in this process (the same work the program route gives its worker thread)."""
    store = SessionStore(Settings())
    session = store.create()
    times = []
    for body in programs:
        key = encode_body(body, True)
        start = time.perf_counter()
        outcome = store.run_once(session, validate_program(body), key, False)
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
