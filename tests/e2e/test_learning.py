"""The main job learns: 15 DAPO steps raise held-out accuracy above the step-0 policy's.

Replaces the end-to-end check that accuracy lies in [0, 1] (true of a broken pipeline too). The
run is the default config (configs/tiny-cpu.yaml: the shipped step-0 policy, ~1,000 held-out
problems) cut to 15 steps with held-out checks at steps 0 and 15 only, 4 samples per held-out
problem instead of 8 (the default runs 75 steps, benchmarks/RESULTS.md). Two conditions, both
needed:

- the change is at least ``MIN_GAIN`` (+4 points of avg@k), and
- its paired 95% interval over the held-out problems (summary.json ``accuracy_change_ci95``) lies
  above zero, so the gain is not the evaluation's own noise.

The control is the same run with ``train.lr=1e-12`` (no learning): the policy does not move, both
evaluations sample the same policy with the same seeds, and the change is +0.0 - the check must
reject it (``test_no_learning_is_rejected``), or it could not fail. An unmoved policy gives +0.0 after
any number of steps on any number of held-out problems, so the control runs 1 step and evaluates the
first 256 held-out problems (~15 s less than 2 steps on all ~1,000); a change that leaks into its
second evaluation (other seeds, another checkpoint) shows on 256 problems as it does on ~1,000.

Measured (commit 9b3236c, AMD EPYC Zen 4, 2 cores, quiet, 2026-11-24), with the earlier default of 32
groups a step: 30 steps went 30.1% -> 37.4% held-out avg@4 (+7.3, paired 95% interval +5.0 to +9.5) in
72 s of pipeline time (20 steps: +6.0, interval +3.7 to +8.1, too near the bar); the control 30.1% ->
30.1% (interval +0.0 to +0.0) in 31 s. With 64 groups a step (2026-11-27, Zen 5, the same samples in
half the steps): 15 steps went 30.1% -> 40.5% (+10.3, interval +8.0 to +12.7) in 45 s; both tests 91 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DAPO = [sys.executable, "-m", "cli.main"]
STEPS = 15
MIN_GAIN = 0.04  # held-out avg@k points (as a fraction) that STEPS steps must add; see the module docstring


def _run(run_root: Path, name: str, *overrides: str) -> dict:
    args = [*DAPO, "run", "--config", "configs/tiny-cpu.yaml", "--run-root", str(run_root),
            "--set", f"run.steps={STEPS}", "--set", "run.eval_every_steps=0", "--set", f"run.name={name}",
            "--set", "evaluate.samples_per_problem=4"]
    for item in overrides:
        args += ["--set", item]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=1500, check=False)
    assert proc.returncode == 0, f"dapo run failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return json.loads((run_root / name / "summary.json").read_text())


def learned(summary: dict) -> tuple[bool, str]:
    """(whether the run raised held-out accuracy by MIN_GAIN with a paired interval above 0, why)."""
    gain = summary["accuracy_after"] - summary["accuracy_before"]
    low, high = summary["accuracy_change_ci95"]
    text = (f"held-out avg@{summary['eval_k']} on {summary['eval_problems']} problems went "
            f"{summary['accuracy_before']:.1%} -> {summary['accuracy_after']:.1%} ({gain * 100:+.1f} points, paired "
            f"95% interval {low * 100:+.1f} to {high * 100:+.1f}) in {summary['steps']} steps; at least "
            f"{MIN_GAIN * 100:+.0f} with an interval above 0 expected")
    return gain >= MIN_GAIN and low > 0, text


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("learn")
    return root, _run(root, "learn")


@pytest.mark.slow
def test_fifteen_steps_raise_held_out_accuracy(trained: tuple[Path, dict]) -> None:
    _, summary = trained
    assert summary["steps"] == STEPS
    ok, text = learned(summary)
    assert ok, text


@pytest.mark.slow
def test_no_learning_is_rejected(trained: tuple[Path, dict]) -> None:
    """The control: the same shipped step-0 policy, lr ~0."""
    root, _ = trained
    summary = _run(root, "control", "train.lr=1e-12", "run.steps=1", "evaluate.max_problems=256")
    ok, text = learned(summary)
    assert not ok, f"the control (lr 1e-12) passed the learning check: {text}"
    assert abs(summary["accuracy_after"] - summary["accuracy_before"]) < 0.02, text


@pytest.mark.slow
def test_every_round_generated_from_the_weights_the_trainer_updates(trained: tuple[Path, dict]) -> None:
    """The rollout engine, kept warm across steps and given each new checkpoint by weight reload,
    samples from the same weights the trainer then updates: on the on-policy samples of every step
    the trainer's log-probs equal the engine's recorded ones to float rounding (fp32, the main job's
    dtype; 1.9e-5 at most over a whole main job, benchmarks/RESULTS.md). An engine left on an older
    policy shows there as the policy change, which the carried surplus samples show in the overall
    figure (above 1 nat on some token in this run)."""
    import math

    import schemas

    root, _ = trained
    rows = [schemas.read_shard(path, schemas.StepMetrics).to_pylist()[0]
            for path in sorted((root / "learn" / "steps").glob("step-*/metrics.parquet"))]
    assert len(rows) == STEPS
    on_policy = {row["step"]: row["logprob_mismatch_on_policy_max_abs"] for row in rows
                 if row["logprob_mismatch_on_policy_max_abs"] is not None
                 and not math.isnan(row["logprob_mismatch_on_policy_max_abs"])}
    assert len(on_policy) >= STEPS // 2, on_policy  # most steps generate; a few train on carried surplus alone
    assert max(on_policy.values()) < 1e-3, on_policy
    assert max(row["logprob_mismatch_max_abs"] for row in rows) > 1.0  # what a policy change looks like
