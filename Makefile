# Two commands for a fresh machine: `make serve` and `make test`.
# torch goes in first with an explicit pin, so that installing the project never resolves
# another torch. It comes from pip's index (PyPI's Linux wheel is a CUDA build) unless
# TORCH_INDEX_URL names another: https://download.pytorch.org/whl/cpu for the small CPU
# build, https://download.pytorch.org/whl/cu126 (cu128, ...) for a given CUDA.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX_URL ?=
HOST ?= 127.0.0.1
PORT ?= 8000
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# setuptools tells every editable install of a package-dir mapping to beware of folders named
# like the package (ours are mapped on purpose: pyproject.toml); the one line it would print is noise.
EDITABLE := PYTHONWARNINGS="ignore:Editable installation" $(PIP) install -q -e

.PHONY: serve notebook notebook-kernel test test-fast bench install install-test clean gpu-wheels gpu-check-dry-run

$(VENV)/.created:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH_SPEC)" $(if $(TORCH_INDEX_URL),--index-url "$(TORCH_INDEX_URL)")
	touch $@

$(VENV)/.installed: $(VENV)/.created pyproject.toml
	$(EDITABLE) ".[notebook]"
	touch $@

$(VENV)/.installed-test: $(VENV)/.created pyproject.toml
	$(EDITABLE) ".[test]"
	touch $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

serve: $(VENV)/.installed
	$(PY) -m remote_autograd.service --host $(HOST) --port $(PORT)

# JupyterLab on examples/quickstart.ipynb, on a kernel that is this venv's Python. The kernel goes
# into the venv itself (--sys-prefix: $(VENV)/share/jupyter, which the venv's Jupyter reads), so
# nothing is registered for the user. REMOTE_AUTOGRAD_URL=http://... make notebook: a server of yours.
KERNEL ?= remote-autograd

notebook-kernel: $(VENV)/.installed
	$(PY) -m ipykernel install --sys-prefix --name $(KERNEL) --display-name "Python ($(KERNEL))" >/dev/null

notebook: notebook-kernel
	$(VENV)/bin/jupyter lab examples/quickstart.ipynb

# The suite on WORKERS pytest-xdist processes: part of it waits (servers starting, timeouts), so
# more workers than the 2 cores it is sized for. tests/workers.py keeps on one worker what must
# be (every Ray test; a module's own servers); `make test WORKERS=0` runs it in this one process.
WORKERS ?= 3
XDIST = $(if $(filter-out 0,$(WORKERS)),-n $(WORKERS))

test: $(VENV)/.installed-test
	$(PY) -m pytest $(XDIST) $(PYTEST_ARGS)

# The inner loop: proto, client, ops and service on the shared servers, without the cases generated
# from the op table, the end-to-end, load, real-model and Ray tests, the modules that start
# servers of their own (tests/conftest.py marks them), inductor's compiles and the tests marked
# `slow` (a process of their own, a model's training loop, hypothesis's many examples: seconds
# each; and the tenants backend's cases, the shared server's own settings run twice); `make test` runs all. A module none of whose tests is selected is not even imported
# (tests/conftest.py, pytest_ignore_collect): torch's op databases are not loaded for nothing.
test-fast: $(VENV)/.installed-test
	$(PY) -m pytest $(XDIST) -m "not optable and not e2e and not load and not real_model and not ray and not servers and not inductor and not tooling and not slow" $(PYTEST_ARGS)

bench: $(VENV)/.installed-test
	$(PY) -m bench

# The wheels bench/gpu_check.sh installs on a CUDA machine with Python 3.12 and no network
# (carry GPU_WHEELS there with the tree: together at most 64 MiB).
GPU_WHEELS ?= .gpu-wheels
GPU_PLATFORMS := manylinux2014_x86_64 manylinux_2_17_x86_64 manylinux_2_27_x86_64 manylinux_2_28_x86_64

gpu-wheels:
	rm -rf $(GPU_WHEELS)
	$(PYTHON) -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
		$(addprefix --platform ,$(GPU_PLATFORMS)) -r bench/gpu-requirements.txt -d $(GPU_WHEELS)
	@du -sh $(GPU_WHEELS)

gpu-check-dry-run: gpu-wheels $(VENV)/.installed-test
	bash bench/gpu_check.sh --dry-run

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
