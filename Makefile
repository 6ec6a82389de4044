# Two commands for a fresh machine: `make serve` and `make test`.
# torch goes in first with an explicit pin: any looser spec resolves to a
# multi-GB CUDA build. Override on a GPU host: make serve TORCH_SPEC='torch==2.13.0'
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
HOST ?= 127.0.0.1
PORT ?= 8000
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: serve test test-fast bench install install-test clean

$(VENV)/.created:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH_SPEC)"
	touch $@

$(VENV)/.installed: $(VENV)/.created pyproject.toml
	$(PIP) install -q -e ".[service,client]"
	touch $@

$(VENV)/.installed-test: $(VENV)/.created pyproject.toml
	$(PIP) install -q -e ".[test]"
	touch $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

serve: $(VENV)/.installed
	$(PY) -m remote_autograd.service --host $(HOST) --port $(PORT)

test: $(VENV)/.installed-test
	$(PY) -m pytest $(PYTEST_ARGS)

# The inner loop: everything but the cases generated from the op table.
test-fast: $(VENV)/.installed-test
	$(PY) -m pytest -m "not optable" $(PYTEST_ARGS)

bench: $(VENV)/.installed-test
	$(PY) -m bench

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
