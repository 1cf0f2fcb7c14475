# The two commands of the README: `make demo` (the main job) and `make test`.
# Both create .venv on first use and install what they need: torch==2.13.0 first
# (override TORCH_SPEC / PIP_TORCH_ARGS for another build), then the package.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PIP_TORCH_ARGS ?=
BIN := $(VENV)/bin
STAMP := $(VENV)/.hypergrid-installed

.PHONY: demo test test-stress chaos lint docs bench clean test-frameworks bench-frameworks test-megatron bench-megatron gpu-check

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

# The whole suite but the stress runs (tests marked `stress`: the larger sizes of scale, stress and
# randomized tests whose smallest size stays here); doctests and the docs' examples run too.
test: lint docs
	$(BIN)/python -m pytest -m "not stress"

# The stress runs `make test` leaves out; CI runs them after `make test`.
test-stress: $(STAMP)
	$(BIN)/python -m pytest -p no:cacheprovider -m stress tests

# Random kills under python -m hypergrid.run, 30 runs of each case (benchmarks/chaos.py; about 40 minutes here):
# prints each run and the failures with their seeds; exit 1 when any run failed. Not part of `make test`.
CHAOS_RUNS ?= 30
chaos: $(STAMP)
	mkdir -p bench-results
	$(BIN)/python benchmarks/chaos.py --runs $(CHAOS_RUNS) --json bench-results/chaos.json --logs bench-results/chaos-logs

# The benchmarks of docs/benchmarks.md and docs/performance.md; results in bench-results/.
bench: $(STAMP)
	mkdir -p bench-results
	$(BIN)/python benchmarks/enumeration.py --json bench-results/enumeration.json
	$(BIN)/python benchmarks/allreduce.py --minbytes 1K --maxbytes 16M --stepfactor 4 --iters 10 --warmup 3 \
		--json bench-results/allreduce.json --plot bench-results/allreduce_busbw.png
	$(BIN)/python benchmarks/creation.py --world 4,8,16 --guard on,off --json bench-results/creation.json
	$(BIN)/python benchmarks/creation.py --fake --world 1024,16384,65536 --json bench-results/creation_fake.json
	$(BIN)/python benchmarks/bridge.py --bytes 16M --iters 20 --warmup 3 --json bench-results/bridge.json

# The NCCL paths on every GPU this machine has, at most about 8 minutes (benchmarks/gpu_check.py; docs/performance.md):
# grid creation and every operation on CUDA tensors, the bridge, autograd, a death under NCCL, the all-reduce
# benchmark beside raw torch.distributed. Without a GPU it says so and exits 0.
gpu-check: $(STAMP)
	mkdir -p bench-results
	$(BIN)/python benchmarks/gpu_check.py --json bench-results/gpu_check.json

# The optional framework tier: torchtitan and DeepSpeed in their own environment (.venv/frameworks), the
# oracle tests of tests/frameworks (hypergrid's meshes and grids against the frameworks' own) on CPU and gloo.
# torchtitan 0.3.0 is installed without its dependencies (datasets, tokenizers, ... are not needed for meshes),
# plus the two it imports for them; DeepSpeed builds no ops at install (DS_BUILD_OPS=0).
FW_VENV ?= $(VENV)/frameworks
FW_BIN := $(FW_VENV)/bin
FW_STAMP := $(FW_VENV)/.hypergrid-frameworks-installed

$(FW_STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(FW_VENV)
	$(FW_BIN)/python -m pip install --quiet $(PIP_TORCH_ARGS) "$(TORCH_SPEC)"
	$(FW_BIN)/python -m pip install --quiet -e ".[test]"
	$(FW_BIN)/python -m pip install --quiet --no-deps "torchtitan==0.3.0"
	$(FW_BIN)/python -m pip install --quiet "spmd_types==0.2.3" "tyro==1.0.17"
	DS_BUILD_OPS=0 $(FW_BIN)/python -m pip install --quiet --no-build-isolation "deepspeed==0.19.8"
	touch $(FW_STAMP)

test-frameworks: $(FW_STAMP)
	DS_ACCELERATOR=cpu $(FW_BIN)/python -m pytest -p no:cacheprovider tests/frameworks

# The creation-cost comparison of docs/performance.md (torchtitan's build_mesh against hypergrid's).
bench-frameworks: $(FW_STAMP)
	mkdir -p bench-results
	$(FW_BIN)/python benchmarks/torchtitan_meshes.py --repeats 5 --json bench-results/torchtitan_meshes.json
# The Megatron-Core tier: hypergrid against megatron-core 0.19.2's own code (the oracle against
# initialize_model_parallel, examples/megatron_gpt.py, the collection tests with Megatron's real class).
# megatron-core 0.19 needs CPython 3.12, which `make test` does not: .ci/megatron-env builds that
# environment once (about 4.5 GB, two to four minutes; cached in ~/.cache/hypergrid/megatron-py312,
# override with MEGATRON_VENV) and prints its python; where no Python 3.12 is found it says so and
# the target skips.
MEGATRON_TESTS ?= tests/megatron tests/compat/test_megatron_collection.py tests/compat/test_megatron_processes.py \
	tests/compat/test_megatron_api.py hypergrid/compat docs/migrate/megatron.md
MEGATRON_ENV = python=$$(.ci/megatron-env) || { status=$$?; [ $$status -eq 3 ] && exit 0; exit $$status; }

test-megatron:
	@$(MEGATRON_ENV); PYTHONPATH=$(CURDIR) $$python -m pytest -p no:cacheprovider $(MEGATRON_TESTS)

# docs/performance.md's Megatron rows: hypergrid's one call against Megatron-Core's own builders.
bench-megatron:
	@$(MEGATRON_ENV); mkdir -p bench-results; \
	PYTHONPATH=$(CURDIR) $$python benchmarks/megatron_creation.py --world 4,8 --repeats 12 \
		--json bench-results/megatron_creation.json

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
