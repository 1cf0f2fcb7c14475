# The two commands of the README: `make demo` (the main job) and `make test`.
# Both create .venv on first use and install what they need: torch==2.13.0 first
# (override TORCH_SPEC / PIP_TORCH_ARGS for another build), then the package.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PIP_TORCH_ARGS ?=
BIN := $(VENV)/bin
STAMP := $(VENV)/.hypergrid-installed

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet $(PIP_TORCH_ARGS) "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m hypergrid demo

lint: $(STAMP)
	$(BIN)/ruff check hypergrid tests benchmarks
	$(BIN)/ruff format --check hypergrid tests benchmarks
	$(BIN)/mypy

test: lint
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
