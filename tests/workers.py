"""How ``make test``'s workers (pytest-xdist, ``-n``) share the suite out: ``Grouped``.

Most tests go one at a time to whichever worker is free. Two kinds go to one worker together:

- every Ray test (a test on the ``ray`` backend, and ``e2e/test_ray_cluster.py``): a local Ray
  cluster is several processes and its node gives its raylet a fixed 30 s to start, which a
  machine running several clusters beside the suite exceeds; on one worker the shared front's
  cluster starts once and the module's own clusters one at a time;
- a module whose fixtures outlive a test (``scope="module"`` or ``"class"``: a server of its own
  settings), so that they start once.

The groups are told from test ids alone: the scheduler runs in pytest's first process, which
collects nothing. Largest groups first (xdist's own order), then the single tests in their order.
"""

from __future__ import annotations

import functools
from pathlib import Path

from xdist.scheduler import LoadScopeScheduling

_RAY_MODULES = ("tests/e2e/test_ray_cluster.py",)
_LONGER_THAN_A_TEST = ('scope="module"', 'scope="class"')


def group_of(nodeid: str, root: Path) -> str:
    """The unit of work ``nodeid`` belongs to: ``ray``, its module's path, or itself alone."""
    path, _, rest = nodeid.partition("::")
    params = rest.partition("[")[2].removesuffix("]")
    if path in _RAY_MODULES or "ray" in params.split("-"):  # the backend's id, as conftest parametrizes it
        return "ray"
    if _keeps_fixtures(root / path):
        return path
    return nodeid


@functools.cache
def _keeps_fixtures(path: Path) -> bool:
    text = path.read_text() if path.is_file() else ""
    return any(scope in text for scope in _LONGER_THAN_A_TEST)


class Grouped(LoadScopeScheduling):
    """xdist's scheduling by scope, the scope being ``group_of``'s."""

    def _split_scope(self, nodeid: str) -> str:
        return group_of(nodeid, self.config.rootpath)
