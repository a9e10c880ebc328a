# The two commands a new user runs (see README): `make run` and `make test`.
.PHONY: setup run test test-fast bench

CONFIG ?= configs/tiny-cpu.yaml
PYTEST_ARGS ?=

setup:
	scripts/setup.sh

run: setup
	.venv/bin/dapo run --config $(CONFIG)

# Two workers, one core each (tests/conftest.py pins them); a test file stays on one worker.
TEST_WORKERS ?= 2

test: setup
	.venv/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=25 $(PYTEST_ARGS)

test-fast: setup
	.venv/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not slow" $(PYTEST_ARGS)
