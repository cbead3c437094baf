# The two commands of the quick start are `make run` and `make test`; both install first.
SHELL := /bin/bash
PYTHON ?= python3.11
UV_VERSION := 0.13.9
TOOLS := .tools
UV := $(TOOLS)/bin/uv
VENV := .venv
BIN := $(VENV)/bin
CONFIG ?= config/gateway.example.yaml
PACKAGES := primitives errors gateway channels sessions storage
export UV_PROJECT_ENVIRONMENT := $(VENV)

.PHONY: install run test lint format pytest lock clean

install: $(VENV)/.installed

$(UV):
	$(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)

$(VENV)/.installed: $(UV) pyproject.toml uv.lock
	$(UV) sync --frozen --python $(PYTHON)
	$(BIN)/python -m sessions.recall_embedding
	touch $@

lock: $(UV)
	$(UV) lock --python $(PYTHON)

run: install
	$(BIN)/gateway run --config $(CONFIG) --log-format console

lint: install
	$(BIN)/ruff check $(PACKAGES) tests bench
	$(BIN)/ruff format --check $(PACKAGES) tests bench
	$(BIN)/mypy $(PACKAGES)

format: install
	$(BIN)/ruff format $(PACKAGES) tests bench
	$(BIN)/ruff check --fix $(PACKAGES) tests bench

# Three xdist workers on two cores: most of a test's time is spent waiting on loopback servers
# and gateway processes, not computing. `--dist loadgroup` keeps the tests marked
# `xdist_group("gateway_processes")` on one worker, one after another (see
# tests/e2e/test_processes.py). PYTEST_ARGS="-n 0" runs everything in one process.
PYTEST_WORKERS ?= 3

pytest: install
	$(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

test: lint pytest

clean:
	rm -rf $(VENV) $(TOOLS) .mypy_cache .ruff_cache .pytest_cache var
