"""A re-run's reuse check of a published train step in the object store reads only its small files.

The train task (engines/train/launch.py: train_step_in_store) finds its step already uploaded when
it was killed after the upload and before Flyte recorded its result. Whether that step is reused is
decided by engines/train/publish.py: reusable_step, from the checkpoint's marker (config, batch
sha256, train code version); a reused step's result is its StepMetrics row and timings. Neither the
published step's weights and optimizer state nor the parent's (hundreds of GB at paper scale) may be
downloaded for that. Driven on the local S3 server (moto) the suite starts; no worker is launched.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from engines.train.launch import train_step_in_store
from engines.train.publish import publish_step
from settings.train import TrainConfig
from storage import checkpoints, digests, outputs, pruning, run_store
from storage.retention_policy import Keep

CONFIG = TrainConfig()
_WORKER_FLOATS = ("loss", "entropy", "clip_frac_low", "clip_frac_high", "dual_clip_frac", "approx_kl", "grad_norm", "lr",
                  "policy_lag_mean", "stale_sample_fraction", "logprob_mismatch_mean_abs", "logprob_mismatch_max_abs",
                  "logprob_mismatch_on_policy_mean_abs", "logprob_mismatch_on_policy_max_abs", "behaviour_weight_mean",
                  "behaviour_weight_capped_fraction")
_BIG = b"\0" * 4096  # stands for weights and optimizer state (what the check must not download)


def _parent(uri: str) -> str:
    """A step-0 policy published into the store with its digest record (as outputs.output does)."""
    with outputs.output(uri, folder=True) as local:
        staging = checkpoints.staging_dir(local)
        (staging / "model.safetensors").write_bytes(_BIG)
        (staging / "config.json").write_text("{}")
        checkpoints.publish(staging, local, checkpoints.CheckpointInfo("bootstrap-0000-a", 0, None, "bootstrap"))
    return uri


def _published_step(uri: str, batch: Path, tmp_path: Path) -> str:
    """Step 1 as publish_step writes it (weights, ds_state/, metrics, timings), uploaded to ``uri``."""
    out = tmp_path / "made" / "step-0001"
    staging = checkpoints.staging_dir(out)
    (staging / "model.safetensors").write_bytes(_BIG)
    (staging / checkpoints.OPTIMIZER_STATE_DIR / "tag").mkdir(parents=True)
    (staging / checkpoints.OPTIMIZER_STATE_DIR / "tag" / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(_BIG)
    worker = {**{k: 0.5 for k in _WORKER_FLOATS}, "policy_lag_max": 0, "tokens": 10, "samples": 2, "masked_samples": 0,
              "updates_done": 2, "timings": {"updates_s": 0.1}}
    publish_step([worker], {}, 0.2, staging=staging, out_dir=out, config=CONFIG, last_step=1,
                 parent_id="bootstrap-0000-a", batches_meta=[{"step": 1, "shards": [str(batch)]}], resume=False,
                 t_start=0.0)
    run_store.upload_folder(out, uri)
    digests.record(uri, out)
    return checkpoints.read_info(out).checkpoint_id


def _mirrored_files(uri: str) -> list[str]:
    local = run_store.local_path(uri)
    return sorted(p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file()) if local.exists() else []


def _store(tmp_path: Path, s3_env) -> tuple[str, str, str, str]:
    root = f"s3://dapo-test/reuse-{tmp_path.name}"
    batch = tmp_path / "batch.parquet"
    batch.write_bytes(b"the step's batch")
    run_store.upload_file(batch, f"{root}/batch.parquet")
    parent = _parent(f"{root}/checkpoints/step-0000")
    published_id = _published_step(f"{root}/checkpoints/step-0001", batch, tmp_path)
    shutil.rmtree(run_store.mirror_root())  # the re-run's pod: a fresh node, nothing mirrored
    return f"{root}/batch.parquet", parent, f"{root}/checkpoints/step-0001", published_id


def test_the_reuse_of_a_published_step_in_the_store_fetches_only_its_small_files(tmp_path: Path, s3_env) -> None:
    batch, parent, out, published_id = _store(tmp_path, s3_env)
    result = train_step_in_store(parent, [batch], out, step=1, config=CONFIG)
    assert result.checkpoint_id == published_id and result.checkpoint_dir == out
    assert result.metrics["step"] == 1 and result.timings["updates_s"] == 0.1
    # The published step's marker, StepMetrics row and timings: not its weights or optimizer state.
    assert _mirrored_files(out) == ["dapo_checkpoint.json", "train_metrics.parquet", "train_timings.json"]
    assert _mirrored_files(parent) == []  # nor anything of the parent: nothing is trained
    # A later reader of the whole checkpoint gets the rest added to the partial copy.
    whole = run_store.fetch(out)
    assert (whole / "model.safetensors").read_bytes() == _BIG


def test_a_mismatching_step_in_the_store_with_a_pruned_parent_is_refused_and_kept(tmp_path: Path, s3_env) -> None:
    batch, parent, out, published_id = _store(tmp_path, s3_env)
    pruning.prune_checkpoint(parent, Keep(weights=False, optimizer_state=False))
    other = TrainConfig(lr=CONFIG.lr * 2)  # another config: the published step is not this one
    with pytest.raises(pruning.PrunedWeightsError, match="step-0000: pruned by the retention policy"):
        train_step_in_store(parent, [batch], out, step=1, config=other)
    assert checkpoints.read_info(out).checkpoint_id == published_id  # kept for the config that made it
    assert _mirrored_files(out) == [] and _mirrored_files(parent) == []
