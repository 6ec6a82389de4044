"""The wheel installs one import name of our own and lives beside proto-plus.

proto-plus (every Google Cloud library, ``ray[default]``) owns the top-level
package ``proto``; when we installed a ``proto`` of our own, each overwrote the
other's files. The wheel is built from this checkout and installed into a new
venv with proto-plus installed before it and again after it; then both
packages import in one process, and the README's quick start runs against a
server started from that venv.

The new venv gets its third-party dependencies (torch, FastAPI, httpx...)
from the project's own ``.venv`` through a ``.pth`` line, so the test stays
offline and fast; that line adds a path only: the project's editable install
(a ``.pth`` hook of its own in ``.venv``) is not run there, so nothing of this
checkout is importable except through the wheel.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

from ..servers import ROOT, _free_port

pytestmark = pytest.mark.tooling


def _run(*args: str, cwd: Path, env: dict | None = None, timeout: float = 120) -> str:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(args)}\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    # Built from a copy: setuptools keeps a build/ folder beside the sources, and files left there
    # by an earlier build (a module since deleted) would go into the wheel.
    source, out = tmp_path_factory.mktemp("source") / "tree", tmp_path_factory.mktemp("dist")
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".*", "build", "dist", "*.egg-info", "__pycache__"))
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(source),
         cwd=out)
    (built,) = out.glob("remote_autograd-*.whl")
    return built


def test_wheel_has_one_top_level_name(wheel: Path):
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/", 1)[0] for n in names}
    assert {t for t in top if not t.endswith(".dist-info")} == {"remote_autograd"}, sorted(top)
    assert "remote_autograd/proto/SPEC.md" in names and "remote_autograd/service/ops/__init__.py" in names
    assert "remote_autograd/proto/SPEC-examples.md" in names  # SPEC.md links to it
    assert "remote_autograd/_fill_buffer.py" in names and "remote_autograd/service/routes/programs.py" in names


def test_installs_beside_proto_plus(wheel: Path, tmp_path: Path):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False, symlinks=True)
    python = env_dir / "bin" / "python"
    site = Path(_run(str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=tmp_path).strip())
    (site / "_project_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REMOTE_AUTOGRAD_", "PYTHON"))}
    # --ignore-installed: pip sees the project's .venv through that line and must neither
    # skip what is there nor uninstall from it.
    pip = [str(python), "-m", "pip", "install", "-q", "--ignore-installed", "--no-warn-conflicts",
           "--disable-pip-version-check"]

    _run(*pip, "proto-plus", cwd=tmp_path, env=env)
    _run(*pip, "--no-deps", str(wheel), cwd=tmp_path, env=env)
    _run(*pip, "--no-deps", "--force-reinstall", "proto-plus", cwd=tmp_path, env=env)

    ours = sorted(p.name for p in site.iterdir() if "remote_autograd" in p.name.lower())
    assert [n for n in ours if not n.endswith(".dist-info")] == ["remote_autograd"], ours
    assert not (site / "proto" / "SPEC.md").exists() and not (site / "client").exists()

    port = _free_port()
    server = subprocess.Popen([str(env_dir / "bin" / "remote-autograd-serve"), "--port", str(port)], cwd=tmp_path,
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        check = f"""
import time, httpx
for _ in range(600):
    try:
        if httpx.get("http://127.0.0.1:{port}/healthz").status_code == 200: break
    except httpx.TransportError: time.sleep(0.05)
import proto, remote_autograd
from proto.primitives import ProtoType     # proto-plus's own module
assert proto.__file__.startswith({str(site)!r}), proto.__file__
assert remote_autograd.__file__.startswith({str(site)!r}), remote_autograd.__file__
import torch
from remote_autograd import client
with client.connect("http://127.0.0.1:{port}") as sess:
    w = sess.tensor(torch.randn(4, 2), requires_grad=True)
    x = client.RemoteTensor.from_torch(torch.randn(3, 4), sess)
    torch.nn.functional.relu(x @ w).sum().backward()
    assert w.grad.to_torch().shape == (4, 2)
print("ok", ProtoType.DOUBLE.name)
"""
        assert _run(str(python), "-c", check, cwd=tmp_path, env=env).split() == ["ok", "DOUBLE"]
    finally:
        server.terminate()
        server.wait(timeout=30)
