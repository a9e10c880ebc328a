"""summary.json names its paths relative to the run folder, so a copied or moved run folder (or one
read on another machine) still points at its own checkpoint and page; readers resolve them."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from storage.run_layout import RunLayout
from workflows.config import load_config
from workflows.driver import _summary

REPO = Path(__file__).resolve().parents[2]


def _stages(layout: RunLayout) -> SimpleNamespace:
    evals = [{"step": s, "avg_at_k": a, "pass_at_k": 0.5, "maj_at_k": 0.3, "problems": 10, "k": 4}
             for s, a in ((0, 0.3), (2, 0.4))]
    return SimpleNamespace(evals=evals, metrics_rows=[{"step": 1}, {"step": 2}], checkpoint=layout.checkpoint(2),
                           started=0.0, step_seconds=[1.0, 2.0])


def test_summary_json_paths_are_relative_to_the_run_folder(tmp_path: Path) -> None:
    cfg = load_config(REPO / "configs" / "tiny-cpu.yaml")
    layout = RunLayout(str(tmp_path / "runs" / "tiny-cpu"))
    summary = _summary(cfg, layout, {"problems_train": 8, "problems_test": 10}, _stages(layout), status="running")
    assert summary["run_dir"] == "."
    assert summary["final_checkpoint"] == "checkpoints/step-0002"
    assert summary["report"] == "report/index.html"
    assert str(tmp_path) not in json.dumps(summary), "summary.json holds an absolute path"


def test_read_summary_resolves_paths_in_a_copied_folder(tmp_path: Path) -> None:
    from storage.run_summary import read_summary

    copy = tmp_path / "elsewhere" / "copy-of-run"
    copy.mkdir(parents=True)
    (copy / "summary.json").write_text(json.dumps({"run_dir": ".", "final_checkpoint": "checkpoints/step-0002",
                                                   "report": "report/index.html", "steps": 2}))
    summary = read_summary(str(copy))
    assert summary["run_dir"] == str(copy)
    assert summary["final_checkpoint"] == str(copy / "checkpoints" / "step-0002")
    assert summary["report"] == str(copy / "report" / "index.html")
    assert summary["steps"] == 2


def test_read_summary_keeps_absolute_paths_of_older_run_folders(tmp_path: Path) -> None:
    from storage.run_summary import read_summary

    (tmp_path / "summary.json").write_text(json.dumps({"run_dir": "/old/run", "final_checkpoint": "/old/run/checkpoints/step-0001"}))
    summary = read_summary(str(tmp_path))
    assert summary["run_dir"] == "/old/run" and summary["final_checkpoint"] == "/old/run/checkpoints/step-0001"
