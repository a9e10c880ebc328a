"""Tiny ScoredRollout batches and a tiny checkpoint for the training-stage tests."""

from __future__ import annotations

import math
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import torch

import schemas

PROBLEM_ID = "0123456789abcdef"
REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_single_rank(script: str, *args: str, timeout_s: float, env: dict[str, str] | None = None) -> str:
    """Run ``python -c script args`` as rank 0 of a one-rank gloo group on the CPU, from the
    repository root with one OpenMP thread; returns its stdout (the test fails on a non-zero exit)."""
    full_env = {**os.environ, "DS_ACCELERATOR": "cpu", "CUDA_VISIBLE_DEVICES": "", "RANK": "0", "LOCAL_RANK": "0",
                "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(_free_port()), "OMP_NUM_THREADS": "1",
                "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]), **(env or {})}
    proc = subprocess.run([sys.executable, "-c", script, *args], cwd=REPO, env=full_env, capture_output=True,
                          text=True, timeout=timeout_s)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc.stdout


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


def optimizer_state(checkpoint_dir: str | Path) -> dict[str, Any]:
    """The DeepSpeed optimizer + LR-scheduler state in a checkpoint's ds_state/ (all ranks' files).

    ``{"<file>": {"base": torch AdamW state (step, exp_avg, exp_avg_sq per param), "fp32": the fp32
    partitions}, "lr_scheduler": ...}``: enough to tell whether two steps continue identically.
    """
    state_dir = Path(checkpoint_dir) / "ds_state"
    tag = (state_dir / "latest").read_text().strip()
    out: dict[str, Any] = {}
    for path in sorted((state_dir / tag).glob("*optim_states.pt")):
        raw = torch.load(path, map_location="cpu", weights_only=False)["optimizer_state_dict"]
        out[path.name] = {"base": raw["base_optimizer_state"], "fp32": raw["single_partition_of_fp32_groups"]}
    model_states = torch.load(next((state_dir / tag).glob("*model_states.pt")), map_location="cpu", weights_only=False)
    out["lr_scheduler"] = model_states["lr_scheduler"]
    return out


def same_state(a: Any, b: Any, path: str = "") -> list[str]:
    """Where two nested dict/list/tensor structures differ (bitwise for tensors); [] when identical."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        ok = isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
        return [] if ok else [path]
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{path} keys {sorted(map(str, a))} != {sorted(map(str, b))}"]
        return [d for k in a for d in same_state(a[k], b[k], f"{path}/{k}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [f"{path} length {len(a)} != {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in same_state(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def assert_published_whole(checkpoint_dir: str | Path, checkpoint_id: str, parent: str | Path, *, step: int) -> Path:
    """Step ``step``'s published folder is whole: its record names this step and its parent, it holds
    every file of an HF checkpoint plus the step's metrics, timings and DeepSpeed state, and no
    staging copy is left beside it. Returns the folder."""
    from engines.train.publish import METRICS_FILE
    from engines.train.spec import DS_STATE_DIR
    from storage import checkpoints

    folder = Path(checkpoint_dir)
    info = checkpoints.read_info(folder)
    assert info.checkpoint_id == checkpoint_id and info.step == step and info.produced_by == "train"
    assert info.parent_checkpoint_id == checkpoints.read_info(parent).checkpoint_id
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "generation_config.json", METRICS_FILE, "train_timings.json"):
        assert (folder / name).is_file(), name
    assert (folder / DS_STATE_DIR / "latest").is_file()
    assert not list(folder.parent.glob(".*.staging-*"))
    return folder
