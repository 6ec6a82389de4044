"""The image builds from the repository as it is: every ``COPY``/``ADD`` source and bind
mount of ``docker/Dockerfile`` is in the build context that ``.dockerignore`` (an
allow-list) leaves, and secrets, venvs and caches are not.

``tests/dockerignore.py`` applies the file as Docker does; its rules are checked first
on the examples of Docker's own documentation. The tree is what git holds (tracked
files and untracked ones it does not ignore) plus the files a developer's checkout has
that must never reach a daemon (``.env``, ``.venv``, ``.git``, caches).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess

import pytest

from .. import dockerignore
from ..servers import ROOT

DOCKERFILE = ROOT / "docker" / "Dockerfile"

# What a checkout may hold besides git's files; none of it may be sent to the daemon.
NEVER_SENT = [".env", ".venv/pyvenv.cfg", ".venv/bin/python", ".venv/lib/python3.11/site-packages/torch/__init__.py",
              "venv/bin/python", ".git/config", ".git/HEAD", ".pytest_cache/CACHEDIR.TAG", ".hypothesis/examples/x",
              "build/lib/remote_autograd/__init__.py", "remote_autograd.egg-info/PKG-INFO", "dist/x.whl",
              "proto/__pycache__/codec.cpython-311.pyc", "service/ops/__pycache__/nn.cpython-311.pyc",
              "client/stale.pyc"]


@pytest.mark.parametrize("lines,path,sent", [
    # Docker's documentation: the last matching line decides
    (["*.txt", "!README*.txt", "README-secret.txt"], "README.txt", True),
    (["*.txt", "!README*.txt", "README-secret.txt"], "README-secret.txt", False),
    (["*.txt", "!README*.txt", "README-secret.txt"], "other.txt", False),
    (["*.txt", "README-secret.txt", "!README*.txt"], "README-secret.txt", True),
    (["*/temp*"], "somedir/temporary.txt", False),
    (["*/temp*"], "temporary.txt", True),
    (["*/*/temp*"], "somedir/subdir/temporary.txt", False),
    (["temp?"], "tempa", False),
    (["temp?"], "temp", True),
    (["**/*.go"], "a/b/c.go", False),
    (["**/*.go"], "c.go", False),
    # a directory's line covers everything below it, and an exception re-includes below an exclusion
    (["*", "!proto/"], "proto/sub/x.py", True),
    (["*", "!proto"], "protox/y.py", False),
    (["*", "!proto/", "**/__pycache__"], "proto/__pycache__/x.pyc", False),
    (["*", "!docker/local/", "docker/local/.gitignore"], "docker/local/README.md", True),
    (["# a comment", "", "  ./a/  "], "a/b", False),
    (["/a"], "a", False),
    ([r"\*x"], "*x", False),
    ([r"\*x"], "ax", True),
    (["[ab]c"], "bc", False),
    (["[^a]c"], "ac", True),
])
def test_patterns_follow_dockers_rules(lines: list[str], path: str, sent: bool):
    assert dockerignore.included(path, dockerignore.parse("\n".join(lines))) is sent


def _logical_lines(text: str) -> list[str]:
    """The Dockerfile's instructions, continuation lines joined, comments left out."""
    lines, current = [], ""
    for raw in text.splitlines():
        if not current and (not raw.strip() or raw.lstrip().startswith("#")):
            continue
        current += raw.rstrip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        lines.append(current.strip())
        current = ""
    return lines


def dockerfile_sources() -> tuple[list[str], list[str]]:
    """(the sources of every COPY/ADD from the context, the sources of every bind mount)."""
    copied, mounted = [], []
    for line in _logical_lines(DOCKERFILE.read_text()):
        word, _, rest = line.partition(" ")
        word = word.upper()
        if word in ("COPY", "ADD"):
            args = shlex.split(rest)
            flags = [a for a in args if a.startswith("--")]
            if any(f.startswith("--from=") for f in flags):
                continue
            rest = rest.strip()
            exec_form = rest.endswith("]") and "[" in rest  # COPY ["a", "b", "dest/"]
            paths = json.loads(rest[rest.index("["):]) if exec_form else [a for a in args if not a.startswith("--")]
            copied += [p.rstrip("/") for p in paths[:-1]]
        elif word == "RUN":
            for mount in re.findall(r"--mount=(\S+)", rest):
                opts = dict(kv.split("=", 1) for kv in mount.split(",") if "=" in kv)
                if opts.get("type") == "bind" and "from" not in opts:
                    mounted.append(opts.get("source", ".").rstrip("/"))
    return copied, mounted


def _tree() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60, check=True).stdout.split("\n")
    return [p for p in listed if p and (ROOT / p).exists()]


def test_every_dockerfile_source_is_in_the_build_context():
    copied, mounted = dockerfile_sources()
    assert {"pyproject.toml", "proto", "service", "client", "remote_autograd"} <= set(copied), copied
    assert {"docker/local", "docker/requirements.lock"} <= set(mounted), mounted
    tree = _tree()
    sent = dockerignore.context(ROOT, tree)
    for source in copied + mounted:
        under = [p for p in tree if p == source or p.startswith(source + "/")]
        assert under, f"{source} is not in the repository"
        assert set(under) & sent, f"{source} is left out of the build context: `docker build` fails on it"
        if source in copied:  # a copied folder arrives whole (SPEC.md beside the code, every module)
            assert not [p for p in under if p not in sent and "__pycache__" not in p], source


def test_secrets_venvs_and_caches_stay_out_of_the_build_context():
    sent = dockerignore.context(ROOT, NEVER_SENT)
    assert not sent, sorted(sent)
    # and nothing the image does not install: tests, benchmarks, examples
    extra = {p.split("/")[0] for p in dockerignore.context(ROOT, _tree())} - {"pyproject.toml", "README.md", "docker",
                                                                                  "proto", "service", "client",
                                                                                  "remote_autograd"}
    assert not extra, extra
