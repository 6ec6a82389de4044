"""``TenantFigures``: /metrics for a process per tenant, whose figures live in the tenants' worker processes.

Before each scrape (``Metrics.refresh``) the front asks every live worker for its
sessions, tensors, bytes held, device memory, step times and templates' variants (one small call each); the
gauges are then its sums (the operator's view) or one tenant's own (a tenant's view).
Step times are counters: the front adds what each worker observed since it last asked
into its own histogram, so they only grow; what a worker observed after the last scrape
before it crashed is lost with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .metrics import Metrics, StoreFigures

if TYPE_CHECKING:
    from ..backends.tenant_processes import TenantProcesses

_FIELDS = ("sessions", "tensors", "bytes", "device_memory")


class TenantFigures(StoreFigures):
    """The gauges' figures, gathered from the workers of ``backend`` at each refresh."""

    def __init__(self, backend: "TenantProcesses") -> None:
        super().__init__(None)
        self._backend = backend
        self._by_owner: dict[str | None, dict] = {}
        self._seen: dict[str, dict] = {}  # worker key -> its step rows as last absorbed

    async def refresh(self, metrics: Metrics) -> None:
        by_owner, seen = {}, {}
        for owner, key, figures in await self._backend.figures():
            by_owner[owner] = figures
            steps = figures.get("steps", {})
            metrics.op_seconds.absorb(_since(steps, self._seen.get(key, {})))
            seen[key] = steps
        self._by_owner, self._seen = by_owner, seen

    def totals(self) -> dict:
        totals = {name: sum(f.get(name, 0) for f in self._by_owner.values()) for name in _FIELDS}
        return {**totals, "limit": self._backend.settings.max_total_bytes, "compile": self._compile()}

    def _compile(self) -> dict:
        """The workers' ``Compiler.figures``, summed (each worker compiles its tenant's templates)."""
        variants: dict[str, int] = {}
        seconds = 0.0
        for figures in self._by_owner.values():
            found = figures.get("compile", {})
            for state, n in found.get("variants", {}).items():
                variants[state] = variants.get(state, 0) + n
            seconds += found.get("seconds", 0.0)
        return {"variants": variants, "seconds": seconds}

    def of(self, owner: str | None) -> dict:
        mine = self._by_owner.get(owner, {})
        return {**{name: mine.get(name, 0) for name in _FIELDS}, "limit": self._backend.settings.max_bytes_per_token}


def _since(rows: dict[str, list], before: dict[str, list]) -> dict[str, list]:
    """What ``rows`` (a histogram's counts, sums and creation times) added to ``before``."""
    added = {}
    for op, row in rows.items():
        old = before.get(op)
        added[op] = row if old is None else [new - was for new, was in zip(row[:-1], old[:-1])] + [row[-1]]
    return added
