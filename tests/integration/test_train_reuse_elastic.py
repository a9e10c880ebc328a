"""Elastic ranks decide the reuse of a published step as the local launch does: once, on rank 0.

Two ranks started by torchrun run engines/train/rank.py: train_step_as_rank (what the Flyte PyTorch
plugin runs on a cluster). A step published at the out folder from another batch is not this step:
with a parent whose weights the retention policy pruned, every rank is refused with the pruned-weights
error and the published step is kept (engines/train/publish.py: reusable_step, as the local and
object-store paths); with a whole parent, rank 0 discards it and the ranks train the step again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from train_fixtures import random_batch, write_scored  # noqa: E402

from engines.bootstrap.tiny_policy import build_random_checkpoint  # noqa: E402
from engines.train.publish import batch_sha256_of, publish_step  # noqa: E402
from settings.train import TrainConfig  # noqa: E402
from storage import checkpoints, digests, pruning  # noqa: E402
from storage.retention_policy import Keep  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CONFIG = TrainConfig(num_processes=2, micro_batch_samples=2, updates_per_step=2, keep_workers_warm=False, seed=7)
_WORKER_FLOATS = ("loss", "entropy", "clip_frac_low", "clip_frac_high", "dual_clip_frac", "approx_kl", "grad_norm", "lr",
                  "policy_lag_mean", "stale_sample_fraction", "logprob_mismatch_mean_abs", "logprob_mismatch_max_abs",
                  "logprob_mismatch_on_policy_mean_abs", "logprob_mismatch_on_policy_max_abs", "behaviour_weight_mean",
                  "behaviour_weight_capped_fraction")


def _published_from_another_batch(out: Path, parent_id: str, other_batch: Path) -> str:
    """Step 1 published at ``out`` from ``other_batch`` (no worker: publish_step of a staged folder)."""
    staging = checkpoints.staging_dir(out)
    (staging / "model.safetensors").write_bytes(b"weights of another batch")
    worker = {**{k: 0.5 for k in _WORKER_FLOATS}, "policy_lag_max": 0, "tokens": 10, "samples": 2, "masked_samples": 0,
              "updates_done": 2, "timings": {}}
    publish_step([worker], {}, 0.2, staging=staging, out_dir=out, config=CONFIG, last_step=1, parent_id=parent_id,
                 batches_meta=[{"step": 1, "shards": [str(other_batch)]}], resume=False, t_start=0.0)
    digests.record(out)
    return checkpoints.read_info(out).checkpoint_id


def _two_ranks(tmp_path: Path, parent: Path, batch: Path, out: Path) -> subprocess.CompletedProcess[str]:
    args = {"checkpoint": str(parent), "shards": [str(batch)], "out": str(out), "step": 1, "config": asdict(CONFIG),
            "result_path": str(tmp_path / "result.json")}
    (tmp_path / "args.json").write_text(json.dumps(args))
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         f"--log-dir={tmp_path / 'torchelastic'}", str(Path(__file__).parent / "elastic_rank_main.py"),
         str(tmp_path / "args.json")],
        cwd=REPO, capture_output=True, text=True, timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)},
    )


def test_elastic_ranks_refuse_a_mismatching_step_from_a_pruned_parent_and_retrain_from_a_whole_one(
        tmp_path: Path) -> None:
    parent = build_random_checkpoint(tmp_path / "ck0", seed=0, num_layers=1, hidden_size=32, num_heads=2)
    digests.record(parent)
    vocab = json.loads((parent / "config.json").read_text())["vocab_size"]
    batch = write_scored(tmp_path / "batch.parquet", random_batch(1, 8, vocab=vocab))
    other = write_scored(tmp_path / "other.parquet", random_batch(2, 8, vocab=vocab))
    out = tmp_path / "run" / "step-0001"
    parent_id = checkpoints.read_info(parent).checkpoint_id
    published = _published_from_another_batch(out, parent_id, other)

    pruned = tmp_path / "pruned" / "ck0"
    build_random_checkpoint(pruned, seed=0, num_layers=1, hidden_size=32, num_heads=2)
    digests.record(pruned)
    pruning.prune_checkpoint(str(pruned), Keep(weights=False, optimizer_state=False))
    refused = _two_ranks(tmp_path, pruned, batch, out)
    assert refused.returncode != 0
    assert "pruned by the retention policy" in refused.stdout + refused.stderr, refused.stderr[-3000:]
    assert checkpoints.read_info(out).checkpoint_id == published  # kept: refused before any discard

    trained = _two_ranks(tmp_path, parent, batch, out)
    assert trained.returncode == 0, trained.stderr[-4000:]
    assert "training the step again" in trained.stderr
    info = checkpoints.read_info(out)
    assert info.checkpoint_id != published and info.inputs["batch_sha256"] == batch_sha256_of([batch])
    assert json.loads((tmp_path / "result.json").read_text())["checkpoint_id"] == info.checkpoint_id

