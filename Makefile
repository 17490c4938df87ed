# Two commands on a fresh machine: `make demo` (install + the main job on the simulated
# node) and `make test`. Both run scripts/setup.sh first, the same set-up CI uses.
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup demo test test-real real-lane check lint typecheck bench clean

setup:
	bash scripts/setup.sh

demo: setup
	bash scripts/demo.sh

# 4 workers on 2 cores: the Docker tests mostly wait on container boots. Bytecode is written
# (some machines set PYTHONDONTWRITEBYTECODE): each of the suite's ~1,000 CLI processes and
# each worker would otherwise compile the package and the rewritten tests again.
test: setup
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/pytest -q -n 4 -m "not real" --durations=15

# The real-vLLM lane: vLLM 0.21.0's CPU build (about 8 GB, cached outside the repo) serving a
# tiny model built here, deployed by the tool. scripts/real_vllm.sh builds or confirms it.
real-lane: setup
	bash scripts/real_vllm.sh

test-real: real-lane
	$(BIN)/pytest -q -m real tests/real

check: lint typecheck

lint: setup
	$(BIN)/ruff check b70deploy tests scripts $(wildcard benchmarks)

typecheck: setup
	$(BIN)/mypy

bench: setup
	$(BIN)/python benchmarks/run_all.py $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
