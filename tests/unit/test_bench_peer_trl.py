"""benchmarks/peer_trl.py and its parts (issue 51): the main job's sample use read from a run folder's
shards (samples generated per sample trained, zero-signal groups per round), the work handed to
TRL, its reward, the table's arithmetic, and the user errors caught before any long work."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import peer_trl  # noqa: E402
from peer_trl_train import rewards  # noqa: E402
from sample_use import run_sample_use  # noqa: E402

CONFIG = REPO / "configs" / "tiny-cpu.yaml"


def _scored(rows: list[tuple[str, float, str]], generation_round: int) -> pa.Table:
    """A scored round's columns that sample_use reads: (problem_id, reward, filter_reason) per sample."""
    return pa.table({
        "problem_id": [r[0] for r in rows], "checkpoint_id": ["train-0001-x"] * len(rows),
        "generation_round": pa.array([generation_round] * len(rows), pa.int32()),
        "reward": pa.array([r[1] for r in rows], pa.float32()), "filter_reason": [r[2] for r in rows],
    })


def _step(run: Path, step: int, rounds: list[list[tuple[str, float, str]]], trained: int) -> None:
    folder = run / "steps" / f"step-{step:04d}"
    (folder / "rollouts").mkdir(parents=True)
    (folder / "scored").mkdir()
    for i, rows in enumerate(rounds):
        pq.write_table(pa.table({"problem_id": [r[0] for r in rows]}), folder / "rollouts" / f"round-{i:02d}.parquet")
        pq.write_table(_scored(rows, i), folder / "scored" / f"round-{i:02d}.parquet")
    pq.write_table(pa.table({"samples": pa.array([trained], pa.int64())}), folder / "metrics.parquet")


def test_sample_use_counts_generated_per_trained_and_zero_signal_groups_by_hand(tmp_path: Path) -> None:
    # G = 2. Step 1, round 0: p1 all correct (+1, +1: zero signal, filtered all_correct), p2 mixed
    # (kept); round 1: p3 both wrong but one overlong-penalised (-1, -1.5: signal by reward, yet
    # filtered all_wrong by eq. 11). 6 generated, 2 trained. Step 2 trains 4 carried samples and
    # generates none: its ratio is 0, the run's is (6 + 0) / (2 + 4) = 1.
    run = tmp_path / "run"
    _step(run, 1, [[("p1", 1.0, "all_correct"), ("p1", 1.0, "all_correct"), ("p2", 1.0, "kept"), ("p2", -1.0, "kept")],
                   [("p3", -1.0, "all_wrong"), ("p3", -1.5, "all_wrong")]], trained=2)
    _step(run, 2, [], trained=4)
    use = run_sample_use(run, 2)
    first, second = use.steps
    assert (first.generated, first.trained, first.over_generation) == (6, 2, 3.0)
    assert [(r.round, r.groups, r.zero_signal_groups, r.filtered_groups) for r in first.rounds] == [(0, 2, 1, 1), (1, 1, 0, 1)]
    assert first.rounds[0].zero_signal_share == 0.5 and first.rounds[1].filtered_share == 1.0
    assert (second.generated, second.trained, second.over_generation, second.rounds) == (0, 4, 0.0, [])
    assert (use.generated, use.trained, use.over_generation) == (6, 6, 1.0)
    assert use.zero_signal_share == pytest.approx(1 / 3)
    assert use.as_dict()["per_step"][0]["rounds"][0] == {"round": 0, "groups": 2, "zero_signal_share": 0.5,
                                                         "filtered_share": 0.5}


def test_a_step_that_trained_nothing_has_no_ratio(tmp_path: Path) -> None:
    _step(tmp_path, 1, [[("p1", 1.0, "all_correct"), ("p1", 1.0, "all_correct")]], trained=0)
    assert math.isnan(run_sample_use(tmp_path, 1).steps[0].over_generation)


@pytest.mark.parametrize(("steps", "every", "expected"), [(75, 25, [0, 25, 50, 75]), (2, 25, [0, 2]), (60, 25, [0, 25, 50, 60]),
                                                          (10, 0, [0, 10])])
def test_trl_is_scored_at_the_steps_the_main_job_evaluates(steps: int, every: int, expected: list[int]) -> None:
    assert peer_trl.eval_steps(steps, every) == expected


def test_the_work_handed_to_trl_is_the_main_jobs(tmp_path: Path) -> None:
    cfg = peer_trl.load_config(CONFIG)
    work = peer_trl.peer_work(cfg, source_run=tmp_path / "dapo-seed-3", out_dir=tmp_path / "trl", steps=75, seed=3)
    assert work.policy_dir == str(tmp_path / "dapo-seed-3" / "checkpoints" / "step-0000")
    assert work.problems_dir == str(tmp_path / "dapo-seed-3" / "curate" / "problems")
    assert work.save_steps == [25, 50, 75] and work.seed == 3
    # Issue 51's work: 64 prompts x 8 per step, 8 updates, lr 1e-4, clip 0.2/0.28, 32 tokens, L_cache 8.
    assert (work.prompts_per_step, work.samples_per_prompt, work.updates_per_step) == (64, 8, 8)
    assert (work.lr, work.eps_low, work.eps_high, work.max_response_tokens) == (1e-4, 0.2, 0.28, 32)
    assert (work.soft_overlong_punishment, work.overlong_buffer_tokens, work.weight_decay) == (True, 8, 0.0)


def test_the_trl_reward_is_the_score_stages_rule_reward_plus_soft_overlong_penalty(tmp_path: Path) -> None:
    work = peer_trl.peer_work(peer_trl.load_config(CONFIG), source_run=tmp_path, out_dir=tmp_path, steps=1, seed=0)
    # L_max 32, L_cache 8: no penalty up to 24 tokens, -(30 - 24) / 8 = -0.75 at 30, -1 from 32 on.
    got = rewards(work, ["14+18=32\nAnswer: 32", "14+18=32\nAnswer: 32", "14+18=20\nAnswer: 20", "14+18=20\nAnswer: 20"],
                  [[0] * 20, [0] * 30, [0] * 24, [0] * 32], [32, 32, 32, 32])
    assert got == pytest.approx([1.0, 0.25, -1.0, -2.0])


def test_gain_and_gain_per_minute_by_hand() -> None:
    row = peer_trl.PeerRow(run="trl", seed=0, steps=4, avg_at_k={0: 0.30, 2: 0.35, 4: 0.40}, step_seconds=[5.0, 10.0, 20.0, 25.0],
                           load={"mean": 1.0, "min": 1.0, "max": 1.0, "samples": 2}, over_generation=1.0,
                           zero_signal_share=0.25, sample_use={})
    # +10 points over 5 + 10 + 20 + 25 s = 1 minute of step time.
    assert row.gain_points == pytest.approx(10.0)
    assert row.seconds_per_step == 15.0 and row.gain_per_minute == pytest.approx(10.0)
    # To the first checkpoint (step 2): +5 points in 15 s.
    assert row.first_checkpoint == 2 and row.first_gain_per_minute == pytest.approx(20.0)
    table = peer_trl.markdown([row], "header")
    assert "| TRL | 0 | 30.0/35.0/40.0 | +10.0 | 15.00 | 10.00 | 20.00 | 1.00 | 25.0% | 1.0 (1.0-1.0) |" in table


def _args(**kw: object) -> object:
    import argparse

    return argparse.Namespace(**{"config": str(CONFIG), "set": [], "steps": 2, "only": None, **kw})


@pytest.mark.parametrize(("change", "message"), [
    ({"steps": 0}, "--steps 0"),
    ({"set": ["train.lr=-1"]}, "train.lr"),
    ({"config": "/nonexistent/peer.yaml"}, "peer.yaml"),
    ({"set": ["train.warmup_steps=5"]}, "warmup_steps=5"),
])
def test_bad_input_exits_2_with_one_line_before_any_work(change: dict, message: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        peer_trl.check_ready(_args(**change))
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err and err.count("\n") == 1


def test_a_missing_peer_virtualenv_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr(peer_trl, "PEER_PYTHON", tmp_path / "no-venv" / "bin" / "python")
    with pytest.raises(SystemExit) as exit_info:
        peer_trl.check_ready(_args())
    assert exit_info.value.code == 2 and "scripts/setup-peer.sh" in capsys.readouterr().err
    peer_trl.check_ready(_args(only="dapo"))  # the main job alone does not need TRL


PEER_CHECK = """
import json, sys
sys.path.insert(0, 'benchmarks')
import trl
from peer_trl_train import PeerWork, grpo_config
c = grpo_config(PeerWork.read(sys.argv[1]), trl)
print(json.dumps({k: getattr(c, k) for k in ('generation_batch_size', 'per_device_train_batch_size', 'steps_per_generation',
      'num_generations', 'num_iterations', 'max_steps', 'loss_type', 'beta', 'epsilon', 'epsilon_high', 'learning_rate',
      'lr_scheduler_type', 'max_completion_length', 'use_vllm')}))
"""


@pytest.mark.skipif(not peer_trl.PEER_PYTHON.exists(), reason="no .venv-peer (scripts/setup-peer.sh makes it)")
def test_trl_gets_64_groups_of_8_per_step_in_8_updates(tmp_path: Path) -> None:
    import json
    import subprocess

    work = peer_trl.peer_work(peer_trl.load_config(CONFIG), source_run=tmp_path, out_dir=tmp_path, steps=75, seed=0)
    work.write(tmp_path / "work.json")
    proc = subprocess.run([str(peer_trl.PEER_PYTHON), "-c", PEER_CHECK, str(tmp_path / "work.json")], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    # One generation batch = one step's 64 x 8 samples, trained in 8 mini-batches of 64: 600 updates for 75 steps.
    assert got == {"generation_batch_size": 512, "per_device_train_batch_size": 64, "steps_per_generation": 8,
                   "num_generations": 8, "num_iterations": 1, "max_steps": 600, "loss_type": "dapo", "beta": 0.0,
                   "epsilon": 0.2, "epsilon_high": 0.28, "learning_rate": 1e-4, "lr_scheduler_type": "constant",
                   "max_completion_length": 32, "use_vllm": False}
