"""`dapo run` checks its input before any work (issue 45; issue 49's bootstrap typo): bad sizes,
--set text, NULs, bad paths and an unusable log file give one line and exit 2 with no run folder
left behind, and a refusal after curation leaves a folder the corrected command runs in."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "configs" / "tiny-cpu.yaml"
# The smallest run of the main job's config: curation of 200 problems, the shipped step-0 policy,
# its evaluation on 8 problems x 1 sample, no training step.
SMALL = ["run.data=[\"synthetic:n=200,seed=0,min_terms=2,max_terms=2,max_operand=30,test_fraction=0.5\"]",
         "run.steps=0", "run.prompts_per_step=4", "run.prompts_per_round=8", "evaluate.max_problems=8",
         "evaluate.samples_per_problem=1"]


def _dapo_run(run_root: Path, *sets: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "cli.main", "run", "--config", str(TINY), "--run-root", str(run_root)]
    for item in sets:
        argv += ["--set", item]
    return subprocess.run(argv, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize(("override", "named"), [
    ("rollout.samples_per_prompt=1000000000", "rollout.samples_per_prompt"),
    ("train.lr=.inf", "train.lr"),
    ("evaluate.temperature=.inf", "evaluate.temperature"),
    ("run.steps=9223372036854775808", "run.steps"),
    ("run.prompts_per_round=100000000", "run.prompts_per_round"),
    ("curate.prompt_template={problem", "curate.prompt_template"),
    ("train.lr={x:", "train.lr"),
    ("run.name=a\x01b", "run.name"),
])
def test_an_unusable_value_is_refused_in_one_line_with_no_run_folder(tmp_path: Path, override: str, named: str) -> None:
    run_root = tmp_path / "runs"
    proc = _dapo_run(run_root, *SMALL, override)
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dapo run: config error: ") and named in lines[0], proc.stderr[-3000:]
    assert not run_root.exists(), "refused after work had started"


def test_dapo_ask_bounds_its_sample_count(capsys: pytest.CaptureFixture[str]) -> None:
    from cli.main import main

    assert main(["ask", str(REPO / "assets" / "policies" / "tiny-addsub30"), "3+4", "--samples", "1000000000"]) == 2
    err = capsys.readouterr().err
    assert "samples_per_prompt=1000000000 must be in [1, 1024]" in err and "Traceback" not in err, err


def test_a_symlinked_log_file_is_refused_and_its_target_kept(tmp_path: Path) -> None:
    target = tmp_path / "precious.txt"
    target.write_text("keep me\n")
    log = tmp_path / "runs" / "tiny-cpu" / "logs" / "dapo.log"
    log.parent.mkdir(parents=True)
    log.symlink_to(target)
    proc = _dapo_run(tmp_path / "runs", *SMALL)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert len(proc.stderr.strip().splitlines()) == 1 and f"{log} is a symlink" in proc.stderr, proc.stderr[-3000:]
    assert target.read_text() == "keep me\n"


def test_a_bootstrap_source_typo_is_refused_before_curation_and_the_fix_runs(tmp_path: Path) -> None:
    """Issue 49: a typo in bootstrap.source failed after curation and left the folder bound to the bad
    path, so the corrected command was refused. Now: exit 2 in seconds, before curation, no run folder;
    the corrected command runs."""
    run_root = tmp_path / "runs"
    started = time.monotonic()
    typo = _dapo_run(run_root, *SMALL, "bootstrap.source=shipped:tiny-addsub3O")
    assert typo.returncode == 2, typo.stderr[-3000:]
    assert len(typo.stderr.strip().splitlines()) == 1 and "tiny-addsub3O" in typo.stderr, typo.stderr[-3000:]
    assert time.monotonic() - started < 60
    assert not list(run_root.glob("*/curate")) and not run_root.exists()
    missing = _dapo_run(run_root, *SMALL, f"bootstrap.source={tmp_path / 'no-such-model'}")
    assert missing.returncode == 2 and "no-such-model: not a folder" in missing.stderr, missing.stderr[-3000:]
    assert not run_root.exists()
    fixed = _dapo_run(run_root, *SMALL, "bootstrap.source=shipped:tiny-addsub30")
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    assert json.loads((run_root / "tiny-cpu" / "run.json").read_text())["config"]["bootstrap"]["source"] == "shipped:tiny-addsub30"
    # Moved, the finished run is refused in one line naming both places, not resumed into cache misses.
    moved = tmp_path / "moved"
    run_root.rename(moved)
    again = _dapo_run(moved, *SMALL)
    assert again.returncode == 2, again.stderr[-3000:]
    assert len(again.stderr.strip().splitlines()) == 1, again.stderr[-3000:]
    assert f"run folder {moved / 'tiny-cpu'} was moved or copied from {run_root / 'tiny-cpu'}" in again.stderr


def test_a_missing_data_file_is_refused_before_curation(tmp_path: Path) -> None:
    run_root = tmp_path / "runs"
    proc = _dapo_run(run_root, f"run.data=[\"{tmp_path / 'train.jsonl'}@train\", \"synthetic:n=100@test\"]")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert len(proc.stderr.strip().splitlines()) == 1 and "train.jsonl: no such file" in proc.stderr, proc.stderr[-3000:]
    assert not run_root.exists()


def test_a_refusal_after_curation_leaves_a_folder_its_own_advice_runs_in(tmp_path: Path) -> None:
    """Issue 45: the pool check after curation bound the folder, so following its advice
    (--set run.max_rounds=1) was refused again."""
    run_root = tmp_path / "runs"
    too_big = _dapo_run(run_root, *SMALL, "run.max_rounds=30")
    assert too_big.returncode == 2, too_big.stderr[-3000:]
    assert (run_root / "tiny-cpu" / "curate").is_dir()
    fixed = _dapo_run(run_root, *SMALL, "run.max_rounds=1")
    assert fixed.returncode == 0, fixed.stderr[-3000:]
