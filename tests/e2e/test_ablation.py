"""The ablation ladder end to end through Flyte locally, cut down to 2 rungs x 2 seeds x 1 step.

Checks what the ladder promises beyond a single run: one shared curation and step-0 policy that
every run folder links to, rung configs that differ exactly as the ladder says, seeds that change
what is generated, lineage inside a rung's run folder, and ablation.json in ladder order.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import schemas
from storage import checkpoints
from storage.run_layout import RunLayout
from cli.lineage import checkpoint_lineage, sample_lineage, trained_samples

REPO = Path(__file__).resolve().parents[2]
SMALL = [
    "run.name=abl",
    "run.steps=1",
    # 2-term problems and the pipeline test's short warm-up: enough correct answers that dynamic
    # sampling finds informative groups (a policy at ~0% gives none, and the DAPO rung cannot train).
    "run.data=['synthetic:n=600,seed=0,min_terms=2,max_terms=2,max_operand=20,test_fraction=0.1']",
    "run.prompts_per_step=6",
    "run.prompts_per_round=9",
    "run.max_rounds=3",
    "bootstrap.min_terms=2",
    "bootstrap.max_terms=2",
    "bootstrap.max_steps=60",
    "bootstrap.eval_every_steps=30",
    "bootstrap.eval_problems=16",
    "bootstrap.require_band=false",
    "rollout.samples_per_prompt=4",
    "train.micro_batch_samples=16",
    "evaluate.samples_per_problem=2",
    "evaluate.max_problems=12",
]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ladder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ladder")
    args = [sys.executable, "-m", "cli.main", "ablate", "--config", str(REPO / "configs" / "ablation-tiny.yaml"),
            "--seeds", "0", "1", "--rungs", "0", "5", "--run-root", str(root)]
    for item in SMALL:
        args += ["--set", item]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"dapo ablate failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    assert "| naive GRPO |" in proc.stdout and "| + dynamic sampling (DAPO) |" in proc.stdout
    return root / "abl-ladder"


def test_ablation_json_lists_rungs_in_order_with_one_accuracy_per_seed(ladder_dir: Path) -> None:
    table = json.loads((ladder_dir / "ablation.json").read_text())
    assert [r["name"] for r in table] == ["naive GRPO", "+ dynamic sampling (DAPO)"]
    for row, rung in zip(table, ("0-naive-grpo", "5-dynamic-sampling"), strict=True):
        assert row["seeds"] == [0, 1]
        # each seed's figure is that rung's and seed's own final held-out avg@k, in seed order
        finals = [json.loads((ladder_dir / rung / f"seed-{s}" / "summary.json").read_text())["accuracy_after"]
                  for s in (0, 1)]
        assert row["accuracy"] == finals
    assert table[0]["config"]["train.loss_agg"] == "seq-mean-token-mean"
    assert table[1]["config"]["train.loss_agg"] == "token-mean" and table[1]["config"]["score.dynamic_sampling"]
    assert (ladder_dir / "curves.png").is_file() and (ladder_dir / "ablation.md").is_file()


def test_runs_share_one_curation_and_step0_policy(ladder_dir: Path) -> None:
    shared = RunLayout(ladder_dir / "shared")
    step0 = Path(shared.checkpoint(0)).resolve()
    assert checkpoints.is_complete(step0)
    runs = sorted(ladder_dir.glob("*/seed-*"))
    assert [f"{p.parent.name}/{p.name}" for p in runs] == [
        "0-naive-grpo/seed-0", "0-naive-grpo/seed-1", "5-dynamic-sampling/seed-0", "5-dynamic-sampling/seed-1"]
    for folder in runs:
        layout = RunLayout(folder)
        assert Path(layout.checkpoint(0)).is_symlink() and Path(layout.checkpoint(0)).resolve() == step0
        assert Path(layout.curate_dir).resolve() == Path(shared.curate_dir).resolve()
        parent = checkpoints.read_info(layout.checkpoint(1)).parent_checkpoint_id
        assert parent == checkpoints.read_info(step0).checkpoint_id
    # one warm-up only: no other step-0 checkpoint anywhere
    assert len([p for p in ladder_dir.rglob("dapo_checkpoint.json") if "step-0000" in str(p)]) == 1


def test_rung_configs_and_seeds_reach_the_runs(ladder_dir: Path) -> None:
    def config(rung: str, seed: int) -> dict:
        return json.loads((ladder_dir / rung / f"seed-{seed}" / "run.json").read_text())["config"]

    naive, dapo = config("0-naive-grpo", 0), config("5-dynamic-sampling", 1)
    assert naive["train"]["eps_high"] == 0.2 and dapo["train"]["eps_high"] == 0.28
    assert (naive["run"]["seed"], naive["train"]["seed"], dapo["run"]["seed"]) == (0, 0, 1)
    # naive GRPO: one round of exactly prompts_per_step prompts; G samples each
    rollouts = schemas.read_shard(RunLayout(ladder_dir / "0-naive-grpo" / "seed-0").rollout_shard(1, 0), schemas.Rollout)
    assert rollouts.num_rows == 6 * 4
    # another seed draws other problems
    ids = [set(schemas.read_shard(RunLayout(ladder_dir / "0-naive-grpo" / f"seed-{s}").rollout_shard(1, 0),
                                  schemas.Rollout).column("problem_id").to_pylist()) for s in (0, 1)]
    assert ids[0] != ids[1]


def test_lineage_works_inside_a_rung_run_folder(ladder_dir: Path) -> None:
    layout = RunLayout(ladder_dir / "5-dynamic-sampling" / "seed-0")
    rollout_id = trained_samples(layout, 1)[0]
    info = sample_lineage(layout, rollout_id)
    assert info["trained"]["step"] == 1 and info["problem"]["split"] == "train"
    assert [c["step"] for c in checkpoint_lineage(layout, "1")["ancestry"]] == [1, 0]


def test_report_only_rebuilds_the_same_table_from_the_runs(ladder_dir: Path) -> None:
    before = json.loads((ladder_dir / "ablation.json").read_text())
    (ladder_dir / "ablation.json").unlink()
    args = [sys.executable, "-m", "cli.main", "ablate", "--config", str(REPO / "configs" / "ablation-tiny.yaml"),
            "--seeds", "0", "1", "--rungs", "0", "5", "--run-root", str(ladder_dir.parent), "--report-only"]
    for item in SMALL:
        args += ["--set", item]
    proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    after = json.loads((ladder_dir / "ablation.json").read_text())
    assert [(r["name"], r["accuracy"]) for r in after] == [(r["name"], r["accuracy"]) for r in before]
    # a missing run is named, not skipped
    proc = subprocess.run(args[:args.index("--seeds") + 1] + ["0", "7"] + args[args.index("--rungs"):],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "seed-7: no summary.json" in proc.stderr


def _ablate(ladder_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, "-m", "cli.main", "ablate", "--config", str(REPO / "configs" / "ablation-tiny.yaml"),
            "--seeds", "0", "1", "--rungs", "0", "5", "--run-root", str(ladder_dir.parent)]
    for item in [*SMALL, *extra]:
        args += ["--set", item]
    return subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=300)


def test_a_changed_config_into_the_ladder_is_refused_before_any_work(ladder_dir: Path) -> None:
    before = {p: p.stat().st_mtime_ns for p in ladder_dir.rglob("*.json")}
    proc = _ablate(ladder_dir, "train.lr=2e-4")
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = proc.stderr.strip()
    assert len(line.splitlines()) == 1, line
    assert line.startswith("dapo ablate: run folder ") and "train.lr 0.0001 -> 0.0002" in line, line
    assert {p: p.stat().st_mtime_ns for p in ladder_dir.rglob("*.json")} == before  # nothing rewritten


def test_a_second_ladder_driver_is_refused_while_one_holds_the_folder(ladder_dir: Path) -> None:
    from workflows.run_binding import hold_run_folder

    with hold_run_folder(ladder_dir):
        proc = _ablate(ladder_dir)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"run folder {ladder_dir} is already in use by pid {os.getpid()}" in proc.stderr
