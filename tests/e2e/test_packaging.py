"""The wheel, installed without extras, is the whole first hour; and it lives beside proto-plus.

``pip install remote-autograd`` (no extras) must give a working SDK, a working
``connect()`` without a URL (the embedded server) and a working ``remote-autograd-serve``.
The wheel is built from this checkout and installed into one new venv, shared by the
tests here. That venv sees third-party packages through a ``.pth`` line naming a folder
of links to exactly the distributions the wheel's base requirements reach (their own
requirements followed, extras only where a requirement names them), taken from the
project's ``.venv``: so the test stays offline and fast (torch is linked, not
reinstalled), and a package the base install lacks is missing there as it would be
after a real ``pip install``. Nothing of this checkout is importable except through
the wheel (the project's editable hook is a ``.pth`` of ``.venv`` that is not run).

proto-plus (every Google Cloud library, ``ray[default]``) owns the top-level package
``proto``; when we installed a ``proto`` of our own, each overwrote the other's files.
proto-plus goes into the venv before the wheel and again after it; both then import in
one process.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from email.parser import Parser
from importlib import metadata
from pathlib import Path
from typing import Iterator

import pytest
from packaging.requirements import Requirement

from ..requirements import reached
from ..servers import ROOT, _free_port

pytestmark = pytest.mark.tooling


def _run(*args: str, cwd: Path, env: dict | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(args)}\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, str]:
    """The wheel, and what building it printed."""
    # Built from a copy: setuptools keeps a build/ folder beside the sources, and files left there
    # by an earlier build (a module since deleted) would go into the wheel.
    source, out = tmp_path_factory.mktemp("source") / "tree", tmp_path_factory.mktemp("dist")
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".*", "build", "dist", "*.egg-info", "__pycache__"))
    done = _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                str(source), cwd=out)
    (wheel,) = out.glob("remote_autograd-*.whl")
    return wheel, done.stdout + done.stderr


@pytest.fixture(scope="module")
def wheel(built: tuple[Path, str]) -> Path:
    return built[0]


def _base_requirements(wheel: Path) -> list[Requirement]:
    """The wheel's requirements that hold without any extra."""
    with zipfile.ZipFile(wheel) as z:
        (name,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        meta = Parser().parsestr(z.read(name).decode())
    reqs = [Requirement(r) for r in meta.get_all("Requires-Dist") or []]
    return [r for r in reqs if r.marker is None or r.marker.evaluate({"extra": ""})]


def _link_farm(dists: list[metadata.Distribution], farm: Path) -> None:
    """A folder holding links to the top-level files and folders of ``dists`` (and nothing else)."""
    site = Path(sysconfig.get_paths()["purelib"])
    farm.mkdir()
    for dist in dists:
        for file in dist.files or []:
            top = file.parts[0]
            if top == ".." or top.endswith(".pth") or top == "__pycache__":
                continue
            target = site / top
            if target.exists() and not (farm / top).exists():
                (farm / top).symlink_to(target)


class Venv:
    """A venv with the wheel installed (no extras) and a clean environment to run it in."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.python = root / "bin" / "python"
        self.site = Path(self.run("-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip())
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("REMOTE_AUTOGRAD_", "PYTHON"))}

    def run(self, *args: str, timeout: float = 180) -> str:
        return _run(str(self.python), *args, cwd=self.root, env=getattr(self, "env", None), timeout=timeout).stdout

    def pip(self, *args: str) -> str:
        # --ignore-installed: pip sees the linked packages and must neither skip what is there
        # nor uninstall from it.
        return self.run("-m", "pip", "install", "-q", "--ignore-installed", "--no-warn-conflicts",
                        "--disable-pip-version-check", *args)


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory) -> Iterator[Venv]:
    root = tmp_path_factory.mktemp("venv")
    venv.create(root / "env", with_pip=False, symlinks=True)
    env = Venv(root / "env")
    # pip is linked too (no requirement of ours, but every venv has it)
    _link_farm([*reached(_base_requirements(wheel)), metadata.distribution("pip")], root / "deps")
    (env.site / "_first_hour_deps.pth").write_text(f"{root / 'deps'}\n")
    env.pip("proto-plus")
    env.pip("--no-deps", str(wheel))
    env.pip("--no-deps", "--force-reinstall", "proto-plus")
    yield env


def test_wheel_has_one_top_level_name(wheel: Path):
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/", 1)[0] for n in names}
    assert {t for t in top if not t.endswith(".dist-info")} == {"remote_autograd"}, sorted(top)
    assert "remote_autograd/proto/SPEC.md" in names and "remote_autograd/service/ops/__init__.py" in names
    assert "remote_autograd/proto/SPEC-examples.md" in names  # SPEC.md links to it
    assert "remote_autograd/_fill_buffer.py" in names and "remote_autograd/service/http/routes/programs.py" in names


def test_building_prints_no_packaging_deprecation(built: tuple[Path, str]):
    """setuptools used to warn, in about 45 lines, that ``project.license`` as a table is deprecated."""
    _, printed = built
    assert not re.search(r"deprecat", printed, re.I), printed


def test_no_extras_runs_the_quick_start_on_the_embedded_server(installed: Venv):
    quick_start = """
import torch
from remote_autograd import client
with client.connect() as sess:   # no URL: the embedded server, a child process of this venv's python
    device = sess.device
    model = torch.nn.Linear(4, 2).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(3, 4).to(device)
    loss = torch.nn.functional.relu(model(x)).sum()
    loss.backward()
    opt.step()
    print("loss", loss.item())
    print("grad", tuple(model.weight.grad.cpu().shape))
"""
    out = installed.run("-c", quick_start, timeout=240)
    assert re.fullmatch(r"loss -?\d+\.\d+(e-?\d+)?\ngrad \(2, 4\)\n", out), out


def test_no_extras_serves_and_says_so_in_one_line(installed: Venv):
    port = _free_port()
    server = subprocess.Popen([str(installed.root / "bin" / "remote-autograd-serve"), "--port", str(port)],
                              cwd=installed.root, env=installed.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        line = server.stdout.readline()  # blocks until it listens (or exits)
        url = f"http://127.0.0.1:{port}"
        assert line == (f"remote-autograd is serving on {url} (API docs: {url}/docs); no tokens: this machine only; "
                        "sessions end with the process (no REMOTE_AUTOGRAD_STATE_DIR); Ctrl-C stops it\n"), (
            line, server.stderr.read() if server.poll() is not None else "")
        check = f"""
import proto, remote_autograd
from proto.primitives import ProtoType     # proto-plus's own module
assert proto.__file__.startswith({str(installed.site)!r}), proto.__file__
assert remote_autograd.__file__.startswith({str(installed.site)!r}), remote_autograd.__file__
import torch
from remote_autograd import client
with client.connect("{url}") as sess:
    w = sess.tensor(torch.randn(4, 2), requires_grad=True)
    x = client.RemoteTensor.from_torch(torch.randn(3, 4), sess)
    torch.nn.functional.relu(x @ w).sum().backward()
    assert w.grad.to_torch().shape == (4, 2)
print("ok", ProtoType.DOUBLE.name)
"""
        assert installed.run("-c", check).split() == ["ok", "DOUBLE"]
    finally:
        server.terminate()
        rest, errors = server.communicate(timeout=30)
    assert rest == "", rest  # the one line, nothing more on stdout
    assert not re.search(r"deprecat|Traceback", errors, re.I), errors


def test_installs_beside_proto_plus(installed: Venv):
    ours = sorted(p.name for p in installed.site.iterdir() if "remote_autograd" in p.name.lower())
    assert [n for n in ours if not n.endswith(".dist-info")] == ["remote_autograd"], ours
    assert not (installed.site / "proto" / "SPEC.md").exists() and not (installed.site / "client").exists()
