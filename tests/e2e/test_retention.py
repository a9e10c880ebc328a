"""The tiny pipeline with a retention policy: pruned checkpoints, a resumed longer run, cache hits, verify, lineage.

``run.keep_optimizer_checkpoints=1``, ``run.keep_weights_every_steps=2``: a 2-step run prunes step 1
whole (weights and ds_state/); continued to 3 steps, it trains step 3 from the latest checkpoint
(kept whole) and prunes step 2's optimizer state (its weights stay: 2 is even). A re-run is then
all cache hits, ``dapo verify`` reports the pruned checkpoints as pruned and the run intact, and
``dapo lineage`` still walks the pruned ancestry.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from storage import checkpoints
from storage.run_layout import RunLayout
from storage.run_summary import read_summary
from cli.lineage import checkpoint_lineage
from workflows.run_records import action_records, flyte_runs

sys.path.insert(0, str(Path(__file__).parent))
from test_pipeline import DAPO, REPO, SHIPPED, _env  # noqa: E402

pytestmark = pytest.mark.slow
RETENTION = ["run.keep_optimizer_checkpoints=1", "run.keep_weights_every_steps=2"]


def _run(run_root: Path, steps: int) -> subprocess.CompletedProcess[str]:
    args = [*DAPO, "run", "--config", str(REPO / "configs" / "tiny-cpu.yaml"), "--run-root", str(run_root)]
    for item in [*SHIPPED, *RETENTION, "run.name=kept", f"run.steps={steps}"]:  # the warm-up is test_pipeline's
        args += ["--set", item]
    proc = subprocess.run(args, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"dapo run failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc


def _has(layout: RunLayout, step: int) -> tuple[bool, bool]:
    folder = Path(layout.checkpoint(step))
    return any(folder.glob("*.safetensors")), (folder / checkpoints.OPTIMIZER_STATE_DIR).is_dir()


def test_pruned_run_resumes_reruns_from_cache_verifies_and_traces(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path / "kept")
    _run(tmp_path, 2)
    assert [_has(layout, s) for s in (1, 2)] == [(False, False), (True, True)]
    proc = _run(tmp_path, 3)  # a resume for one more step, from the latest checkpoint (kept whole)
    assert "[retention] after step 3" in proc.stdout
    assert [_has(layout, s) for s in (1, 2, 3)] == [(False, False), (True, False), (True, True)]
    assert _has(layout, 0)[0]  # the step-0 policy is never pruned

    _run(tmp_path, 3)  # a re-run of the finished, pruned run
    last = [r for r in action_records(layout) if r.run_name == flyte_runs(layout)[-1] and r.cache_enabled]
    assert {r.task_name.split(".")[-1] for r in last} >= {"rollout", "score", "assemble_batch", "train", "evaluate"}
    assert all(r.cache_hit for r in last), [(r.task_name, r.cache_hit) for r in last if not r.cache_hit]

    verify = subprocess.run([*DAPO, "verify", str(layout.root)], cwd=REPO, env=_env(), capture_output=True, text=True)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert f"{layout.checkpoint(1)}: pruned by the retention policy: weights, optimizer state" in verify.stdout
    assert f"{layout.checkpoint(2)}: pruned by the retention policy: optimizer state" in verify.stdout
    assert "2 checkpoint(s) pruned by the retention policy, intact" in verify.stderr

    chain = checkpoint_lineage(layout, "3")["ancestry"]
    assert [c["step"] for c in chain] == [3, 2, 1, 0]
    assert chain[2]["checkpoint_id"] == checkpoints.read_info(layout.checkpoint(1)).checkpoint_id
    summary = read_summary(layout.root)
    assert summary["final_checkpoint"] == layout.checkpoint(3)
