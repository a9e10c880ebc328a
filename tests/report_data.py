"""Synthetic run data in the shapes workflows/driver.py hands to write_report (summary, metrics rows,
evals, samples), for the report tests: realistic values, a step with 0 generation rounds (carried
groups only, so no training accuracy), long paths and ids that would widen a careless page."""

from __future__ import annotations

import math
import random
from typing import Any

from schemas.step_stats import STEP_FIELDS


def run_data(steps: int = 20, *, seed: int = 0, run_dir: str = "/home/user/dapo/runs/tiny-cpu-20260101-120000-abcdef") -> dict[str, Any]:
    rng = random.Random(seed)
    metrics = []
    for step in range(1, steps + 1):
        rounds = 0 if step == 3 else rng.choice([1, 1, 2, 3])
        gen = rounds > 0
        metrics.append({
            "step": step, "checkpoint_id": f"ckpt-{step:04d}-{rng.getrandbits(48):012x}",
            "parent_checkpoint_id": f"ckpt-{step - 1:04d}", "loss": rng.uniform(-0.1, 0.1),
            "entropy": 0.9 - 0.01 * step + rng.uniform(-0.02, 0.02), "clip_frac_low": rng.uniform(0, 0.02),
            "clip_frac_high": rng.uniform(0, 0.005), "dual_clip_frac": 0.0, "approx_kl": rng.uniform(0, 1e-3),
            "grad_norm": rng.uniform(0.2, 2.0), "lr": 1e-6, "tokens": rng.randint(9000, 15000), "samples": 64,
            "masked_samples": rng.randint(0, 3), "reward_mean": rng.uniform(-0.5, 0.5),
            "accuracy": rng.uniform(0.2, 0.6) if gen else None,
            "response_length_mean": rng.uniform(150, 260), "truncation_ratio": rng.uniform(0, 0.1) if gen else None,
            "generation_rounds": rounds, "trained_groups": 8, "carried_groups": 8 if not gen else rng.randint(0, 3),
            "max_policy_lag_steps": 1, "verdict_timeouts": 0, "verdict_errors": 0,
            "time_rollout_s": 14.2 * rounds, "time_score_s": 1.3 * rounds, "time_train_s": rng.uniform(20, 30),
        })
    # every column the driver's rows hold (schemas.StepMetrics); what is not made up above is blank (None)
    metrics = [{**{f.name: None for f in STEP_FIELDS}, **m} for m in metrics]
    eval_steps = [0, *range(5, steps, 5), steps]
    evals = []
    for i, step in enumerate(eval_steps):
        acc = 0.2897727272727273 + 0.068 * i / (len(eval_steps) - 1)
        evals.append({"step": step, "eval_set": "gsm8k-test", "checkpoint_id": f"ckpt-{step:04d}", "problems": 88,
                      "k": 4, "k_values": [4], "input_rows": 88, "rejected_rows": {}, "avg_at_k": acc,
                      "avg_at_k_ci95_half": 0.081, "pass_at_k": min(1.0, acc + 0.21), "maj_at_k": acc + 0.02,
                      "verdict_timeouts": 0, "verdict_errors": 0, "seconds": 41.7})
    before, after = evals[0]["avg_at_k"], evals[-1]["avg_at_k"]
    summary = {
        "status": "finished", "run_dir": run_dir, "config": "configs/tiny-cpu.yaml",
        "config_digest": "9f2c4e1ab37d55e0c1f4a9b2d6e8f0a1b2c3d4e5f60718293a4b5c6d7e8f9012", "steps": steps,
        "steps_done": steps, "accuracy_before": before, "accuracy_after": after,
        "pass_at_k_before": evals[0]["pass_at_k"], "pass_at_k_after": evals[-1]["pass_at_k"],
        "eval_problems": 88, "eval_k": 4, "accuracy_change": after - before,
        "accuracy_change_ci95": [after - before - 0.052, after - before + 0.052],
        "accuracy_change_method": "paired over the 88 held-out problems (t interval of per-problem differences)",
        "evals": [{k: e[k] for k in ("step", "avg_at_k", "avg_at_k_ci95_half", "pass_at_k", "maj_at_k")} for e in evals],
        "final_checkpoint": f"{run_dir}/checkpoints/step-{steps:04d}-with-a-long-folder-name-that-does-not-wrap-by-itself",
        "problems_train": 7473, "problems_test": 88, "wall_seconds": 1234.56,
        "step_seconds": [round(m["time_rollout_s"] + m["time_score_s"] + m["time_train_s"], 2) for m in metrics],
        "report": f"{run_dir}/report/index.html",
    }
    # a mix of outcomes from several steps: right, wrong, truncated and penalised, hedged
    kinds = [("42", True, "stop", 0.0), ("41", False, "stop", 0.0), (None, False, "length", -0.5),
             ("42", True, "stop", -0.25), ("41 or 42", False, "stop", 0.0)]
    samples = [{
        "step": step, "rollout_id": f"{rng.getrandbits(64):016x}", "problem_id": f"{rng.getrandbits(64):016x}",
        "checkpoint_id": metrics[step - 2]["checkpoint_id"] if step > 1 else "ckpt-0000", "policy_version": step - 1,
        "generation_round": r, "gold_answer": 42, "extracted_answer": answer,
        "response_text": "Let me compute step by step.\n" + "x" * 400 + (f"\nAnswer: {answer}" if answer else ""),
        "reward": (1.0 if correct else -1.0) + penalty, "overlong_penalty": penalty, "correct": correct,
        "filter_reason": "kept", "response_length": 512 if finish == "length" else 212, "finish_reason": finish}
        for step in sorted({max(1, steps // 3), max(1, 2 * steps // 3), steps})
        for r, (answer, correct, finish, penalty) in enumerate(kinds)]
    assert all(math.isfinite(m["entropy"]) for m in metrics)
    return {"summary": summary, "metrics": metrics, "evals": evals, "samples": samples}
