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

from urllib.parse import unquote, urlparse

from storage.run_layout import RunLayout
from tests.browser import HEIGHT, PHONE_WIDTH, WIDTH, browser, inspect_page
from tests.report_data import run_data
from reports.ablation import write_ablation
from workflows.config import load_config
from reports.run import write_report
from workflows.run_page import page_links

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


def _broken_links(facts: dict) -> list[str]:
    """Links that leave the page's files (http...) or name a file that does not exist."""
    bad = []
    for href in facts["links"]:
        url = urlparse(href)
        if url.scheme != "file" or not Path(unquote(url.path)).exists():
            bad.append(href)
    return bad


def _check_fits(facts: dict, width: int) -> None:
    assert facts["scrollWidth"] <= width, f"page scrolls sideways: {facts['scrollWidth']} px wide at {width} px"
    assert not facts["cut_off"], f"cut off at the right edge at {width} px: {facts['cut_off'][:8]}"


def _run_folder_in_a_ladder(root: Path, data: dict) -> RunLayout:
    """A rung's run folder (``<ladder>/<rung>/seed-0``) holding the files the page links to."""
    (root / "ladder" / "shared").mkdir(parents=True)
    (root / "ladder" / "shared" / "run.json").write_text("{}")
    (root / "ladder" / "index.html").write_text("<!DOCTYPE html><title>ladder</title>")
    layout = RunLayout(str(root / "ladder" / "full-dapo" / "seed-0"))
    run = Path(layout.root)
    (run / "logs").mkdir(parents=True)
    (run / "logs" / "dapo.log").write_text("log\n")
    (run / "run.json").write_text("{}")
    (run / "summary.json").write_text(json.dumps(data["summary"]))
    for e in data["evals"]:
        Path(layout.eval_shard(e["step"])).parent.mkdir(parents=True, exist_ok=True)
        Path(layout.eval_shard(e["step"])).write_bytes(b"PAR1")
    for step in {s["step"] for s in data["samples"]}:
        Path(layout.batch_shard(step)).parent.mkdir(parents=True, exist_ok=True)
        Path(layout.batch_shard(step)).write_bytes(b"PAR1")
    return layout


CURVES = {"eval", "accuracy", "reward", "loss", "kl", "optimizer", "entropy", "length", "clip", "truncation", "rounds",
          "timings"}


@pytest.mark.parametrize("width", [WIDTH, PHONE_WIDTH])
def test_run_page_fits_shows_its_curves_and_links_resolve(tmp_path: Path, width: int) -> None:
    data = run_data(130)  # past one block of the steps table
    layout = _run_folder_in_a_ladder(tmp_path, data)
    links = page_links(layout, data["evals"])
    page, _ = write_report(Path(layout.report_dir), title="DAPO run tiny-cpu", links=links, **data)
    with browser(width) as drv:
        facts = inspect_page(drv, page, tmp_path / "screens" / f"run-{width}.png")
    _check_fits(facts, width)
    assert not facts["broken"] and not facts["console_errors"] and facts["external"] == 0
    assert CURVES <= set(facts["image_alts"]), f"curves missing: {CURVES - set(facts['image_alts'])}"
    assert not _broken_links(facts), _broken_links(facts)
    hrefs = " ".join(facts["links"])
    for target in ("summary.json", "run.json", "logs/dapo.log", "eval/step-0000.parquet", "ladder/index.html",
                   "steps/step-0130/batch.parquet"):
        assert target in hrefs, f"no link to {target}"
    assert "anomalies" in facts["pos"] and "wall-split" in facts["pos"]
    assert {"steps-blocks", "steps-latest"} <= set(facts["pos"]), "130 steps: the earlier 100 as block means"


@pytest.mark.parametrize("width", [WIDTH, PHONE_WIDTH])
def test_ladder_page_fits_and_links_every_rung_to_its_runs(tmp_path: Path, width: int) -> None:
    base = load_config(REPO / "configs" / "ablation-tiny.yaml")
    names = ["naive GRPO", "+ clip-higher", "+ decoupled clip", "+ token-level loss", "+ overlong shaping",
             "+ dynamic sampling (DAPO)"]
    results = [{"name": name, "slug": f"rung-{i}", "settings": {}, "runs": [_ladder_run(s, 0.3 + 0.02 * i + 0.01 * s)
                                                                          for s in range(3)]}
               for i, name in enumerate(names)]
    for r in results:
        for run in r["runs"]:
            page = tmp_path / "ladder" / r["slug"] / f"seed-{run['seed']}" / "report" / "index.html"
            page.parent.mkdir(parents=True)
            page.write_text("<!DOCTYPE html><title>run</title>")
    write_ablation(tmp_path / "ladder", results, base=base, seconds=321.0)
    with browser(width) as drv:
        facts = inspect_page(drv, tmp_path / "ladder" / "index.html", tmp_path / "screens" / f"ladder-{width}.png")
    _check_fits(facts, width)
    if width == WIDTH:
        assert not facts["tables_overflow"], "the ladder table's columns do not fit at 1280 px"
    assert len(facts["links"]) == len(names) * 3 and not _broken_links(facts), _broken_links(facts)
