"""Which installed distributions a set of requirements reaches (the packaging and example tests).

``reached`` follows each distribution's own requirements through ``importlib.metadata``,
with the extras a requirement names (``uvicorn[standard]``), as pip would resolve them
against what the project's venv holds.
"""

from __future__ import annotations

import tomllib
from importlib import metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from .servers import ROOT


def pyproject_requirements(*extras: str) -> list[Requirement]:
    """The project's base requirements plus those of ``extras``, as pyproject.toml states them
    (its references to itself, ``remote-autograd[x]``, followed)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs, todo, seen = [Requirement(r) for r in project["dependencies"]], list(extras), set()
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for text in project["optional-dependencies"][extra]:
            req = Requirement(text)
            if canonicalize_name(req.name) == canonicalize_name(project["name"]):
                todo += sorted(req.extras)
            else:
                reqs.append(req)
    return reqs


def reached(requirements: list[Requirement]) -> list[metadata.Distribution]:
    """The installed distributions ``requirements`` reach; a missing one raises ``PackageNotFoundError``."""
    found: dict[tuple[str, tuple[str, ...]], metadata.Distribution] = {}
    todo = list(requirements)
    while todo:
        req = todo.pop()
        key = (canonicalize_name(req.name), tuple(sorted(req.extras)))
        if key in found:
            continue
        dist = found[key] = metadata.distribution(req.name)
        for text in dist.requires or []:
            sub = Requirement(text)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in ("", *key[1])):
                todo.append(sub)
    return list({canonicalize_name(d.metadata["Name"]): d for d in found.values()}.values())
