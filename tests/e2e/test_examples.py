"""The examples a newcomer runs first work as written: examples/curl.sh against a live
server, and examples/quickstart.ipynb executed headless (`jupyter nbconvert --execute`) on the kernel
`make notebook` installs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ..conftest import start_server

ROOT = Path(__file__).resolve().parents[2]
CURL_SH = ROOT / "examples" / "curl.sh"
NOTEBOOK = ROOT / "examples" / "quickstart.ipynb"

needs_curl = pytest.mark.skipif(shutil.which("curl") is None or shutil.which("bash") is None,
                                reason="curl.sh needs bash and curl")


def _run_curl_sh(url: str, token: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("URL", "TOKEN")}
    env["URL"] = url
    if token is not None:
        env["TOKEN"] = token
    return subprocess.run(["bash", str(CURL_SH)], env=env, capture_output=True, text=True, timeout=60)


def _printed_grad(stdout: str) -> list[float]:
    line = stdout.split("x.grad:\n", 1)[1].splitlines()[0]
    return json.loads(line)["grad"]["data"]


@needs_curl
def test_curl_walkthrough_prints_the_gradient(server_url: str):
    result = _run_curl_sh(server_url)
    assert result.returncode == 0, result.stdout + result.stderr
    assert _printed_grad(result.stdout) == [4.0, 5.0, 6.0]  # d/dx sum(x * w) = w
    assert re.search(r"^session: \S+$", result.stdout, re.M)
    assert result.stdout.rstrip().endswith("session closed")


@needs_curl
def test_curl_walkthrough_uses_the_token_and_stops_at_the_first_error():
    with start_server(REMOTE_AUTOGRAD_TOKENS="sesame") as url:
        refused = _run_curl_sh(url)
        assert refused.returncode != 0
        assert "unauthorized" in refused.stdout + refused.stderr
        assert "forward and backward done" not in refused.stdout
        accepted = _run_curl_sh(url, token="sesame")
        assert accepted.returncode == 0, accepted.stdout + accepted.stderr
        assert _printed_grad(accepted.stdout) == [4.0, 5.0, 6.0]


@needs_curl
def test_curl_walkthrough_without_a_server_stops_with_one_line():
    from ..servers import _free_port

    url = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    result = _run_curl_sh(url)
    assert result.returncode != 0 and result.stdout == ""
    assert result.stderr.count("\n") == 1, result.stderr  # one line, no traceback
    assert url in result.stderr and "make serve" in result.stderr, result.stderr


# -- the notebook ---------------------------------------------------------------------------


def test_notebook_needs_only_what_the_readme_installs_for_it():
    """Every package the notebook imports comes with ``pip install 'remote-autograd[notebook]'``
    (the README's install for notebooks; ``make serve`` installs the same)."""
    import ast
    from importlib import metadata

    from ..requirements import pyproject_requirements, reached

    nb = json.loads(NOTEBOOK.read_text())
    imported = set()
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            for node in ast.walk(ast.parse("".join(cell["source"]))):
                if isinstance(node, ast.Import):
                    imported |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0:
                    imported.add(node.module.split(".")[0])
    third_party = imported - set(sys.stdlib_module_names) - {"remote_autograd"}
    assert {"torch", "matplotlib", "IPython"} <= third_party, third_party
    installed = {d.metadata["Name"].lower() for d in reached(pyproject_requirements("notebook"))}
    providers = metadata.packages_distributions()
    missing = {m for m in third_party if not {p.lower() for p in providers.get(m, [])} & installed}
    assert not missing, f"the notebook imports {sorted(missing)}, which its install does not bring"
    assert "pip install 'remote-autograd[notebook]'" in "".join(nb["cells"][0]["source"])
    assert ".[notebook]" in (ROOT / "Makefile").read_text()
    assert {"jupyterlab", "nbconvert", "ipykernel"} <= installed  # a notebook UI, headless runs, the kernel


@pytest.mark.tooling
def test_quickstart_notebook_runs_headless_on_the_kernel_make_notebook_installs(tmp_path: Path):
    """``jupyter nbconvert --execute`` (what the notebook extra brings) runs the notebook on the kernel
    its metadata names, installed by the Makefile's command (into a prefix of the test's own: the
    Makefile's goes into the venv), and the kernel is this venv's Python."""
    jupyter = Path(sys.executable).parent / "jupyter"  # the notebook extra's (nbconvert, part of the test extra)
    kernel = json.loads(NOTEBOOK.read_text())["metadata"]["kernelspec"]["name"]
    makefile = (ROOT / "Makefile").read_text()
    assert f"KERNEL ?= {kernel}\n" in makefile and "-m ipykernel install --sys-prefix --name $(KERNEL)" in makefile
    assert "notebook: notebook-kernel\n\t$(VENV)/bin/jupyter lab examples/quickstart.ipynb" in makefile
    prefix = tmp_path / "prefix"
    subprocess.run([sys.executable, "-m", "ipykernel", "install", "--prefix", str(prefix), "--name", kernel],
                   check=True, capture_output=True, timeout=120)
    spec = json.loads((prefix / "share" / "jupyter" / "kernels" / kernel / "kernel.json").read_text())
    assert spec["argv"][0] == sys.executable
    # the kernel inherits this environment: no URL, so the notebook uses the embedded server. JUPYTER_PATH
    # comes first in Jupyter's search, before a user-wide kernel of the same name; the runtime files stay here.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REMOTE_AUTOGRAD_", "JUPYTER")) and k != "MPLBACKEND"}
    env.update(JUPYTER_PATH=str(prefix / "share" / "jupyter"), JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"))
    run = subprocess.run([str(jupyter), "nbconvert", "--to", "notebook", "--execute", str(NOTEBOOK),
                          "--output-dir", str(tmp_path), "--output", "executed", "--ExecutePreprocessor.timeout=180"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert run.returncode == 0, run.stderr[-4000:]
    nb = json.loads((tmp_path / "executed.ipynb").read_text())  # kept in tmp_path for a look after a failure
    outputs = [o for cell in nb["cells"] if cell["cell_type"] == "code" for o in cell.get("outputs", [])]
    text = "".join("".join(o.get("text", "")) for o in outputs if o.get("output_type") == "stream")
    assert "remote-autograd: session" in text  # the one-line summary on connect
    losses = [float(x) for x in re.findall(r"^step\s+\d+\s+loss\s+([0-9.eE+-]+)$", text, re.M)]
    assert len(losses) >= 5 and losses[-1] < losses[0] / 2, text
    assert any("image/png" in o.get("data", {}) for o in outputs), "the loss curve was not plotted"


# -- the README's three ways in -------------------------------------------------------------

README = ROOT / "README.md"


def _readme_section(title: str) -> str:
    text = README.read_text()
    start = text.index(f"\n## {title}")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else None]


def _code_blocks(section: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", section, re.S)


def test_readme_quick_start_python_runs(server_url: str):
    """The Python users' first snippet, as written, against a live server."""
    (snippet,) = _code_blocks(_readme_section("Quick start"), "python")
    assert 'client.connect("http://127.0.0.1:8000")' in snippet
    code = snippet.replace('"http://127.0.0.1:8000"', repr(server_url))
    printed: list = []
    exec(compile(code, "README.md quick start", "exec"), {"print": lambda *args: printed.append(args)})
    (loss,), (grad,) = printed
    assert isinstance(loss, float) and type(grad) is torch.Tensor and grad.shape == (2, 4)


@pytest.mark.tooling
def test_readme_operator_commands_are_valid_compose(tmp_path: Path):
    """Every `docker compose` line of the Operators section names files that validate together."""
    from .test_deploy import TOKEN_ENV, _compose

    lines = [ln.split("#")[0].strip() for block in _code_blocks(_readme_section("Operators"), "sh")
             for ln in block.splitlines() if ln.startswith("docker compose")]
    assert len(lines) == 3  # GPU, with the CPU override, and the Ray cluster (More than one GPU)
    for line in lines:
        files = [ROOT / f for f in re.findall(r"-f (\S+)", line)] or [ROOT / "docker-compose.yml"]
        assert _compose(tmp_path, *files, env_file=TOKEN_ENV).returncode == 0, line
    assert (ROOT / ".env.example").read_text().count("REMOTE_AUTOGRAD_TOKENS=") == 1


def test_readme_other_languages_points_at_real_files():
    section = _readme_section("Other languages")
    links = re.findall(r"\]\(([^)#]+)\)", section)
    assert {"proto/SPEC.md", "proto/schema.json", "examples/curl.sh"} <= set(links)
    assert all((ROOT / link).is_file() for link in links), links
    (command,) = _code_blocks(section, "sh")
    assert command.split("#")[0].split() == ["URL=http://127.0.0.1:8000", "bash", "examples/curl.sh"]
