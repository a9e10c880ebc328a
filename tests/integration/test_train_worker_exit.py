"""A training rank whose work is done ends without the interpreter's teardown.

A bf16 ZeRO-3 launch of two ranks on the CPU lost a rank to SIGABRT about once in 25 launches
("terminate called without an active exception"; with ``PYTHONFAULTHANDLER`` set: the main thread
alone, no Python frame), after every output of the step was written and the process group destroyed:
while the interpreter destroyed torch's, gloo's and DeepSpeed's C++ objects at exit. torchrun then
reported the launch failed and the finished step was thrown away (a CI failure of
test_train.py::test_a_bf16_zero3_step_resumed_from_disk_equals_the_one_continued_in_memory).

The crash cannot be provoked on demand, so this test puts one in the same place: every rank (and only
the ranks: torchrun sets ``LOCAL_RANK`` for them, not for its agent) registers ``os.abort`` with
``atexit`` through a ``sitecustomize`` module on its ``PYTHONPATH``, which runs at the interpreter's
teardown, as the C++ destructors do. A rank that ends with ``os._exit`` once its work is done (engines/
engines/train/worker.py) never reaches it; one that returns into the interpreter's exit aborts and fails the step.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from train_fixtures import assert_published_whole, random_batch, write_scored  # noqa: E402

from engines.bootstrap.tiny_policy import build_random_checkpoint  # noqa: E402
from engines.train.launch import train_step  # noqa: E402
from engines.train.publish import TrainStepError  # noqa: E402
from settings.train import TrainConfig  # noqa: E402

SITECUSTOMIZE = """
import atexit, os
if "LOCAL_RANK" in os.environ:  # a training rank, not torchrun's agent
    atexit.register(os.abort)
"""


def _step_inputs_with_rank_hook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sitecustomize: str) -> tuple[Path, Path]:
    """(a tiny step-0 checkpoint, a scored batch for step 1), with ``sitecustomize`` on the ranks'
    PYTHONPATH (every Python process of the launch imports it at start)."""
    ck0 = build_random_checkpoint(tmp_path / "ck0", seed=0, num_layers=1, hidden_size=16, num_heads=2)
    vocab = json.loads((ck0 / "config.json").read_text())["vocab_size"]
    shard = write_scored(tmp_path / "batch1.parquet", random_batch(1, 4, vocab=vocab))
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(sitecustomize)
    monkeypatch.setenv("PYTHONPATH", str(hooks))
    return ck0, shard


def test_a_crash_in_the_interpreters_teardown_after_the_step_does_not_fail_the_step(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ck0, shard = _step_inputs_with_rank_hook(tmp_path, monkeypatch, SITECUSTOMIZE)
    config = TrainConfig(num_processes=2, micro_batch_samples=2, updates_per_step=1, seed=3, keep_workers_warm=False)
    result = train_step(ck0, [shard], tmp_path / "w1", step=1, config=config)
    assert result.timings["warm_group"] == 0.0  # a one-off launch, whose ranks exit after the step
    assert_published_whole(result.checkpoint_dir, result.checkpoint_id, ck0, step=1)


def test_a_rank_that_crashes_in_native_code_shows_where_in_the_steps_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank killed by a signal (here SIGABRT while importing, as a C++ abort would) leaves its Python
    stack in the log the step's error quotes: the ranks run with ``faulthandler`` on."""
    ck0, shard = _step_inputs_with_rank_hook(
        tmp_path, monkeypatch, "import os\n\ndef crash_here():\n    os.abort()\n\nif 'LOCAL_RANK' in os.environ:\n    crash_here()\n")
    monkeypatch.delenv("PYTHONFAULTHANDLER", raising=False)
    config = TrainConfig(num_processes=1, micro_batch_samples=2, updates_per_step=1, seed=3, keep_workers_warm=False)
    with pytest.raises(TrainStepError) as caught:
        train_step(ck0, [shard], tmp_path / "w1", step=1, config=config)
    assert "Fatal Python error: Aborted" in str(caught.value)
    assert "in crash_here" in str(caught.value)
