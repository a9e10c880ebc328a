"""The run report and the ladder report opened in headless Chromium at 1280 px, as a user opens them.

On pages built from data of the shapes the driver and the ladder hand over: no horizontal page
scroll, every image loads, the headline numbers equal summary.json and sit on the first screen, no
console errors, nothing loaded from outside. Screenshots are kept under the test's tmp_path.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.browser import HEIGHT, WIDTH, browser, inspect_page
from tests.report_data import run_data
from reports.ablation import write_ablation
from workflows.config import load_config
from reports.run import write_report

REPO = Path(__file__).resolve().parents[2]


def _check_common(facts: dict) -> None:
    assert facts["scrollWidth"] <= WIDTH, f"page scrolls sideways: {facts['scrollWidth']} px wide at {WIDTH} px"
    assert facts["images"] > 0 and not facts["broken"], f"images not loaded: {facts['broken']}"
    assert not facts["console_errors"], facts["console_errors"]
    assert facts["external"] == 0, "the page loads scripts, styles or frames from elsewhere"
    assert all(o in ("auto", "scroll") for o in facts["tables"]), f"a table without its own scroll box: {facts['tables']}"


def test_run_page_in_chromium(tmp_path: Path) -> None:
    data = run_data(20)
    summary_path = tmp_path / "summary.json"
    summary_path.write_text(json.dumps(data["summary"]))
    page, _ = write_report(tmp_path / "report", title="DAPO run tiny-cpu", **data)
    summary = json.loads(summary_path.read_text())
    with browser() as drv:
        facts = inspect_page(drv, page, tmp_path / "screens" / "run.png")
    _check_common(facts)
    pos = facts["pos"]
    expected = {
        "hl-before": summary["accuracy_before"], "hl-after": summary["accuracy_after"],
        "hl-change": summary["accuracy_after"] - summary["accuracy_before"],
        "hl-pass-before": summary["pass_at_k_before"], "hl-pass-after": summary["pass_at_k_after"],
        "hl-steps": summary["steps"], "hl-steps-done": summary["steps_done"], "hl-wall": summary["wall_seconds"],
    }
    for id_, value in expected.items():
        assert id_ in pos, f"headline number {id_} is not on the page"
        assert math.isclose(float(pos[id_]["value"]), value, rel_tol=1e-9), (id_, pos[id_]["value"], value)
        assert 0 <= pos[id_]["top"] < HEIGHT, f"{id_} is below the first screen (top {pos[id_]['top']} px)"
    # what the reader sees is the rounded number: 29.0% -> 35.8%, +6.8 pts
    assert pos["hl-before"]["text"] == f"{summary['accuracy_before']:.1%}" == "29.0%"
    assert pos["hl-after"]["text"] == f"{summary['accuracy_after']:.1%}" == "35.8%"
    assert pos["hl-change"]["text"] == "+6.8 pts"
    assert pos["hl-status"]["text"] == "finished" and pos["hl-status"]["top"] < HEIGHT
    assert (tmp_path / "screens" / "run.png").stat().st_size > 10_000


def _ladder_run(seed: int, final: float, steps: int = 6) -> dict:
    data = run_data(steps, seed=seed)
    data["summary"]["accuracy_after"] = final
    data["summary"]["evals"][-1]["avg_at_k"] = final
    return {"seed": seed, "summary": data["summary"], "metrics": data["metrics"]}


@pytest.mark.parametrize("seeds", [1, 2])
def test_ladder_page_in_chromium(tmp_path: Path, seeds: int) -> None:
    base = load_config(REPO / "configs" / "ablation-tiny.yaml")
    results = [
        {"name": "naive GRPO", "settings": {"train.eps_high": 0.2},
         "runs": [_ladder_run(s, 0.30 + 0.02 * s) for s in range(seeds)]},
        {"name": "+ dynamic sampling (DAPO)", "settings": {"score.dynamic_sampling": True},
         "runs": [_ladder_run(s, 0.41 + 0.03 * s) for s in range(seeds)]},
    ]
    table, _ = write_ablation(tmp_path / "ladder", results, base=base, seconds=321.0)
    with browser() as drv:
        facts = inspect_page(drv, tmp_path / "ladder" / "index.html", tmp_path / "screens" / f"ladder-{seeds}.png")
    _check_common(facts)
    pos = facts["pos"]
    assert "ladder-table" in pos and pos["ladder-table"]["top"] < HEIGHT, "the ladder table is not on the first screen"
    for i, row in enumerate(table):
        cell = pos[f"rung-{i}-mean"]
        assert math.isclose(float(cell["value"]), row["accuracy_mean"], rel_tol=1e-9)
        assert cell["top"] < HEIGHT
        spread = pos[f"rung-{i}-ci"]["text"]
        # one seed has no spread: the page must say n/a, not "+/- 0.0%"
        assert ("n/a" in spread) == (seeds == 1), spread
    assert facts["images"] >= 3, "bar chart plus a grid of per-panel curves"
