# The two commands a new user runs (see README): `make run` and `make test`.
.PHONY: setup run test test-fast bench

CONFIG ?= configs/tiny-cpu.yaml
PYTEST_ARGS ?=

setup:
	scripts/setup.sh

run: setup
	.venv/bin/dapo run --config $(CONFIG)

test: setup
	.venv/bin/python -m pytest -q --durations=25 $(PYTEST_ARGS)

test-fast: setup
	.venv/bin/python -m pytest -q -m "not slow" $(PYTEST_ARGS)
