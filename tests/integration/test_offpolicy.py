"""Off-policy correction in a real training step (engines/train/step.py, dapo_core/correction.py).

The parent is a step-3 checkpoint, so step 4 trains from it: samples of policy_version 3 are
on-policy, older ones are stale (carried surplus, or a pipelined rollout). Four cold launches of
one tiny DeepSpeed step (~10-25 s each on 2 cores):

- a mixed batch (half the samples two versions old), correction "off" vs "auto": the updates
  differ, and the StepMetrics row records the lag, the stale fraction and weights != 1; its
  on-policy samples carry the parent's own log-probs, so the engine/trainer mismatch measured on
  them alone is ~0 while the stale samples' policy change dominates the mismatch over all samples;
- an on-policy batch, "off" vs "auto": bitwise the same update (auto changes nothing on-policy),
  although its recorded rollout log-probs (random) disagree with the trainer's.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).parent))
from train_fixtures import random_batch, write_scored  # noqa: E402

import schemas  # noqa: E402
from engines.bootstrap.tiny_policy import build_random_model, build_tokenizer, save_checkpoint  # noqa: E402
from engines.train.launch import train_step
from engines.train.publish import METRICS_FILE, TrainStepError
from settings.train import TrainConfig  # noqa: E402


PARENT_STEP = 3
CONFIG = TrainConfig(num_processes=1, micro_batch_samples=8, updates_per_step=2, lr=3e-3, warmup_steps=0,
                     seed=7, keep_workers_warm=False)

pytestmark = pytest.mark.slow  # four DeepSpeed launches


def _weights(folder: str | Path) -> dict[str, torch.Tensor]:
    return load_file(str(Path(folder) / "model.safetensors"))


def _parent_log_probs(model: torch.nn.Module, prompt: list[int], response: list[int]) -> list[float]:
    """log pi(token) of each response token under ``model`` (fp32), as a rollout engine records it."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0].float()
    log_probs = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
    return log_probs.gather(1, torch.tensor(response)[:, None])[:, 0].tolist()


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("offpolicy")
    tok = build_tokenizer()
    model = build_random_model(tok, seed=0, num_layers=2, hidden_size=32, num_heads=2)
    parent = save_checkpoint(model, tok, root / "ck3", step=PARENT_STEP, produced_by="import",
                             parent_checkpoint_id=None, inputs={"kind": "test"})
    vocab = json.loads((parent / "config.json").read_text())["vocab_size"]
    fresh = random_batch(1, 8, vocab=vocab)
    for r in fresh:
        r["policy_version"] = PARENT_STEP
    mixed = random_batch(2, 8, vocab=vocab, prefix="m")
    for i, r in enumerate(mixed):
        r["policy_version"] = PARENT_STEP - 2 if i % 2 == 0 else PARENT_STEP
        if i % 2 == 0:
            # The old policy's recorded log-probs, far from the parent's (~ -log 25 on the tiny
            # vocabulary) on both sides: ratios ~e^2.7 (capped at 2) and ~e^-2.3.
            r["rollout_log_probs"] = [-6.0 if t % 2 == 0 else -1.0 for t in range(len(r["response_token_ids"]))]
        else:
            # On-policy: what an engine holding the parent's weights records.
            r["rollout_log_probs"] = _parent_log_probs(model, r["prompt_token_ids"], r["response_token_ids"])
    return {"root": root, "parent": parent, "vocab": vocab,
            "fresh": write_scored(root / "fresh.parquet", fresh),
            "mixed": write_scored(root / "mixed.parquet", mixed)}


def _run(setup: dict, batch: str, mode: str):
    return train_step(setup["parent"], [setup[batch]], setup["root"] / f"{batch}-{mode}", step=PARENT_STEP + 1,
                      config=replace(CONFIG, behaviour_correction=mode))


def test_stale_samples_are_corrected_and_recorded(setup: dict) -> None:
    off, auto = _run(setup, "mixed", "off"), _run(setup, "mixed", "auto")
    a, b = _weights(off.checkpoint_dir), _weights(auto.checkpoint_dir)
    assert max(float((a[k] - b[k]).abs().max()) for k in a) > 1e-4  # the correction changed the update
    m = auto.metrics
    assert m["policy_lag_max"] == 2 and m["policy_lag_mean"] == pytest.approx(1.0)
    assert m["stale_sample_fraction"] == pytest.approx(0.5)
    # Weights far from 1 on the stale samples, some truncated at the cap; fresh ones count 1.
    assert m["behaviour_weight_mean"] != pytest.approx(1.0, abs=1e-3)
    assert 0 < m["behaviour_weight_mean"] <= CONFIG.behaviour_weight_cap
    assert 0 < m["behaviour_weight_capped_fraction"] < 1
    assert 0 < m["logprob_mismatch_mean_abs"] <= m["logprob_mismatch_max_abs"]
    # The engine/trainer mismatch on the on-policy samples alone: the parent's own log-probs were
    # recorded, so ~0, where the stale samples' policy change puts the overall one above 1.
    assert m["logprob_mismatch_max_abs"] > 1
    assert m["logprob_mismatch_on_policy_max_abs"] < 1e-4
    assert 0 <= m["logprob_mismatch_on_policy_mean_abs"] <= m["logprob_mismatch_on_policy_max_abs"]
    # Off: the lag is still recorded, no weight is applied.
    assert off.metrics["policy_lag_max"] == 2 and math.isnan(off.metrics["behaviour_weight_mean"])
    # The published metrics shard carries the new columns (StepMetrics is strict).
    table = schemas.read_shard(Path(auto.checkpoint_dir) / METRICS_FILE, schemas.StepMetrics)
    assert table.column("policy_lag_max").to_pylist() == [2]
    assert table.column("logprob_mismatch_on_policy_max_abs").to_pylist() == [m["logprob_mismatch_on_policy_max_abs"]]


def test_on_policy_batch_is_unchanged_by_auto_correction(setup: dict) -> None:
    off, auto = _run(setup, "fresh", "off"), _run(setup, "fresh", "auto")
    a, b = _weights(off.checkpoint_dir), _weights(auto.checkpoint_dir)
    assert all(torch.equal(a[k], b[k]) for k in a)  # bitwise
    m = auto.metrics
    assert (m["policy_lag_max"], m["policy_lag_mean"], m["stale_sample_fraction"]) == (0, 0.0, 0.0)
    assert math.isnan(m["behaviour_weight_mean"]) and math.isnan(m["behaviour_weight_capped_fraction"])
    assert m["logprob_mismatch_mean_abs"] > 0  # recorded even when nothing is corrected
    # Every sample is on-policy: the on-policy mismatch is the whole batch's.
    assert m["logprob_mismatch_on_policy_mean_abs"] == m["logprob_mismatch_mean_abs"]
    assert m["logprob_mismatch_on_policy_max_abs"] == m["logprob_mismatch_max_abs"]


def test_sample_newer_than_the_parent_is_refused_before_launch(setup: dict) -> None:
    rows = random_batch(3, 4, vocab=setup["vocab"], prefix="n")
    rows[2]["policy_version"] = PARENT_STEP + 1
    shard = write_scored(setup["root"] / "newer.parquet", rows)
    with pytest.raises(TrainStepError, match=r"step 4: .*newer.parquet.*policy_version 4.*parent .*step 3"):
        train_step(setup["parent"], [shard], setup["root"] / "newer", step=PARENT_STEP + 1, config=CONFIG)
