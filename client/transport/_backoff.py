"""``BusyWait``: how the SDK waits before resending a request the server answered ``429`` (busy).

A 429 (too many programs or sessions at once: ``max_concurrent_programs``,
``max_programs_per_session``, ``max_programs_per_token``, ``max_sessions``, ...) is refused
before anything runs, so resending the same request is always safe (a program keeps its id,
and a retried id is answered from its first run). The waits grow exponentially with full
jitter, so clients refused together do not all come back together, and they stop once
``budget`` seconds would be passed: the last 429 is then the caller's error, naming the
limit the server gave and how long the SDK waited.
"""

from __future__ import annotations

import random
import time


class BusyWait:
    """``wait()`` sleeps before the next try and says whether to make it (False once ``budget`` is spent)."""

    FIRST = 0.05
    MOST = 2.0

    def __init__(self, budget: float) -> None:
        self.budget = budget
        self.waited = 0.0
        self.tries = 0
        self._ceiling = self.FIRST

    def wait(self) -> bool:
        if self.waited >= self.budget:
            return False
        pause = min(random.uniform(0, self._ceiling), self.budget - self.waited)
        time.sleep(pause)
        self.waited += pause
        self.tries += 1
        self._ceiling = min(self._ceiling * 2, self.MOST)
        return True

    def say(self, message: str) -> str:
        """The server's last refusal, with what the SDK did about it."""
        if not self.tries:
            return message
        return (f"{message} (the SDK resent it {self.tries} times over {self.waited:.1f} s, then gave up: "
                f"connect(busy_wait=...) sets how long it waits)")
