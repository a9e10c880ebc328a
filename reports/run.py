"""The run report: one self-contained HTML page (images inline) built from a run's summary and metrics.

First screen: the headline a user opens the page for, held-out avg@k before -> after and the change
with its 95% interval, pass@k, steps done / planned, wall time, status, config name and digest.
Then the curves a DAPO user reads, one SVG chart each (reports/svg_charts.py, two abreast at 1280 px):
held-out accuracy with its interval, training accuracy and reward, entropy (collapse watch,
sec. 3.1), response length and truncation (sec. 3.4), clip fractions low/high (clip-higher,
sec. 3.1), generation rounds (dynamic sampling, sec. 3.2), stage timings. Then the tables,
human-formatted, each scrolling in its own box, and sample responses with their lineage. The same
page is written to ``<run>/report/index.html`` (the SVGs beside it too) and published as the Flyte
report of the driver task, so it loads nothing from the network. It is cheap enough (tens of
milliseconds) to redraw after every step: benchmarks/report_refresh.py measures it.
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dapo_core.intervals import binomial_change, mean_interval
from schemas.step_stats import STEP_FIELDS
from storage.run_store import write_text
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

_STEP_COLUMNS: list[tuple[str, str, Callable[[Any], str]]] = [
    ("step", "step", integer),
    ("generation_rounds", "rounds", integer),
    ("samples", "samples trained", integer),
    ("trained_groups", "groups", integer),
    ("carried_groups", "carried groups", integer),
    ("accuracy", "train accuracy", pct),
    ("reward_mean", "reward", decimal(3)),
    ("entropy", "entropy (nats)", decimal(3)),
    ("response_length_mean", "length (tokens)", decimal(1)),
    ("truncation_ratio", "truncated", pct),
    ("clip_frac_low", "clip low", pct),
    ("clip_frac_high", "clip high", pct),
    ("grad_norm", "grad norm", decimal(3)),
    ("lr", "lr", sci),
    ("tokens", "tokens", integer),
    ("verdict_timeouts", "verdict timeouts", integer),
    ("time_rollout_s", "rollout", seconds),
    ("time_score_s", "score", seconds),
    ("time_train_s", "train", seconds),
]


def _unknown_step_columns(columns: list[tuple[str, str, Callable[[Any], str]]]) -> list[str]:
    """The table's column keys that are no field of the step record (schemas.StepStats)."""
    known = {f.name for f in STEP_FIELDS}
    return [key for key, _, _ in columns if key not in known]


# The steps table shows a chosen subset of the step record's fields, labelled and formatted for a
# reader; its keys are the record's names (checked here, at import, so a renamed or removed metric
# fails loudly instead of leaving an empty column).
if _unknown_step_columns(_STEP_COLUMNS):
    raise ImportError(f"reports/run.py: steps table columns not in StepMetrics: {_unknown_step_columns(_STEP_COLUMNS)}")

_EVAL_COLUMNS: list[tuple[str, str, Callable[[Any], str]]] = [
    ("step", "step", integer),
    ("avg_at_k", "avg@k", pct),
    ("pass_at_k", "pass@k", pct),
    ("maj_at_k", "maj@k", pct),
    ("problems", "problems", integer),
    ("k", "k", integer),
    ("verdict_timeouts", "verdict timeouts", integer),
    ("checkpoint_id", "checkpoint", text),
    ("seconds", "time", seconds),
]


def _table(rows: list[dict[str, Any]], columns: list[tuple[str, str, Callable[[Any], str]]], id_: str) -> str:
    cols = [c for c in columns if any(c[0] in r for r in rows)]
    head = "".join(f"<th>{html.escape(label)}</th>" for _, label, _ in cols)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(fmt(r.get(key)))}</td>" for key, _, fmt in cols) + "</tr>" for r in rows
    )
    return f"<div class='scroll'><table id='{id_}'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"


def _details_table(summary: dict[str, Any]) -> str:
    rows = [
        ("run folder", summary.get("run_dir")), ("final checkpoint", summary.get("final_checkpoint")),
        ("config", summary.get("config")), ("config digest", summary.get("config_digest")),
        ("training problems", integer(summary.get("problems_train"))),
        ("held-out problems", integer(summary.get("problems_test"))),
    ]
    body = "".join(f"<tr><th>{k}</th><td class='path'>{html.escape(text(v))}</td></tr>" for k, v in rows if v is not None)
    return f"<div class='scroll'><table class='kv'>{body}</table></div>"


def _samples_html(samples: list[dict[str, Any]], run_dir: str) -> str:
    parts = [
        "<p>Each sample names its lineage: the rollout id, problem, checkpoint that generated it and the "
        "generation round. Trace one to its prompt, seed and reward version with "
        f"<code>dapo lineage {html.escape(run_dir)} --sample ROLLOUT_ID</code>; list the samples any step "
        f"trained on with <code>dapo lineage {html.escape(run_dir)} --step N</code>.</p>"
    ]
    for s in samples:
        rid = text(s.get("rollout_id")) or "n/a"
        verdict = "correct" if s.get("correct") else "incorrect"
        lineage = [
            ("rollout", rid), ("problem", text(s.get("problem_id"))), ("checkpoint", text(s.get("checkpoint_id"))),
            ("policy step", text(s.get("policy_version"))), ("round", text(s.get("generation_round"))),
            ("verdict", f"{verdict}, reward {decimal(2)(s.get('reward'))}"), ("filter", text(s.get("filter_reason"))),
            ("length", f"{integer(s.get('response_length'))} tokens, {text(s.get('finish_reason'))}"),
        ]
        fields = " &middot; ".join(f"{k} <code>{html.escape(v)}</code>" for k, v in lineage if v)
        cmd = f"dapo lineage {run_dir} --sample {rid}"
        parts.append(
            f"<div class='sample' id='sample-{html.escape(rid)}'><div>{fields}</div>"
            f"<div class='note'>lineage: <code>{html.escape(cmd)}</code></div>"
            f"<pre>{html.escape(text(s.get('response_text')))}</pre></div>"
        )
    return "".join(parts)


_STYLE = (
    "*{box-sizing:border-box}"
    "body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:0 auto;padding:12px 16px;max-width:1240px;color:#222}"
    "h1{font-size:22px;margin:4px 0 10px}h2{font-size:17px;margin:18px 0 6px}"
    ".headline{display:flex;flex-wrap:wrap;gap:8px}"
    ".card{border:1px solid #d6d6d6;border-radius:6px;padding:6px 12px;flex:0 1 auto;min-width:150px}"
    ".card.wide{flex:1 1 380px}.label{font-size:12px;color:#666}.big{font-size:30px;font-weight:600}"
    ".mid{font-size:20px;font-weight:600}.note{font-size:12px;color:#555}"
    ".grid{display:flex;flex-wrap:wrap;gap:8px}.grid img{max-width:100%;height:auto;border:1px solid #eee}"
    ".scroll{overflow-x:auto;max-width:100%}"
    "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ddd;padding:3px 8px;text-align:right;white-space:nowrap}"
    "th{background:#f4f4f4}table.kv th{text-align:left}td.path{text-align:left;white-space:normal;overflow-wrap:anywhere}"
    "code{overflow-wrap:anywhere}pre{white-space:pre-wrap;overflow-wrap:anywhere;background:#f6f6f6;padding:6px;font-size:12px}"
    ".sample{border-top:1px solid #ddd;padding:6px 0;font-size:13px}"
)


def render_html(
    *,
    title: str,
    summary: dict[str, Any],
    metrics: list[dict[str, Any]],
    evals: list[dict[str, Any]],
    samples: list[dict[str, Any]],
    plots: list[tuple[Path, bytes]],
) -> str:
    """The report page, self-contained (SVG charts as data URIs; no scripts, fonts or network)."""
    h = headline(summary, metrics)
    parts = [
        f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<meta name='viewport' content='width=device-width'><style>{_STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        _headline_html(h),
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
    parts.append("<h2>Steps</h2>" + _table(metrics, _STEP_COLUMNS, "steps"))
    parts.append("<h2>Run</h2>" + _details_table(summary))
    if samples:
        parts.append("<h2>Sample responses (last trained step)</h2>" + _samples_html(samples, text(summary.get("run_dir")) or "RUN"))
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
) -> tuple[Path, str]:
    """Write the SVG charts and ``index.html`` (each atomically: temp file then rename).

    Returns the page's path and the page (self-contained, also the Flyte report).
    """
    plots = write_plots(metrics, evals, out_dir)
    page = render_html(title=title, summary=summary, metrics=metrics, evals=evals, samples=samples, plots=plots)
    target = out_dir / "index.html"
    write_text(target, page)
    return target, page


def eval_interval(per_problem_avg: list[float]) -> float | None:
    """95% half-width of a held-out avg@k from its per-problem values (t over problems)."""
    return mean_interval(per_problem_avg)[1] if per_problem_avg else None
