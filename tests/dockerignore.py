"""``.dockerignore`` applied as Docker applies it, to say what a build context holds.

The rules (Docker's documentation of the file, and the pattern matcher BuildKit uses):

- A line is trimmed; empty lines and lines starting with ``#`` are skipped. A leading
  ``!`` makes the pattern an exception (the path is let back in). The rest is cleaned
  like a path (``./a/`` is ``a``, a leading ``/`` is dropped).
- ``*`` matches any run of characters but ``/``, ``?`` one such character, ``[...]`` a
  class, ``\\`` escapes the next character; ``**`` matches any number of directories,
  none included (``**/x`` matches ``x`` and ``a/b/x``). A pattern matches a path when it
  matches the whole path, or one of the path's parent directories (so ``proto`` lets in
  everything under ``proto/``).
- The patterns are tried in order and the last one that matches decides: excluded,
  or (for an exception) included. A path no pattern matches is included.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pattern:
    regex: re.Pattern
    exception: bool

    def matches(self, path: str) -> bool:
        """The path itself, or any of its parent directories."""
        parts = path.split("/")
        return any(self.regex.fullmatch("/".join(parts[:n])) for n in range(len(parts), 0, -1))


def _regex(pattern: str) -> re.Pattern:
    out, i = [], 0
    while i < len(pattern):
        ch = pattern[i]
        if pattern.startswith("**", i):
            i += 2
            if pattern.startswith("/", i):  # "**/" is "**": any directories, or none
                i += 1
            out.append(".*" if i == len(pattern) else "(?:.*/)?")
            continue
        if ch == "*":
            out.append("[^/]*")
        elif ch == "?":
            out.append("[^/]")
        elif ch == "\\" and i + 1 < len(pattern):
            i += 1
            out.append(re.escape(pattern[i]))
        elif ch == "[":
            end = pattern.find("]", i + 1)
            if end < 0:
                raise ValueError(f"unterminated class in {pattern!r}")
            body = pattern[i + 1:end]
            out.append("[" + ("^" + body[1:] if body.startswith("^") else body) + "]")
            i = end
        else:
            out.append(re.escape(ch))
        i += 1
    return re.compile("".join(out))


def parse(text: str) -> list[Pattern]:
    patterns = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        exception = line.startswith("!")
        if exception:
            line = line[1:].strip()
        line = posixpath.normpath(line).lstrip("/") if line not in ("", "/") else line
        patterns.append(Pattern(_regex(line), exception))
    return patterns


def included(path: str, patterns: list[Pattern]) -> bool:
    """Whether ``path`` (relative, ``/``-separated) is in the build context."""
    verdict = True
    for p in patterns:
        if p.matches(path):
            verdict = p.exception
    return verdict


def context(root: Path, paths: list[str]) -> set[str]:
    """Those of ``paths`` that ``root``'s ``.dockerignore`` lets into the build context."""
    patterns = parse((root / ".dockerignore").read_text())
    return {p for p in paths if included(p, patterns)}
