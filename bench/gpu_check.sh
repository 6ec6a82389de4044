#!/usr/bin/env bash
# The GPU check in one go, on a bare CUDA machine with Python 3.12 and its own torch (no FastAPI,
# Starlette, pydantic or uvicorn there, and no network): install the rest from the wheels carried
# with the repository copy, run the suite's device-aware tests with REMOTE_AUTOGRAD_DEVICE=cuda,
# then the bench's `gpu` section; logs and a summary go under $OUT.
#
#   make gpu-wheels                        # here, once: cp312 manylinux wheels into .gpu-wheels/
#   bash bench/gpu_check.sh                # there, with .gpu-wheels carried beside the tree
#   bash bench/gpu_check.sh --dry-run      # here: the same install into a fresh venv, the rest checked
#
# Settings: PYTHON (the interpreter that holds torch; python3), GPU_WHEELS (.gpu-wheels),
# GPU_TESTS (the test files), OUT (gpu-check-out/ when unset).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

WHEELS=${GPU_WHEELS:-.gpu-wheels}
OUT=${OUT:-$PWD/gpu-check-out}
# The tests that read the server's device and adapt to it (tolerances, deterministic variants,
# device memory): the real models trained on both sides, and the metrics' device gauges.
# and CUDA-graph replay against the plain path on the same GPU.
GPU_TESTS=${GPU_TESTS:-tests/e2e/test_real_models.py tests/service/http/test_observability.py tests/service/engine/test_graph_steps.py}
CARRY_LIMIT=$((64 << 20))
DRY_RUN=0
case "${1:-}" in
  --dry-run) DRY_RUN=1 ;;
  "") ;;
  *) echo "usage: bash bench/gpu_check.sh [--dry-run]" >&2; exit 2 ;;
esac
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
export PIP_BREAK_SYSTEM_PACKAGES=1  # the machine is thrown away afterwards; its python may be a system one
# only the plugins the suite needs: the machine's own (xdist, benchmark, ...) may not suit this pytest
export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1

say() { printf '\n== %s\n' "$*"; }

carried_bytes() {  # what travels to the device machine: the tree (tracked and not ignored) and the wheels
  local tree wheels
  tree=$( { git ls-files -z --cached --others --exclude-standard 2>/dev/null || true; } \
          | xargs -0 -r stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
  wheels=$(du -sb "$WHEELS" | cut -f1)
  echo $((tree + wheels))
}

pick_dry_run_python() {  # python3.12 where there is one (as on the GPU machine), else 3.11
  local candidate
  for candidate in python3.12 "$(pyenv root 2>/dev/null)"/versions/3.12*/bin/python3.12 python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys' 2>/dev/null; then
      echo "$candidate"
      return
    fi
  done
  echo "no python3.12, python3.11 or python3 here" >&2
  exit 2
}

if [[ ! -d $WHEELS ]] || ! compgen -G "$WHEELS/*.whl" >/dev/null; then
  echo "no wheels in $WHEELS: run 'make gpu-wheels' first (and carry $WHEELS to the GPU machine)" >&2
  exit 2
fi

if ((DRY_RUN)); then
  base=$(pick_dry_run_python)
  venv=$(mktemp -d /tmp/ra-gpu-dry.XXXXXX)
  trap 'rm -rf "$venv"' EXIT
  say "dry run: a fresh venv of $base in $venv stands for the GPU machine's python"
  "$base" -m venv "$venv"
  PY=$venv/bin/python
else
  PY=${PYTHON:-python3}
fi

say "versions"
uname -a
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || echo "no nvidia-smi"
"$PY" --version
"$PY" -m pip --version
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' \
  || echo "no torch in $PY"
echo "carried: $(($(carried_bytes) >> 20)) MiB of at most $((CARRY_LIMIT >> 20)) MiB"
(($(carried_bytes) < CARRY_LIMIT)) || { echo "the tree and $WHEELS are over the carry limit" >&2; exit 2; }

say "installing from $WHEELS (nothing from the network)"
# What the machine already has at a version that fits stays; the rest comes from the wheels.
"$PY" -m pip install -q --no-index --find-links "$WHEELS" -r bench/gpu-requirements.txt
# The project itself, built from this tree; --no-deps: its torch pin must not replace the machine's torch.
"$PY" -m pip install -q --no-index --no-deps --no-build-isolation .
"$PY" - <<'EOF'
import importlib.metadata as md
names = ["fastapi", "starlette", "pydantic", "pydantic-core", "uvicorn", "httptools", "uvloop", "httpx", "httpcore",
         "h11", "anyio", "msgpack", "prometheus-client", "fastapi-offline", "tqdm", "pytest", "hypothesis", "numpy",
         "safetensors", "remote-autograd"]
print(", ".join(f"{n} {md.version(n)}" for n in names))
import fastapi, httptools, httpx, hypothesis, msgpack, prometheus_client, pydantic, pytest, safetensors, tqdm, uvicorn, uvloop  # noqa
EOF

if ((DRY_RUN)); then
  if "$PY" -c 'import torch' 2>/dev/null; then
    CHECK_PY=$PY
  else  # no torch for this python here: the tests and the bench are checked with the repository's venv
    CHECK_PY=.venv/bin/python
    echo "this python has no torch: collecting the tests and running the section with $CHECK_PY"
  fi
  say "dry run: the tests a GPU run would run"
  "$CHECK_PY" -m pytest --collect-only -q -p no:cacheprovider $GPU_TESTS | tail -n 1
  say "dry run: the bench's gpu section (it says why it skips without CUDA)"
  "$CHECK_PY" -m bench gpu
  say "dry run done: on a GPU machine, bash bench/gpu_check.sh"
  exit 0
fi

"$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else "torch sees no CUDA device here")'
export REMOTE_AUTOGRAD_DEVICE=cuda
say "the service and the SDK import on this torch"
"$PY" -c 'import remote_autograd.service.http.app, remote_autograd.client; print("ok")' 2>&1 | tee "$OUT/imports.log"

say "tests with REMOTE_AUTOGRAD_DEVICE=cuda: $GPU_TESTS"
tests_status=0
"$PY" -m pytest -q -p no:cacheprovider $GPU_TESTS 2>&1 | tee "$OUT/tests.log" || tests_status=$?

say "python -m bench gpu"
bench_status=0
"$PY" -m bench gpu 2>&1 | grep -v '^{"' | tee "$OUT/bench-gpu.log" || bench_status=$?

say "summary"
{
  echo "tests: exit status $tests_status ($(tail -n 1 "$OUT/tests.log"))"
  echo "bench gpu: exit status $bench_status"
} | tee "$OUT/summary.txt"
exit $((tests_status || bench_status))
