"""The run report: one self-contained HTML page (images inline) built from a run's summary and metrics.

First screen: the headline a user opens the page for, held-out avg@k before -> after and the change
with its 95% interval, pass@k, steps done / planned, wall time, status, config name and digest;
relative links to the run folder's records, the wall-time split, and what stands out (anomalies in
words, reports/anomalies.py). Then the curves a DAPO user reads, one SVG chart each
(reports/svg_charts.py, two abreast at 1280 px): held-out accuracy with its interval, training
accuracy and reward, loss, KL, grad norm and lr, entropy (collapse watch, sec. 3.1), response
length and truncation (sec. 3.4), clip fractions low/high (clip-higher, sec. 3.1), generation
rounds (dynamic sampling, sec. 3.2), stage timings. Then the tables, human-formatted, each
scrolling in its own box (the steps table's columns derived from the step record), and sample
generations of mixed outcomes with their lineage. The same page is written to
``<run>/report/index.html`` (the SVGs beside it too) and published as the Flyte report of the
driver task, so it loads nothing from the network. It is cheap enough (tens of milliseconds) to
redraw after steps: benchmarks/report_refresh.py measures it.
"""

from __future__ import annotations

import base64
import html
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dapo_core.answer_extraction import looks_hedged
from dapo_core.intervals import binomial_change, mean_interval
from schemas.models import STEP_KEY
from schemas.step_stats import STEP_FIELDS, StepField
from storage.run_store import write_text
from reports.anomalies import Anomaly, find_anomalies
from reports.svg_charts import HEIGHT_PX, WIDTH_PX, Series, chart


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


# ---- formatting -------------------------------------------------------------------------------

def pct(v: Any) -> str:
    """0.2897 -> '29.0%'; missing -> 'n/a'."""
    x = _num(v)
    return "n/a" if x is None else f"{x:.1%}"


def pts(v: Any) -> str:
    """A change of a fraction in percentage points: 0.068 -> '+6.8 pts'."""
    x = _num(v)
    return "n/a" if x is None else f"{x * 100:+.1f} pts"


def seconds(v: Any) -> str:
    """12.345 -> '12.3 s'; 4000 -> '1 h 06 min 40 s'."""
    x = _num(v)
    if x is None:
        return "n/a"
    if x < 60:
        return f"{x:.1f} s"
    m, s = divmod(round(x), 60)
    h, m = divmod(m, 60)
    return f"{h} h {m:02d} min {s:02d} s" if h else f"{m} min {s:02d} s"


def integer(v: Any) -> str:
    """12345 -> '12,345'."""
    x = _num(v)
    return "n/a" if x is None else f"{round(x):,}"


def decimal(digits: int) -> Callable[[Any], str]:
    def fmt(v: Any) -> str:
        x = _num(v)
        return "n/a" if x is None else f"{x:,.{digits}f}"
    return fmt


def sci(v: Any) -> str:
    x = _num(v)
    return "n/a" if x is None else f"{x:.2e}"


def general(v: Any) -> str:
    """Four significant digits: 0.012345 -> '0.01235', 1e-06 -> '1e-06'."""
    x = _num(v)
    return "n/a" if x is None else f"{x:.4g}"


def text(v: Any) -> str:
    return "" if v is None else str(v)


# ---- the headline -----------------------------------------------------------------------------

def headline(summary: dict[str, Any], metrics: list[dict[str, Any]]) -> dict[str, Any]:
    """The first-screen numbers of the page, from ``summary`` (see workflows/driver.py).

    The change's interval is the paired one over problems the driver put in ``accuracy_change_ci95``
    when it could read the eval shards, else the binomial approximation from avg@k, n and k.
    """
    before, after = _num(summary.get("accuracy_before")), _num(summary.get("accuracy_after"))
    n, k = int(summary.get("eval_problems") or 0), int(summary.get("eval_k") or 0)
    change = None if before is None or after is None else after - before
    ci = summary.get("accuracy_change_ci95")
    method = summary.get("accuracy_change_method")
    if ci is None and change is not None and n * k > 0:
        _, half = binomial_change(before, after, n, k)
        ci = [change - half, change + half]
        method = (f"binomial approximation: {n} problems x k = {k} samples as independent draws "
                  "(per-problem results were not available; too narrow when problems differ in difficulty)")
    steps_planned = int(summary.get("steps") or 0)
    steps_done = int(summary.get("steps_done", len(metrics)))
    status = str(summary.get("status", "finished"))
    if status == "running":
        step_s = [s for s in summary.get("step_seconds", []) if _num(s) is not None]
        eta = (sum(step_s) / len(step_s)) * (steps_planned - steps_done) if step_s else None
        status_text = f"running, step {steps_done}/{steps_planned}" + (f", ETA {seconds(eta)}" if eta else "")
    elif status == "failed":
        status_text = f"failed at {summary.get('failed_stage', 'an unknown stage')}"
    else:
        status_text = status
    return {
        "before": before, "after": after, "change": change, "change_ci95": ci, "change_method": method,
        "pass_before": _num(summary.get("pass_at_k_before")), "pass_after": _num(summary.get("pass_at_k_after")),
        "k": k, "problems": n, "steps_done": steps_done, "steps_planned": steps_planned,
        "wall_seconds": _num(summary.get("wall_seconds")), "status": status_text,
        "config": summary.get("config"), "config_digest": summary.get("config_digest"),
        "code_version": summary.get("code_version"),
    }


def _headline_html(h: dict[str, Any]) -> str:
    def val(id_: str, shown: str, raw: Any) -> str:
        # data-value keeps the unrounded number so a reader (or a test) can check it against summary.json
        return f"<span id='{id_}' data-value='{html.escape(repr(raw))}'>{html.escape(shown)}</span>"

    ci = h["change_ci95"]
    ci_text = "" if ci is None else f" (95% interval {pts(ci[0])} to {pts(ci[1])})"
    k = h["k"]
    digest = str(h["config_digest"] or "")
    cards = [
        f"<div class='card wide'><div class='label'>Held-out avg@{k} ({integer(h['problems'])} problems), before &rarr; after</div>"
        f"<div class='big'>{val('hl-before', pct(h['before']), h['before'])} &rarr; {val('hl-after', pct(h['after']), h['after'])}</div>"
        f"<div>change <b>{val('hl-change', pts(h['change']), h['change'])}</b>{html.escape(ci_text)}</div>"
        + (f"<div class='note'>{html.escape(h['change_method'])}</div>" if h["change_method"] else "") + "</div>",
        f"<div class='card'><div class='label'>pass@{k}</div><div class='mid'>{val('hl-pass-before', pct(h['pass_before']), h['pass_before'])}"
        f" &rarr; {val('hl-pass-after', pct(h['pass_after']), h['pass_after'])}</div></div>",
        f"<div class='card'><div class='label'>steps done / planned</div><div class='mid'>"
        f"{val('hl-steps-done', str(h['steps_done']), h['steps_done'])} / {val('hl-steps', str(h['steps_planned']), h['steps_planned'])}</div></div>",
        f"<div class='card'><div class='label'>wall time</div><div class='mid'>{val('hl-wall', seconds(h['wall_seconds']), h['wall_seconds'])}</div></div>",
        f"<div class='card'><div class='label'>status</div><div class='mid'>{val('hl-status', h['status'], h['status'])}</div></div>",
        f"<div class='card wide'><div class='label'>config</div><div><code>{html.escape(str(h['config'] or 'n/a'))}</code></div>"
        f"<div class='note'>digest <code title='{html.escape(digest)}'>{html.escape(digest[:16] or 'n/a')}</code>"
        + (f" &middot; code <code>{html.escape(str(h['code_version']))}</code>" if h["code_version"] else "") + "</div></div>",
    ]
    return "<section class='headline'>" + "".join(cards) + "</section>"


# ---- plots ------------------------------------------------------------------------------------

def _series(metrics: list[dict[str, Any]], col: str, scale: float = 1.0) -> list[float]:
    return [float("nan") if _num(m.get(col)) is None else float(m[col]) * scale for m in metrics]


def _has(metrics: list[dict[str, Any]], cols: list[str]) -> bool:
    return any(_num(m.get(c)) is not None for m in metrics for c in cols)


def no_generation_steps(metrics: list[dict[str, Any]]) -> list[int]:
    """Steps that generated nothing (0 rounds): trained on carried surplus alone, so no training accuracy."""
    return [m["step"] for m in metrics if m.get("generation_rounds") == 0]


def _line_chart(metrics: list[dict[str, Any]], title: str, y_label: str, series: list[tuple[str, str]],
                *, percent: bool = False, gaps: list[int] | None = None) -> str | None:
    if not _has(metrics, [c for c, _ in series]):
        return None
    scale = 100.0 if percent else 1.0
    return chart(title, [m["step"] for m in metrics],
                 [Series(label, _series(metrics, col, scale)) for col, label in series],
                 y_label=y_label, percent=percent, shaded_steps=gaps or (), shaded_label=_GAP_LABEL)


def _eval_chart(evals: list[dict[str, Any]]) -> str | None:
    if not evals:
        return None
    err = []
    for e in evals:
        half = e.get("avg_at_k_ci95_half")
        if half is None and e.get("problems") and e.get("k"):
            # binomial approximation when per-problem results are not at hand
            half = binomial_change(0.0, e["avg_at_k"], int(e["problems"]), int(e["k"]))[1]
        err.append(100 * half if half is not None else None)
    k = evals[-1].get("k", "k")
    return chart("Held-out accuracy (95% interval)", [e["step"] for e in evals], [
        Series(f"avg@{k}", [100 * e["avg_at_k"] for e in evals], yerr=err),
        Series(f"pass@{k}", [100 * e["pass_at_k"] for e in evals], kind="dashed"),
    ], y_label="accuracy (%)", percent=True, y_range=(0.0, 100.0))


def _rounds_chart(metrics: list[dict[str, Any]]) -> str | None:
    if not _has(metrics, ["generation_rounds"]):
        return None
    series = [Series("generation rounds", [m.get("generation_rounds") or 0 for m in metrics], kind="bar")]
    if _has(metrics, ["samples"]):
        series.append(Series("samples trained", _series(metrics, "samples"), right=True))
    return chart("Generation rounds per step (dynamic sampling)", [m["step"] for m in metrics], series,
                 y_label="rounds", right_label="samples trained")


def _optimizer_chart(metrics: list[dict[str, Any]]) -> str | None:
    """Gradient norm (before clipping) on the left axis, the learning rate on the right."""
    if not _has(metrics, ["grad_norm", "lr"]):
        return None
    return chart("Gradient norm and learning rate", [m["step"] for m in metrics],
                 [Series("grad norm", _series(metrics, "grad_norm")), Series("lr", _series(metrics, "lr"), right=True)],
                 y_label="grad norm (before clipping)", right_label="learning rate")


def _timings_chart(metrics: list[dict[str, Any]]) -> str | None:
    cols = [("time_rollout_s", "rollout"), ("time_score_s", "score"), ("time_train_s", "train")]
    if not _has(metrics, [c for c, _ in cols]):
        return None
    return chart("Stage time per step", [m["step"] for m in metrics],
                 [Series(label, [_num(m.get(col)) or 0.0 for m in metrics], kind="bar") for col, label in cols],
                 y_label="seconds")


_GAP_LABEL = "0 generation rounds (carried groups only)"


def _charts(metrics: list[dict[str, Any]], evals: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(file stem, SVG) for each chart that has data, in page order."""
    gaps = no_generation_steps(metrics)
    charts = [
        ("eval", _eval_chart(evals)),
        ("accuracy", _line_chart(metrics, "Training accuracy of generated samples", "correct (%)",
                                 [("accuracy", "accuracy")], percent=True, gaps=gaps)),
        ("reward", _line_chart(metrics, "Reward of the trained batch", "mean reward (-1 .. +1)",
                               [("reward_mean", "reward mean")])),
        ("loss", _line_chart(metrics, "Loss (DAPO objective, eq. 8)", "token-level mean", [("loss", "loss")])),
        ("kl", _line_chart(metrics, "Approximate KL(old || new) (monitoring; DAPO has no KL term)", "KL (nats)",
                           [("approx_kl", "approx KL")])),
        ("optimizer", _optimizer_chart(metrics)),
        ("entropy", _line_chart(metrics, "Policy entropy (collapse watch, sec. 3.1)", "token mean (nats)",
                                [("entropy", "entropy")])),
        ("length", _line_chart(metrics, "Response length (trained batch)", "mean length (tokens)",
                               [("response_length_mean", "mean length")])),
        ("clip", _line_chart(metrics, "Clip fractions (clip-higher, sec. 3.1)", "tokens clipped (%)",
                             [("clip_frac_low", "low side (1 - eps_low)"), ("clip_frac_high", "high side (1 + eps_high)")],
                             percent=True)),
        ("truncation", _line_chart(metrics, "Truncated responses (generated, sec. 3.4)", "hit the token cap (%)",
                                   [("truncation_ratio", "truncated")], percent=True, gaps=gaps)),
        ("rounds", _rounds_chart(metrics)),
        ("timings", _timings_chart(metrics)),
    ]
    return [(stem, svg) for stem, svg in charts if svg is not None]


def write_plots(metrics: list[dict[str, Any]], evals: list[dict[str, Any]], out_dir: Path) -> list[tuple[Path, bytes]]:
    """One SVG per chart that has data, written to ``out_dir``; returns (file, SVG bytes) pairs."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[tuple[Path, bytes]] = []
    for stem, svg in _charts(metrics, evals):
        path = out_dir / f"{stem}.svg"
        write_text(path, svg)
        written.append((path, svg.encode()))
    return written


# ---- tables -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Column:
    """One table column: the record's key, its heading, its group heading and how a value reads."""

    key: str
    label: str
    group: str
    fmt: Callable[[Any], str]


def _field_format(field: StepField) -> Callable[[Any], str]:
    """How a step statistic reads, from its declared unit and type (schemas/models.py: UNITS)."""
    if field.unit == "fraction":
        return pct
    if field.unit == "s":
        return seconds
    if field.python_type is int:
        return integer
    return general if field.python_type is float else text


def step_columns(fields: Sequence[StepField] = STEP_FIELDS) -> list[Column]:
    """The steps table's columns: the step, then every statistic the step record declares, in its
    order, labelled by its name and grouped by its tracker group. Nothing here names a metric, so a
    new one reaches the table by its declaration alone."""
    stats = [Column(f.name, f.name.replace("_", " "), f.group, _field_format(f)) for f in fields if f.by != STEP_KEY]
    return [Column("step", "step", "", integer), *stats]


def _group_header(cols: list[Column]) -> str:
    """One heading cell per run of columns of the same group (the tracker panel's name)."""
    cells: list[tuple[str, int]] = []
    for c in cols:
        if cells and cells[-1][0] == c.group:
            cells[-1] = (c.group, cells[-1][1] + 1)
        else:
            cells.append((c.group, 1))
    return "".join(f"<th colspan='{n}' class='group'>{html.escape(g.replace('_', ' '))}</th>" for g, n in cells)


def _table(rows: list[dict[str, Any]], columns: list[Column], id_: str, *, groups: bool = False) -> str:
    cols = [c for c in columns if any(c.key in r for r in rows)]
    head = "".join(f"<th>{html.escape(c.label)}</th>" for c in cols)
    group_row = f"<tr>{_group_header(cols)}</tr>" if groups else ""
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c.fmt(r.get(c.key)))}</td>" for c in cols) + "</tr>" for r in rows
    )
    return (f"<div class='scroll'><table id='{id_}'><thead>{group_row}<tr>{head}</tr></thead>"
            f"<tbody>{body}</tbody></table></div>")


def steps_table(rows: list[dict[str, Any]], fields: Sequence[StepField] = STEP_FIELDS, id_: str = "steps") -> str:
    """The steps table of ``rows`` (StepMetrics rows), its columns from ``fields``."""
    return _table(rows, step_columns(fields), id_, groups=True)


PAGE_STEPS = 100  # past this many steps, earlier steps are summarised a block of this many to a row


def _block_means(block: list[dict[str, Any]], columns: list[Column]) -> dict[str, Any]:
    """One row standing for a block of steps: the mean of each numeric column over the block."""
    row: dict[str, Any] = {"step": f"{block[0]['step']}-{block[-1]['step']}"}
    for c in columns[1:]:
        values = [x for x in (_num(r.get(c.key)) for r in block) if x is not None]
        row[c.key] = sum(values) / len(values) if values else None
    return row


def _steps_section(metrics: list[dict[str, Any]]) -> str:
    """The steps table; past ``PAGE_STEPS`` steps, the earlier ones as one row of block means per
    ``PAGE_STEPS`` steps (folded) and the latest block in full, so the page stays short and quick to
    redraw at 1,000 steps. Every step's row is in its steps/step-NNNN/metrics.parquet."""
    if len(metrics) <= PAGE_STEPS:
        return steps_table(metrics)
    cut = (len(metrics) - 1) // PAGE_STEPS * PAGE_STEPS
    earlier, latest = metrics[:cut], metrics[cut:]
    columns = step_columns()
    means = [_block_means(earlier[i:i + PAGE_STEPS], columns) for i in range(0, len(earlier), PAGE_STEPS)]
    summary_columns = [Column("step", "steps", "", text), *columns[1:]]
    return (f"<p class='note'>{len(metrics):,} steps: the latest {len(latest)} below, row by row; the earlier ones "
            f"as the mean of each block of {PAGE_STEPS} (every step's row: steps/step-NNNN/metrics.parquet).</p>"
            f"<details><summary>steps {earlier[0]['step']}-{earlier[-1]['step']}: block means</summary>"
            f"{_table(means, summary_columns, 'steps-blocks', groups=True)}</details>"
            f"{steps_table(latest, id_='steps-latest')}")


_EVAL_COLUMNS: list[Column] = [
    Column("step", "step", "", integer),
    Column("avg_at_k", "avg@k", "", pct),
    Column("pass_at_k", "pass@k", "", pct),
    Column("maj_at_k", "maj@k", "", pct),
    Column("problems", "problems", "", integer),
    Column("k", "k", "", integer),
    Column("verdict_timeouts", "verdict timeouts", "", integer),
    Column("checkpoint_id", "checkpoint", "", text),
    Column("seconds", "time", "", seconds),
]


def _details_table(summary: dict[str, Any]) -> str:
    rows = [
        ("final checkpoint", summary.get("final_checkpoint")),
        ("config", summary.get("config")), ("config digest", summary.get("config_digest")),
        ("training problems", integer(summary.get("problems_train"))),
        ("held-out problems", integer(summary.get("problems_test"))),
    ]
    body = "".join(f"<tr><th>{k}</th><td class='path'>{html.escape(text(v))}</td></tr>" for k, v in rows if v is not None)
    return f"<div class='scroll'><table class='kv'>{body}</table></div>"


# ---- links, wall time, anomalies --------------------------------------------------------------

@dataclass(frozen=True)
class Link:
    """A file beside the page, linked relatively (the page opens from disk, in any copy of the run)."""

    label: str
    href: str  # relative to the page's folder (<run>/report/)
    group: str = "run"  # the line of the links bar it goes on


def _links_html(links: Sequence[Link]) -> str:
    if not links:
        return ""
    groups: dict[str, list[Link]] = {}
    for link in links:
        groups.setdefault(link.group, []).append(link)
    lines = "".join(
        f"<div><span class='label'>{html.escape(group)}:</span> "
        + " &middot; ".join(f"<a href='{html.escape(link.href)}'>{html.escape(link.label)}</a>" for link in items) + "</div>"
        for group, items in groups.items())
    return f"<nav class='links' id='links'>{lines}</nav>"


@dataclass(frozen=True)
class WallSplit:
    """Where the run's wall time went: the training steps, the evaluations, and the rest (curation,
    the step-0 policy, worker start, reports). None where the summary does not say."""

    wall_s: float | None
    steps_s: float | None
    evals_s: float | None
    rest_s: float | None


def wall_split(summary: dict[str, Any], evals: list[dict[str, Any]]) -> WallSplit:
    """The split from summary.json (``wall_seconds``, ``step_seconds``) and the evaluations' own times.
    The step times exclude the evaluations (the driver evaluates after it stops a step's clock)."""
    wall = _num(summary.get("wall_seconds"))
    step_s = [_num(x) for x in summary.get("step_seconds") or []]
    steps = sum(x for x in step_s if x is not None) if step_s else None
    eval_s = [_num(e.get("seconds")) for e in evals]
    evals_total = sum(x for x in eval_s if x is not None) if eval_s and all(x is not None for x in eval_s) else None
    rest = None if wall is None or steps is None else max(0.0, wall - steps - (evals_total or 0.0))
    return WallSplit(wall, steps, evals_total, rest)


def _wall_html(split: WallSplit) -> str:
    if split.wall_s is None or split.wall_s <= 0:
        return ""
    rest = ("the rest (curation, step-0 policy, worker start, reports)" if split.evals_s is not None else
            "the rest (evaluations included: this summary.json has no evaluation times)")
    parts = [("steps", split.steps_s, "#4c72b0"), ("evaluations", split.evals_s, "#dd8452"), (rest, split.rest_s, "#bbbbbb")]
    shown = [(label, x, c) for label, x, c in parts if x is not None]
    words = " + ".join(f"{label} {seconds(x)} ({x / split.wall_s:.0%})" for label, x, _ in shown)
    bar = "".join(f"<div style='width:{100 * x / split.wall_s:.2f}%;background:{c}' title='{html.escape(label)}'></div>"
                  for label, x, c in shown)
    return (f"<div id='wall-split'><div>Wall time {seconds(split.wall_s)} = {html.escape(words)}</div>"
            f"<div class='bar'>{bar}</div></div>")


def _anomalies_html(found: list[Anomaly]) -> str:
    if not found:
        return "<p class='note' id='anomalies'>Nothing stands out: no slow step, entropy collapse, reward or length jump, " \
               "or step trained only on carried groups.</p>"
    items = "".join(f"<li><b>{html.escape(a.kind)}</b>: {html.escape(a.text)}</li>" for a in found)
    return f"<ul id='anomalies' class='anomalies'>{items}</ul>"


# ---- sample generations -----------------------------------------------------------------------

OUTCOMES = ("wrong", "truncated", "penalised", "hedged", "right")  # the order a mix is picked in


def outcome_tags(sample: dict[str, Any]) -> tuple[str, ...]:
    """What happened to one scored sample: right or wrong, and truncated (hit the token cap),
    penalised (soft overlong punishment, sec. 3.4), hedged (its answer offers several values)."""
    tags = ["right" if sample.get("correct") else "wrong"]
    if sample.get("finish_reason") == "length":
        tags.append("truncated")
    if (_num(sample.get("overlong_penalty")) or 0.0) < 0:
        tags.append("penalised")
    answer = sample.get("extracted_answer")
    if isinstance(answer, str) and answer and looks_hedged(answer):
        tags.append("hedged")
    return tuple(tags)


def pick_samples(rows: list[dict[str, Any]], count: int = 8) -> list[dict[str, Any]]:
    """Up to ``count`` samples with mixed outcomes from as many steps as possible: each round takes
    one sample of each outcome in :data:`OUTCOMES` that any row has, from the step used least so far.
    Returned in step order; ``rows`` need a ``step`` key (the step that trained on them)."""
    tagged = [(i, outcome_tags(r)) for i, r in enumerate(rows)]
    taken: set[int] = set()
    per_step: Counter[Any] = Counter()
    while len(taken) < count:
        before = len(taken)
        for outcome in OUTCOMES:
            free = [i for i, tags in tagged if outcome in tags and i not in taken]
            if free and len(taken) < count:
                best = min(free, key=lambda i: per_step[rows[i].get("step")])
                taken.add(best)
                per_step[rows[best].get("step")] += 1
        if len(taken) == before:
            break
    return [rows[i] for i in sorted(taken, key=lambda i: (rows[i].get("step") or 0, i))]


def _samples_html(samples: list[dict[str, Any]]) -> str:
    intro = ("<p class='note'>A mix of outcomes from several steps' trained batches. <code>RUN</code> is this run's "
             "folder (the one holding <code>report/</code> and <code>summary.json</code>); each row's lineage command "
             "traces it to its prompt, checkpoint, seed and reward version, and its step links to the batch shard "
             "that holds it.</p>")
    head = ("<tr><th>step</th><th>outcome</th><th>problem</th><th>gold</th><th>answer</th><th>reward</th>"
            "<th>length</th><th class='text'>response</th><th>lineage</th></tr>")
    rows = []
    for s in samples:
        step = s.get("step")
        rid = text(s.get("rollout_id")) or "n/a"
        response = text(s.get("response_text"))
        step_cell = (f"<a href='../steps/step-{int(step):04d}/batch.parquet'>{int(step)}</a>"
                     if isinstance(step, int) else "")
        rows.append(
            f"<tr id='sample-{html.escape(rid)}'><td>{step_cell}</td>"
            f"<td>{html.escape(', '.join(outcome_tags(s)))}</td><td><code>{html.escape(text(s.get('problem_id')))}</code></td>"
            f"<td>{html.escape(text(s.get('gold_answer')))}</td><td>{html.escape(text(s.get('extracted_answer')) or '(none)')}</td>"
            f"<td>{decimal(2)(s.get('reward'))}</td>"
            f"<td>{integer(s.get('response_length'))} ({html.escape(text(s.get('finish_reason')))})</td>"
            f"<td class='text'><details><summary>{html.escape(response[:48])}{'&hellip;' if len(response) > 48 else ''}"
            f"</summary><pre>{html.escape(response)}</pre></details></td>"
            f"<td class='cmd'><code>dapo lineage RUN --sample {html.escape(rid)}</code></td></tr>"
        )
    return f"{intro}<div class='scroll'><table id='samples'><thead>{head}</thead><tbody>{''.join(rows)}</tbody></table></div>"


_STYLE = (
    "*{box-sizing:border-box}"
    "body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:0 auto;padding:12px 16px;max-width:1240px;color:#222}"
    "h1{font-size:22px;margin:4px 0 10px;overflow-wrap:anywhere}h2{font-size:17px;margin:18px 0 6px}"
    ".headline{display:flex;flex-wrap:wrap;gap:8px}"
    ".card{border:1px solid #d6d6d6;border-radius:6px;padding:6px 12px;flex:0 1 auto;min-width:150px}"
    ".card.wide{flex:1 1 380px}.label{font-size:12px;color:#666}.big{font-size:30px;font-weight:600}"
    ".mid{font-size:20px;font-weight:600}.note{font-size:12px;color:#555}"
    ".links{font-size:13px;margin:8px 0;overflow-wrap:anywhere}.links div{margin:2px 0}"
    "#wall-split{font-size:13px;margin:8px 0}.bar{display:flex;height:12px;border:1px solid #ccc;margin-top:3px}"
    ".anomalies{font-size:13px;margin:6px 0;padding-left:20px}.anomalies li{margin:2px 0}"
    ".grid{display:flex;flex-wrap:wrap;gap:8px}.grid img{max-width:100%;height:auto;border:1px solid #eee}"
    ".scroll{overflow-x:auto;max-width:100%}"
    "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ddd;padding:3px 8px;text-align:right;white-space:nowrap}"
    "th{background:#f4f4f4}th.group{background:#e8ecf3;text-align:center}table.kv th{text-align:left}"
    "td.path{text-align:left;white-space:normal;overflow-wrap:anywhere}"
    "td.text{text-align:left;white-space:normal;min-width:200px;max-width:380px}summary{cursor:pointer}"
    "td.cmd{text-align:left;white-space:normal;min-width:190px;max-width:260px}"
    "code{overflow-wrap:anywhere}pre{white-space:pre-wrap;overflow-wrap:anywhere;background:#f6f6f6;padding:6px;font-size:12px}"
)


def render_html(
    *,
    title: str,
    summary: dict[str, Any],
    metrics: list[dict[str, Any]],
    evals: list[dict[str, Any]],
    samples: list[dict[str, Any]],
    plots: list[tuple[Path, bytes]],
    links: Sequence[Link] = (),
) -> str:
    """The report page, self-contained (SVG charts as data URIs; no scripts, fonts or network).

    ``samples``: scored rows (with the ``step`` that trained on them) to pick a mix of outcomes
    from; ``links``: files of the run folder to link, relative to the page."""
    h = headline(summary, metrics)
    parts = [
        f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<meta name='viewport' content='width=device-width'><style>{_STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        _headline_html(h),
        _links_html(links),
        _wall_html(wall_split(summary, evals)),
        "<h2>What stands out</h2>",
        _anomalies_html(find_anomalies(metrics, summary.get("step_seconds") or [])),
        "<h2>Curves</h2>",
    ]
    gaps = no_generation_steps(metrics)
    if gaps:
        parts.append(
            f"<p class='note'>Step{'s' if len(gaps) > 1 else ''} {', '.join(map(str, gaps))} generated nothing "
            "(0 generation rounds: groups carried over from earlier rounds filled the batch), so training "
            "accuracy and truncation have no value there: the gap (shaded) is not missing data.</p>"
        )
    parts.append("<div class='grid'>" + "".join(
        f"<img src='data:image/svg+xml;base64,{base64.b64encode(svg).decode()}' alt='{path.stem}' "
        f"width='{WIDTH_PX}' height='{HEIGHT_PX}'>" for path, svg in plots
    ) + "</div>")
    if evals:
        parts.append("<h2>Evaluations</h2>" + _table(evals, _EVAL_COLUMNS, "evals"))
    parts.append("<h2>Steps</h2>" + _steps_section(metrics))
    parts.append("<h2>Run</h2>" + _details_table(summary))
    picked = pick_samples(samples)
    if picked:
        parts.append("<h2>Sample generations</h2>" + _samples_html(picked))
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(
    out_dir: Path,
    *,
    title: str,
    summary: dict[str, Any],
    metrics: list[dict[str, Any]],
    evals: list[dict[str, Any]],
    samples: list[dict[str, Any]],
    links: Sequence[Link] = (),
) -> tuple[Path, str]:
    """Write the SVG charts and ``index.html`` (each atomically: temp file then rename).

    Returns the page's path and the page (self-contained, also the Flyte report).
    """
    plots = write_plots(metrics, evals, out_dir)
    page = render_html(title=title, summary=summary, metrics=metrics, evals=evals, samples=samples, plots=plots,
                       links=links)
    target = out_dir / "index.html"
    write_text(target, page)
    return target, page


def eval_interval(per_problem_avg: list[float]) -> float | None:
    """95% half-width of a held-out avg@k from its per-problem values (t over problems)."""
    return mean_interval(per_problem_avg)[1] if per_problem_avg else None
