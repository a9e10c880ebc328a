"""Tiny ScoredRollout batches and a tiny checkpoint for the training-stage tests."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pyarrow as pa
import torch

import schemas

PROBLEM_ID = "0123456789abcdef"


def scored_row(rollout_id: str, prompt: list[int], response: list[int], advantage: float, *,
               log_probs: list[float] | None = None, loss_masked: bool = False, kept: bool = True,
               sample_index: int = 0) -> dict[str, Any]:
    """One schema-complete ScoredRollout row (fields training does not read get plain values)."""
    correct = advantage > 0
    return {
        "rollout_id": rollout_id,
        "problem_id": PROBLEM_ID,
        "sample_index": sample_index,
        "prompt_token_ids": prompt,
        "response_token_ids": response,
        "response_text": "x" * len(response),
        "rollout_log_probs": log_probs if log_probs is not None else [-1.0] * len(response),
        "response_length": len(response),
        "finish_reason": "length" if loss_masked else "stop",
        "truncated": loss_masked,
        "checkpoint_id": "bootstrap-0000-0000000000000000",
        "policy_version": 0,
        "seed": 0,
        "generation_round": 0,
        "gold_answer": 1,
        "extracted_answer": "1" if correct else "2",
        "correct": correct,
        "verdict_status": "ok",
        "rule_reward": 1.0 if correct else -1.0,
        "overlong_penalty": 0.0,
        "reward": 1.0 if correct else -1.0,
        "advantage": advantage,
        "loss_masked": loss_masked,
        "kept": kept,
        "filter_reason": "kept" if kept else "all_wrong",
        "reward_version": "test-v1",
    }


def write_scored(path: Path, rows: list[dict[str, Any]], *, validate: bool = True) -> Path:
    """Write rows as a ScoredRollout shard (``validate=False`` writes raw Parquet, for bad input)."""
    schema = schemas.arrow_schema(schemas.ScoredRollout)
    table = pa.Table.from_pylist(rows, schema=schema)
    if validate:
        schemas.write_shard(table, path, schemas.ScoredRollout)
    else:
        import pyarrow.parquet as pq

        pq.write_table(table, path)
    return path


def random_batch(seed: int, num_samples: int, *, vocab: int, prompt_len: int = 4, max_response: int = 12,
                 prefix: str = "r", masked: tuple[int, ...] = ()) -> list[dict[str, Any]]:
    """``num_samples`` rows with random tokens, lengths and +/-1 advantages (seeded)."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(num_samples):
        n_resp = int(torch.randint(3, max_response + 1, (1,), generator=g))
        prompt = torch.randint(3, vocab, (prompt_len,), generator=g).tolist()
        response = torch.randint(3, vocab, (n_resp,), generator=g).tolist()
        log_probs = (-torch.rand(n_resp, generator=g) * 3).tolist()
        advantage = 1.0 if i % 2 == 0 else -1.0
        rows.append(scored_row(f"{prefix}{seed}-{i}", prompt, response, advantage, log_probs=log_probs,
                               loss_masked=i in masked, sample_index=i % 4))
    return rows


def nan() -> float:
    return math.nan
