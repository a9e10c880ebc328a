"""A published train step is reused only when the train stage's code is the code that trained it.

engines/train/publish.py records the train stage's cache version (infra/versioning.py: the import
closure of tasks/train.py) in the checkpoint's inputs beside the config and the batch sha256, and
``made_from`` compares all three: a fixed loss trains the step again, and everything downstream
follows (its upstream digest changes). A checkpoint published before the version was recorded is
reused (unknown code: the old run folder stays resumable).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from engines.train import publish as train_publish
from engines.train.publish import batch_sha256_of, made_from, publish_step, train_code_version
from settings.train import TrainConfig
from storage import checkpoints, pruning

from .test_pruning import STEPS, _run

CONFIG = TrainConfig()
OTHER_CODE = "train-0123456789abcdef"

_WORKER_FLOATS = ("loss", "entropy", "clip_frac_low", "clip_frac_high", "dual_clip_frac", "approx_kl", "grad_norm", "lr",
                  "policy_lag_mean", "stale_sample_fraction", "logprob_mismatch_mean_abs", "logprob_mismatch_max_abs",
                  "logprob_mismatch_on_policy_mean_abs", "logprob_mismatch_on_policy_max_abs", "behaviour_weight_mean",
                  "behaviour_weight_capped_fraction")


def _published_step(tmp_path: Path) -> tuple[Path, str]:
    """A train step published by ``publish_step`` from a staged folder (no worker), and its batch sha256."""
    batch = tmp_path / "batch.parquet"
    batch.write_bytes(b"the step's batch")
    out = tmp_path / "checkpoints" / "step-0001"
    staging = checkpoints.staging_dir(out)
    (staging / "model.safetensors").write_bytes(b"weights after step 1")
    worker = {**{k: 0.5 for k in _WORKER_FLOATS}, "policy_lag_max": 0, "tokens": 10, "samples": 2, "masked_samples": 0,
              "updates_done": 2, "timings": {"updates_s": 0.1}}
    publish_step([worker], {}, 0.2, staging=staging, out_dir=out, config=CONFIG, last_step=1, parent_id="bootstrap-0000-a",
                 batches_meta=[{"step": 1, "shards": [str(batch)]}], resume=False, t_start=0.0)
    return out, batch_sha256_of([batch])


def test_the_train_code_version_is_the_train_tasks_cache_version() -> None:
    from tasks.train import train

    assert train_code_version() == train.cache.version_override


def test_a_step_published_by_other_train_code_is_not_reused(tmp_path: Path) -> None:
    out, batch_sha256 = _published_step(tmp_path)
    assert checkpoints.read_info(out).inputs["train_code_version"] == train_code_version()
    assert made_from(out, config=CONFIG, batch_sha256=batch_sha256, code_version=train_code_version())
    assert not made_from(out, config=CONFIG, batch_sha256=batch_sha256, code_version=OTHER_CODE)
    # config and batch still count
    assert not made_from(out, config=TrainConfig(lr=CONFIG.lr * 2), batch_sha256=batch_sha256,
                         code_version=train_code_version())
    assert not made_from(out, config=CONFIG, batch_sha256="0" * 64, code_version=train_code_version())


def test_a_step_published_before_the_version_was_recorded_is_reused_by_any_code(tmp_path: Path) -> None:
    out, batch_sha256 = _published_step(tmp_path)
    info = checkpoints.read_info(out)
    del info.inputs["train_code_version"]
    (out / checkpoints.METADATA_FILE).write_text(json.dumps(asdict(info)))
    assert made_from(out, config=CONFIG, batch_sha256=batch_sha256, code_version=OTHER_CODE)


def _step_4_published_from_a_pruned_parent(tmp_path: Path, code_version: str) -> tuple[str, str, str]:
    """Steps 0..5 with retention K=1, M=2 (step 3 pruned whole); step 4 as published by ``code_version``
    from its batch. Returns (step 3, step 4, the batch)."""
    import pyarrow as pa

    import schemas
    from engines.train.publish import METRICS_FILE, TIMINGS_FILE

    layout = _run(str(tmp_path / "run"))
    pruning.apply_retention({s: layout.checkpoint(s) for s in STEPS}, latest=5, keep_optimizer_last=1, keep_weights_every=2)
    batch = tmp_path / "batch.parquet"
    batch.write_bytes(b"the step's batch")
    out = Path(layout.checkpoint(4))
    info = checkpoints.read_info(out)
    info.inputs.update(config=json.loads(json.dumps(asdict(CONFIG))), batch_sha256=batch_sha256_of([batch]),
                       train_code_version=code_version)
    (out / checkpoints.METADATA_FILE).write_text(json.dumps(asdict(info)))
    row = {f.name: 0 if pa.types.is_integer(f.type) else 0.5 if pa.types.is_floating(f.type) else "x"
           for f in schemas.arrow_schema(schemas.StepMetrics)}
    schemas.write_shard([{**row, "step": 4}], out / METRICS_FILE, schemas.StepMetrics)
    (out / TIMINGS_FILE).write_text("{}")
    return layout.checkpoint(3), str(out), str(batch)


def test_a_resume_with_the_same_train_code_reuses_the_step_its_pruned_parent_cannot_retrain(tmp_path: Path) -> None:
    from engines.train.launch import train_step_in_store

    parent, out, batch = _step_4_published_from_a_pruned_parent(tmp_path, train_code_version())
    assert train_step_in_store(parent, [batch], out, step=4, config=CONFIG).checkpoint_id == "train-0004-abc"


def test_a_resume_with_fixed_train_code_trains_the_step_again_and_a_pruned_parent_refuses_it(
        tmp_path: Path) -> None:
    # The published step is not reused (its code is another): training it again needs the parent's
    # weights, which the retention policy pruned, so the step is refused naming the parent.
    from engines.train import launch as train_launch

    parent, out, batch = _step_4_published_from_a_pruned_parent(tmp_path, OTHER_CODE)
    with pytest.raises(pruning.PrunedWeightsError, match="step-0003"):
        train_launch.train_step_in_store(parent, [batch], out, step=4, config=CONFIG)
    # Refused before anything was discarded: the published step is still there for the code that made it.
    assert checkpoints.read_info(out).inputs["train_code_version"] == OTHER_CODE


def test_the_version_is_computed_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real = train_publish.versioning.code_version
    monkeypatch.setattr(train_publish.versioning, "code_version", lambda *a: (calls.append(a[0]), real(*a))[1])
    train_code_version.cache_clear()
    assert train_code_version() == train_code_version() and calls == ["train"]


class _Trains(Exception):
    """Raised where an elastic rank starts training the step (instead of reusing it)."""


@pytest.mark.parametrize("published_by", ["this code", "other code"])
def test_an_elastic_rank_reuses_only_a_step_published_by_this_train_code(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, published_by: str) -> None:
    from engines.train import rank as train_rank

    parent, out, batch = _step_4_published_from_a_pruned_parent(
        tmp_path, train_code_version() if published_by == "this code" else OTHER_CODE)
    for name, value in {"TORCHELASTIC_RUN_ID": "test", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(name, value)

    def trains(*args: object, **kwargs: object) -> None:
        raise _Trains

    monkeypatch.setattr(train_rank, "_check_batches", trains)  # the first thing a rank does to train
    if published_by == "this code":
        result = train_rank.train_step_as_rank(parent, [batch], out, step=4, config=CONFIG)
        assert result is not None and result.checkpoint_id == "train-0004-abc"
    else:
        # Not reused, and its pruned parent cannot train it again: refused as on the local path
        # (engines/train/publish.py: reusable_step), the published step kept for the code that made it.
        with pytest.raises(pruning.PrunedWeightsError, match="step-0003"):
            train_rank.train_step_as_rank(parent, [batch], out, step=4, config=CONFIG)
        assert checkpoints.read_info(out).inputs["train_code_version"] == OTHER_CODE
