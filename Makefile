# The two commands of the README: `make demo` (the main job) and `make test`.
# Both create .venv on first use and install what they need: torch==2.13.0 first
# (override TORCH_SPEC / PIP_TORCH_ARGS for another build), then the package.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PIP_TORCH_ARGS ?=
BIN := $(VENV)/bin
STAMP := $(VENV)/.hypergrid-installed

.PHONY: demo test lint docs bench clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet $(PIP_TORCH_ARGS) "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -e ".[test,bench,docs]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m hypergrid demo

lint: $(STAMP)
	$(BIN)/ruff check hypergrid tests benchmarks examples
	$(BIN)/ruff format --check hypergrid tests benchmarks examples
	$(BIN)/mypy

# The docs site, built with --strict: a broken link or docstring fails the build.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet -d site

test: lint docs
	$(BIN)/python -m pytest

# The benchmarks of docs/benchmarks.md and docs/performance.md; results in bench-results/.
bench: $(STAMP)
	mkdir -p bench-results
	$(BIN)/python benchmarks/enumeration.py --json bench-results/enumeration.json
	$(BIN)/python benchmarks/allreduce.py --minbytes 1K --maxbytes 16M --stepfactor 4 --iters 10 --warmup 3 \
		--json bench-results/allreduce.json --plot bench-results/allreduce_busbw.png
	$(BIN)/python benchmarks/creation.py --world 4,8,16 --guard on,off --json bench-results/creation.json
	$(BIN)/python benchmarks/creation.py --fake --world 1024,16384,65536 --json bench-results/creation_fake.json
	$(BIN)/python benchmarks/bridge.py --bytes 16M --iters 20 --warmup 3 --json bench-results/bridge.json

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
