"""The run page's records, read from a run folder, and the page written back into it.

reports/run.py draws the page from plain records; this module gathers them: scored samples from
several steps' trained batches (a mix of outcomes for the page to pick from), the files of the run
folder the page links to (relative, so any copy of the folder keeps working links), and, for
``dapo report RUN``, everything else from the folder's summary.json and StepMetrics shards, so the
page of a copied or older run folder can be drawn again with today's code.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import schemas
from reports.run import Link, write_report
from storage import outputs, run_store
from storage.run_layout import RunLayout
from storage.run_summary import read_summary, relative_to
from workflows.json_output import finite_or_none

SAMPLE_STEPS = 5  # trained batches the sample table draws from, spread over the run
SAMPLE_COLUMNS = ("rollout_id", "problem_id", "checkpoint_id", "policy_version", "generation_round", "response_text",
                  "gold_answer", "extracted_answer", "reward", "overlong_penalty", "correct", "filter_reason",
                  "response_length", "finish_reason")


def sample_steps(trained: list[int], count: int = SAMPLE_STEPS) -> list[int]:
    """Up to ``count`` of the trained steps, evenly spread from the first to the last (both kept)."""
    if len(trained) <= count:
        return list(trained)
    return sorted({trained[round(i * (len(trained) - 1) / (count - 1))] for i in range(count)})


def sample_rows(layout: RunLayout, steps: list[int]) -> list[dict[str, Any]]:
    """The scored rows of the given steps' trained batches, each with the ``step`` that trained on it;
    a step whose batch shard is gone (pruned, never written) is left out."""
    rows: list[dict[str, Any]] = []
    for step in steps:
        path = layout.batch_shard(step)
        if not run_store.exists(path):
            continue
        table = schemas.read_shard(run_store.fetch(path), schemas.ScoredRollout)
        rows += [{"step": step, **row} for row in table.select(list(SAMPLE_COLUMNS)).to_pylist()]
    return rows


def _from_page(layout: RunLayout, path: str) -> str:
    """``path`` (inside the run folder) as a link from the page in ``<run>/report/``."""
    return "../" + relative_to(path, layout.root)


def ladder_page(layout: RunLayout) -> str | None:
    """The ladder page of a rung's run folder (``<ladder>/<rung>/seed-<n>/``), when the folder is
    one: the ladder's shared run sits two levels up (workflows/ablation.py lays it out)."""
    if run_store.is_remote(layout.root):
        return None
    ladder = Path(layout.root).resolve().parent.parent
    return str(ladder / "index.html") if (ladder / "shared" / "run.json").is_file() else None


def page_links(layout: RunLayout, evals: list[dict[str, Any]], *, summary_written: bool = False) -> list[Link]:
    """The run folder's files the page links to, those that exist (``summary_written``: summary.json
    counts as existing, written right after the page)."""
    links = []
    if summary_written or run_store.exists(layout.summary):
        links.append(Link("summary.json", _from_page(layout, layout.summary)))
    if run_store.exists(layout.run_record):
        links.append(Link("run.json (the resolved config)", _from_page(layout, layout.run_record)))
    log = run_store.join(layout.root, "logs", "dapo.log")
    if run_store.exists(log):
        links.append(Link("logs/dapo.log", _from_page(layout, log)))
    links += [Link(f"step {e['step']}", _from_page(layout, layout.eval_shard(e["step"])), "evaluation shards")
              for e in evals if run_store.exists(layout.eval_shard(e["step"]))]
    ladder = ladder_page(layout)
    if ladder is not None:
        links.append(Link("the ladder page (every rung)", "../../../index.html", "ablation ladder"))
    return links


def write_run_page(layout: RunLayout, *, title: str, summary: dict[str, Any], metrics: list[dict[str, Any]],
                   evals: list[dict[str, Any]], samples: list[dict[str, Any]], final: bool) -> str:
    """Write ``<run>/report/`` (the page and its charts) with its links; returns the page (the Flyte report)."""
    links = page_links(layout, evals, summary_written=final)
    with outputs.output(layout.report_dir, folder=True) as report_dir:
        _, page = write_report(report_dir, title=title, summary=summary, metrics=metrics, evals=evals,
                               samples=samples, links=links)
    return page


def rebuild(run_dir: str) -> str:
    """Draw the page of a finished or interrupted run folder again from its records; returns the page's path."""
    layout = RunLayout(run_dir)
    summary = read_summary(run_dir)
    name = json.loads(run_store.read_text(layout.run_record))["config"]["run"]["name"]
    metrics = [finite_or_none(schemas.read_shard(run_store.fetch(layout.metrics_shard(step)), schemas.StepMetrics).to_pylist()[0])
               for step in range(1, int(summary.get("steps_done", 0)) + 1)]
    evals = [{"problems": summary.get("eval_problems"), "k": summary.get("eval_k"), **e} for e in summary.get("evals", [])]
    trained = [m["step"] for m in metrics if (m.get("trained_groups") or 0) > 0]
    write_run_page(layout, title=f"DAPO run {name}", summary=summary, metrics=metrics, evals=evals,
                   samples=sample_rows(layout, sample_steps(trained)), final=True)
    return layout.report_page
