"""ScoredRollout rows -> padded training tensors, the batch split, and the worker's pure helpers."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import torch

from dapo_core.losses import policy_loss, policy_loss_reference
from engines.train import batch as tb
from engines.train.engine import warmup_lr_factor
from engines.train.step import backward_scale
from infra.deepspeed import build_deepspeed_config

sys.path.insert(0, str(Path(__file__).parents[1] / "integration"))
from train_fixtures import random_batch, scored_row, write_scored  # noqa: E402


def _row(rid: str, prompt: list[int], response: list[int], advantage: float, **kw) -> tb.SampleRow:
    log_probs = kw.pop("log_probs", [-0.5] * len(response))
    return tb.SampleRow(rid, tuple(prompt), tuple(response), tuple(log_probs), advantage,
                        kw.pop("loss_masked", False), "test", kw.pop("policy_version", 0))


def test_collate_lays_out_prompt_and_response_right_padded() -> None:
    rows = [
        _row("a", [7, 8], [9, 10, 11], 1.5, log_probs=[-0.1, -0.2, -0.3]),
        _row("b", [7], [12], -0.5, log_probs=[-2.0], loss_masked=True),
    ]
    batch = tb.collate(rows, pad_token_id=0)
    # L = longest prompt + response = 2 + 3 = 5; row b has 1 + 1 = 2 real tokens, then 3 pads.
    assert batch.input_ids.tolist() == [[7, 8, 9, 10, 11], [7, 12, 0, 0, 0]]
    assert batch.attention_mask.tolist() == [[True] * 5, [True, True, False, False, False]]
    assert batch.response_mask.tolist() == [[False, False, True, True, True], [False, True, False, False, False]]
    # b is overlong-filtered: its response token stays in the batch but out of the loss.
    assert batch.loss_mask.tolist() == [[False, False, True, True, True], [False] * 5]
    assert batch.advantages.tolist() == [[0, 0, 1.5, 1.5, 1.5], [0, -0.5, 0, 0, 0]]
    assert torch.allclose(batch.rollout_log_probs, torch.tensor([[0, 0, -0.1, -0.2, -0.3], [0, -2.0, 0, 0, 0]]))
    assert batch.loss_masked.tolist() == [False, True]
    assert batch.rollout_ids == ("a", "b") and batch.num_samples == 2
    assert batch.loss_tokens == 3  # only a's three response tokens count (paper eq. 12 normaliser)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 6), st.integers(1, 9), st.floats(-3, 3, width=32, allow_subnormal=False), st.booleans(),
                          st.integers(0, 4)), min_size=1, max_size=12),
       st.integers(0, 5))
def test_collate_equals_the_per_row_reference(shapes: list[tuple[int, int, float, bool, int]], pad: int) -> None:
    rows = [
        _row(f"r{i}", [10 + i + k for k in range(n_p)], [50 + i * k for k in range(n_r)], adv,
             log_probs=[-0.01 * (i + k + 1) for k in range(n_r)], loss_masked=masked, policy_version=version)
        for i, (n_p, n_r, adv, masked, version) in enumerate(shapes)
    ]
    fast, slow = tb.collate(rows, pad_token_id=pad), tb.collate_reference(rows, pad_token_id=pad)
    for field in ("input_ids", "attention_mask", "response_mask", "loss_mask", "advantages", "rollout_log_probs",
                  "loss_masked", "policy_versions"):
        a, b = getattr(fast, field), getattr(slow, field)
        assert a.dtype == b.dtype and torch.equal(a, b), field
    assert fast.rollout_ids == slow.rollout_ids


def test_select_takes_rows_and_trims_trailing_padding() -> None:
    rows = [_row("a", [1, 2], [3, 4, 5], 1.0), _row("b", [1], [6], -1.0), _row("c", [1, 2], [7], 1.0)]
    batch = tb.collate(rows, pad_token_id=0)
    sub = tb.select(batch, [2, 1])
    # c has 3 real tokens, b has 2: width 3 (the 5-wide batch is trimmed).
    assert sub.input_ids.tolist() == [[1, 2, 7], [1, 6, 0]]
    assert sub.rollout_ids == ("c", "b")
    assert sub.response_mask.tolist() == [[False, False, True], [False, True, False]]
    with pytest.raises(tb.TrainBatchError, match="zero rows"):
        tb.select(batch, [])


def test_token_log_probs_matches_the_loop_reference_and_a_hand_example() -> None:
    # Vocabulary of 2; logits [0, ln 3] -> p = [1/4, 3/4]. Tokens [0, 1, 0]:
    # position 1 (token 1) uses logits at 0 -> ln(3/4); position 2 (token 0) uses logits at 1 -> ln(1/4).
    logits = torch.tensor([[[0.0, math.log(3)], [0.0, math.log(3)], [5.0, 5.0]]])
    ids = torch.tensor([[0, 1, 0]])
    got = tb.token_log_probs(logits, ids)
    assert torch.allclose(got, torch.tensor([[0.0, math.log(0.75), math.log(0.25)]]))
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 6, 11, generator=g) * 4
    ids = torch.randint(0, 11, (3, 6), generator=g)
    assert torch.allclose(tb.token_log_probs(logits, ids), tb.token_log_probs_reference(logits, ids), atol=1e-5)


def test_mini_batches_partition_the_samples_deterministically() -> None:
    parts = tb.mini_batches(10, 3, seed=4)
    # 10 = 4 + 3 + 3; every sample exactly once.
    assert [len(p) for p in parts] == [4, 3, 3]
    assert sorted(i for p in parts for i in p) == list(range(10))
    assert parts == tb.mini_batches(10, 3, seed=4)
    assert parts != tb.mini_batches(10, 3, seed=5)
    with pytest.raises(tb.TrainBatchError, match="cannot fill 3 mini-batches"):
        tb.mini_batches(2, 3, seed=0)


def test_rank_micro_batches_and_accumulation_steps() -> None:
    mini = [9, 4, 7, 1, 3]
    # 2 ranks: rank 0 takes positions 0, 2, 4 -> [9, 7, 3]; rank 1 positions 1, 3 -> [4, 1].
    assert tb.rank_micro_batches(mini, rank=0, world_size=2, micro_batch_samples=2) == [[9, 7], [3]]
    assert tb.rank_micro_batches(mini, rank=1, world_size=2, micro_batch_samples=2) == [[4, 1]]
    # Largest share ceil(5 / 2) = 3 samples -> ceil(3 / 2) = 2 micro-batches on every rank.
    assert tb.accumulation_steps([5, 4], world_size=2, micro_batch_samples=2) == 2
    # 3 ranks, 2 samples: rank 2 gets nothing and still runs 1 (zero-weight) micro-batch.
    assert tb.rank_micro_batches([0, 1], rank=2, world_size=3, micro_batch_samples=4) == []
    assert tb.accumulation_steps([2], world_size=3, micro_batch_samples=4) == 1


def test_select_rows_drops_unkept_rows_and_names_bad_ones() -> None:
    good = scored_row("g", [1, 2], [3, 4], 1.0, log_probs=[-0.1, -0.2])
    dropped = scored_row("d", [1], [3], 0.0, kept=False)
    rows = tb.select_rows([good, dropped], source="f.parquet")
    assert [r.rollout_id for r in rows] == ["g"]
    assert rows[0].origin == "f.parquet: row 0"
    bad_len = scored_row("x", [1], [3, 4], 1.0, log_probs=[-0.1])
    with pytest.raises(tb.TrainBatchError, match=r"f.parquet: row 1 \(rollout_id 'x'\): field 'rollout_log_probs' has 1 values for 2"):
        tb.select_rows([good, bad_len], source="f.parquet")
    bad_length = {**good, "rollout_id": "y", "response_length": 5}
    with pytest.raises(tb.TrainBatchError, match="'response_length' is 5 but 'response_token_ids' has 2"):
        tb.select_rows([bad_length], source="f.parquet")
    with pytest.raises(tb.TrainBatchError, match=r"row 0: missing fields \['advantage'\]"):
        tb.select_rows([{k: v for k, v in good.items() if k != "advantage"}], source="f.parquet")


def test_check_trainable_refuses_empty_and_all_masked_batches() -> None:
    with pytest.raises(tb.TrainBatchError, match="step 2: empty training batch"):
        tb.check_trainable([], step=2)
    masked = [_row("a", [1], [2], 1.0, loss_masked=True), _row("b", [1], [2], -1.0, loss_masked=True)]
    with pytest.raises(tb.TrainBatchError, match="step 2: all 2 kept samples are loss_masked"):
        tb.check_trainable(masked, step=2)
    tb.check_trainable(masked[:1] + [_row("c", [1], [2], 1.0)], step=2)


def test_load_rows_reads_shards_and_refuses_duplicate_ids(tmp_path: Path) -> None:
    rows = random_batch(3, 4, vocab=20)
    write_scored(tmp_path / "a.parquet", rows)
    loaded = tb.load_rows([tmp_path / "a.parquet"])
    assert [r.rollout_id for r in loaded] == [r["rollout_id"] for r in rows]
    assert loaded[0].response_token_ids == tuple(rows[0]["response_token_ids"])
    write_scored(tmp_path / "b.parquet", rows[:1])
    with pytest.raises(tb.TrainBatchError, match=r"b.parquet: row 0: rollout_id 'r3-0' also appears at .*a.parquet: row 0"):
        tb.load_rows([tmp_path])  # a folder: both shards
    with pytest.raises(tb.TrainBatchError, match="no such ScoredRollout shard"):
        tb.load_rows([tmp_path / "missing.parquet"])


def test_warmup_and_backward_scale() -> None:
    # Warm-up over 4 updates: lr factors 1/4, 2/4, 3/4, 1, 1 (update 0 already moves).
    assert [warmup_lr_factor(u, 4) for u in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0]
    assert warmup_lr_factor(0, 0) == 1.0
    # DeepSpeed divides by accumulation steps (3) and world size (2): undo both -> x6.
    assert backward_scale(world_size=2, accumulation_steps=3) == 6.0


def test_truncated_is_weight_on_advantages_equals_weighting_token_losses() -> None:
    """The worker applies TIS by scaling advantages; check that equals w * per-token loss."""
    g = torch.Generator().manual_seed(1)
    lp = (-torch.rand(2, 5, generator=g) * 2).requires_grad_(True)
    old = lp.detach() + torch.randn(2, 5, generator=g) * 0.3
    adv = torch.tensor([[1.0] * 5, [-1.0] * 5])
    mask = torch.rand(2, 5, generator=g) > 0.2
    weight = torch.rand(2, 5, generator=g) * 2 + 0.05  # any positive weight (min(ratio, cap) > 0)
    scaled, _ = policy_loss(lp, old, adv * weight, mask, dual_clip_c=3.0, total_tokens=7)
    # Per token, one at a time with the loop reference: sum_t w_t * loss_t / 7.
    expected = sum(
        float(weight[i, t]) * float(policy_loss_reference(
            lp[i:i + 1, t:t + 1], old[i:i + 1, t:t + 1], adv[i:i + 1, t:t + 1], mask[i:i + 1, t:t + 1],
            dual_clip_c=3.0, total_tokens=1).detach())
        for i in range(2) for t in range(5) if mask[i, t]
    ) / 7
    assert float(scaled) == pytest.approx(expected, rel=1e-5)


def test_deepspeed_config_fields() -> None:
    cfg = build_deepspeed_config(zero_stage=2, precision="bf16", micro_batch_samples=4, gradient_accumulation_steps=3,
                                 world_size=2, lr=1e-6, betas=(0.9, 0.999), weight_decay=0.1, adam_eps=1e-8,
                                 grad_clip_norm=1.0)
    assert cfg["train_batch_size"] == 24  # 4 * 3 * 2
    assert cfg["optimizer"] == {"type": "AdamW", "params": {"lr": 1e-6, "betas": [0.9, 0.999], "eps": 1e-8,
                                                             "weight_decay": 0.1, "torch_adam": True}}
    assert cfg["zero_optimization"]["stage"] == 2 and cfg["bf16"] == {"enabled": True}
    assert cfg["gradient_clipping"] == 1.0 and "scheduler" not in cfg
    with pytest.raises(ValueError, match="zero_stage"):
        build_deepspeed_config(zero_stage=4, precision="fp32", micro_batch_samples=1, gradient_accumulation_steps=1,
                               world_size=1, lr=1e-6, betas=(0.9, 0.999), weight_decay=0.0, adam_eps=1e-8,
                               grad_clip_norm=1.0)
    with pytest.raises(ValueError, match="precision"):
        build_deepspeed_config(zero_stage=1, precision="fp16", micro_batch_samples=1, gradient_accumulation_steps=1,
                               world_size=1, lr=1e-6, betas=(0.9, 0.999), weight_decay=0.0, adam_eps=1e-8,
                               grad_clip_norm=1.0)


def test_the_launch_hands_the_workers_the_sha256_of_what_it_validated(tmp_path: Path) -> None:
    """The train task validates the batch once; the workers skip the schema checks for those bytes only."""
    import hashlib

    from engines.train.launch import _check_batches
    from settings.train import TrainConfig

    write_scored(tmp_path / "batch.parquet", random_batch(3, 4, vocab=20))
    meta = _check_batches([(1, [tmp_path / "batch.parquet"])], TrainConfig(updates_per_step=1), parent_version=0)
    assert meta[0]["validated_sha256"] == [hashlib.sha256((tmp_path / "batch.parquet").read_bytes()).hexdigest()]
    assert tb.shard_files([tmp_path]) == [tmp_path / "batch.parquet"]
