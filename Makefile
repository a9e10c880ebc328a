# The two commands a new user runs (see README): `make run` and `make test`.
.PHONY: setup setup-gpu run test test-fast bench peer-bench

CONFIG ?= configs/tiny-cpu.yaml
PYTEST_ARGS ?=

setup:
	scripts/setup.sh

# A GPU machine: the CUDA builds of the same lock (the cluster images' packages and versions) into .venv;
# `make run` and `make test` then keep that build. `scripts/setup.sh --gpu --print` lists the commands.
setup-gpu:
	scripts/setup.sh --gpu

run: setup
	.venv/bin/dapo run --config $(CONFIG)

# Two workers, one core each (tests/conftest.py pins them); a test file stays on one worker.
TEST_WORKERS ?= 2

test: setup
	.venv/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=25 $(PYTEST_ARGS)

test-fast: setup
	.venv/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not slow" $(PYTEST_ARGS)

# Issue 51's side-by-side with Hugging Face TRL on the main job's work (benchmarks/peer_trl.py). TRL is a
# benchmark-only dependency: scripts/setup-peer.sh puts it in .venv-peer beside .venv, which it never changes.
PEER_ARGS ?= --seeds 0 1 2 --steps 75
peer-bench: setup
	scripts/setup-peer.sh
	.venv/bin/python benchmarks/peer_trl.py $(PEER_ARGS)
