# Every target is one line anyone could type by hand. `make demo` and `make test` set up first.
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin
ARGS ?=

.PHONY: setup demo test test-unit test-integration test-e2e test-fast lint format bench-pack bench-io bench-scaling bench-shuffle bench-mix bench-transfer bench-scale clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet -e ".[dev]" "$(TORCH)"  # with the pin: no extra can move torch
	touch $@

demo: setup
	$(BIN)/python -m bench.demo $(ARGS)

test: setup
	$(BIN)/python -m pytest --durations=20 $(ARGS)

# One layer each (tests/conftest.py gives every test exactly one). test-unit is the inner loop: no
# servers, ranks, Ray clusters, benchmarks or slow tests; test-fast is its old name.
test-unit: setup
	$(BIN)/python -m pytest -q -m unit $(ARGS)

test-integration: setup
	$(BIN)/python -m pytest -m integration --durations=10 $(ARGS)

test-e2e: setup
	$(BIN)/python -m pytest -m e2e --durations=10 $(ARGS)

test-fast: test-unit

lint: setup
	$(BIN)/ruff check . && $(BIN)/ruff format --check . && $(BIN)/lint-imports && $(BIN)/mypy

format: setup
	$(BIN)/ruff format . && $(BIN)/ruff check --fix .

bench-pack: setup
	$(BIN)/python -m bench.pack --docs docs/benchmarks.md $(ARGS)

bench-io: setup
	$(BIN)/python -m bench.io --docs docs/benchmarks.md $(ARGS)

bench-scaling: setup
	$(BIN)/python -m bench.scaling --docs docs/benchmarks.md $(ARGS)

bench-shuffle: setup
	$(BIN)/python -m bench.shuffle --docs docs/benchmarks.md $(ARGS)

bench-mix: setup
	$(BIN)/python -m bench.mix --docs docs/benchmarks.md $(ARGS)

bench-transfer: setup
	$(BIN)/python -m bench.transfer --docs docs/benchmarks.md $(ARGS)

bench-scale: setup
	$(BIN)/python -m bench.scale --docs docs/benchmarks.md $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .grimp_cache .import_linter_cache bench-results demo-out
