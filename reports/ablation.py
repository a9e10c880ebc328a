"""The ablation ladder's outputs: ``ablation.json``, a Markdown table in the paper's form, curves.

``ablation.json`` is a list of rungs in ladder order, each ``{"name", "config", "accuracy": [one
held-out avg@k per seed], ...}`` plus spreads and the per-step means the curves are drawn from.
The curves (``curves.png``): held-out avg@k at each evaluation, policy entropy (does clip-higher
keep it from collapsing, sec. 3.1), mean response length and truncation (sec. 3.4), and training
accuracy of the generated groups, each as the mean over seeds per rung.
The page (``index.html``, also the Flyte report) is self-contained: the table as HTML with 95%
intervals over seeds ("n/a" where one seed gives no spread), a bar chart with error bars, and one
image per curve panel in a grid that wraps at the window's width.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import statistics
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display on servers and CI
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from dapo_core.intervals import mean_interval, two_sample_change  # noqa: E402
from storage.run_layout import rung_folder  # noqa: E402
from storage.run_store import write_text  # noqa: E402


def _mean(values: list[float | None]) -> float | None:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return sum(finite) / len(finite) if finite else None


def _std(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def _per_step_mean(runs: list[dict[str, Any]], key: str) -> list[float | None]:
    """Mean over seeds of metrics column ``key`` at each step."""
    steps = min(len(r["metrics"]) for r in runs)
    return [_mean([r["metrics"][i].get(key) for r in runs]) for i in range(steps)]


def rung_run_page(slug: str, seed: int) -> str:
    """A rung's run page relative to the ladder folder: each rung and seed runs in ``<slug>/seed-<n>/``
    (workflows/ablation.py lays the ladder out so) with its page in ``report/``."""
    return f"{rung_folder(slug, seed)}/report/index.html"


def rung_row(result: dict[str, Any]) -> dict[str, Any]:
    """One ``ablation.json`` entry from a rung's runs (see workflows/ablation.py)."""
    runs = result["runs"]
    finals = [r["summary"]["accuracy_after"] for r in runs]
    eval_steps = [e["step"] for e in runs[0]["summary"]["evals"]]
    tail = max(1, min(len(r["metrics"]) for r in runs) // 4)  # the last quarter of the steps
    entropy_tail = [_mean([m["entropy"] for m in r["metrics"][-tail:]]) for r in runs]
    return {
        "name": result["name"],
        "config": result["settings"],
        "accuracy": finals,
        "seeds": [r["seed"] for r in runs],
        "run_pages": [rung_run_page(result["slug"], r["seed"]) for r in runs] if result.get("slug") else [],
        "accuracy_mean": sum(finals) / len(finals),
        "accuracy_std": _std(finals),
        "accuracy_before": runs[0]["summary"]["accuracy_before"],
        "pass_at_k": [r["summary"]["pass_at_k_after"] for r in runs],
        "maj_at_k": [r["summary"]["evals"][-1]["maj_at_k"] for r in runs],
        "eval_k": runs[0]["summary"]["eval_k"],
        "eval_problems": runs[0]["summary"]["eval_problems"],
        "steps": runs[0]["summary"]["steps"],
        "eval_curve": {
            "steps": eval_steps,
            "avg_at_k_mean": [_mean([r["summary"]["evals"][i]["avg_at_k"] for r in runs]) for i in range(len(eval_steps))],
        },
        "step_curves": {
            key: _per_step_mean(runs, key)
            for key in ("entropy", "response_length_mean", "truncation_ratio", "accuracy", "generation_rounds",
                        "clip_frac_high", "clip_frac_low")
        },
        "entropy_final": [r["metrics"][-1]["entropy"] for r in runs],  # per seed: the last step's
        "entropy_tail": entropy_tail,  # per seed: mean over the last quarter of the steps
        "entropy_last_quarter": _mean(entropy_tail),
        "response_length_mean": _mean([_mean([m.get("response_length_mean") for m in r["metrics"]]) for r in runs]),
        "truncation_ratio_mean": _mean([_mean([m["truncation_ratio"] for m in r["metrics"]]) for r in runs]),
        "generation_rounds_total": [sum(m["generation_rounds"] for m in r["metrics"]) for r in runs],
        "wall_seconds": [r["summary"]["wall_seconds"] for r in runs],
    }


def format_table(table: list[dict[str, Any]]) -> str:
    """The paper's Table 1 form: held-out avg@k per rung, mean and spread over seeds, and each rung's
    effect (the change from the rung before it, and from naive GRPO) with its 95% interval over seeds."""
    if not table:
        return "(no rung)"
    k, n = table[0]["eval_k"], table[0]["eval_problems"]
    lines = [
        f"| rung | held-out avg@{k} (mean +/- std over seeds) | per seed | vs rung above (95% CI) | vs naive (95% CI) "
        "| entropy (last quarter, mean +/- std) | truncated | generation rounds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for i, row in enumerate(table):
        per_seed = ", ".join(f"{a:.1%}" for a in row["accuracy"])
        above = "-" if i == 0 else _change_text(table[i - 1]["accuracy"], row["accuracy"])
        naive = "reference" if i == 0 else _change_text(table[0]["accuracy"], row["accuracy"])
        lines.append(
            f"| {row['name']} | {row['accuracy_mean']:.1%} +/- {row['accuracy_std']:.1%} | {per_seed} "
            f"| {above} | {naive} | {_entropy_text(row)} "
            f"| {_fmt(row['truncation_ratio_mean'], '.1%')} | {sum(row['generation_rounds_total']) / len(row['generation_rounds_total']):.0f} |"
        )
    lines.append("")
    lines.append(f"Held-out set: {n} problems, k = {k}, before training: {table[0]['accuracy_before']:.1%}; "
                 f"{table[0]['steps']} steps per run; seeds {table[0]['seeds']}. Changes: difference of the "
                 "seed means, 95% interval from Welch's standard error.")
    return "\n".join(lines)


def _change_text(reference: list[float], other: list[float]) -> str:
    """``"+2.9 pts (+/- 1.8)"``: mean(other) - mean(reference) in points with its 95% half-width."""
    change, half = two_sample_change(reference, other)
    return f"{change * 100:+.1f} pts" + ("" if half is None else f" (+/- {half * 100:.1f})")


def _entropy_text(row: dict[str, Any]) -> str:
    """The rung's last-quarter entropy, mean +/- sample std over seeds."""
    tails = [v for v in row["entropy_tail"] if v is not None]
    if len(tails) < 2:
        return _fmt(row["entropy_last_quarter"], ".3f")
    return f"{row['entropy_last_quarter']:.3f} +/- {_std(tails):.3f}"


def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


# (file stem, title, metrics key or None for the held-out curve, shown in percent): every fraction is
# drawn in percent, as the table shows it.
_PANELS = [
    ("eval", "Held-out avg@k (%)", None, True),
    ("entropy", "Policy entropy (token mean, nats)", "entropy", False),
    ("response_length_mean", "Response length (tokens, trained batch)", "response_length_mean", False),
    ("truncation_ratio", "Truncated responses (% generated)", "truncation_ratio", True),
    ("accuracy", "Training accuracy (% generated)", "accuracy", True),
    ("clip_frac_high", "Clip fraction, high side (% tokens)", "clip_frac_high", True),
]


def _scaled(values: list[float | None], percent: bool) -> list[float]:
    """Values to draw: NaN for a missing one (a gap), x100 for a fraction shown in percent."""
    return [float("nan") if v is None else v * (100.0 if percent else 1.0) for v in values]


def _draw_panel(ax: Any, table: list[dict[str, Any]], title: str, key: str | None, percent: bool) -> None:
    for row in table:
        if key is None:
            xs, ys = row["eval_curve"]["steps"], row["eval_curve"]["avg_at_k_mean"]
            ax.plot(xs, _scaled(ys, percent), marker="o", label=row["name"])
        else:
            ys = row["step_curves"][key]
            # markers: a step without a value (e.g. NaN accuracy when carried groups alone
            # filled the batch) leaves a gap that would hide an isolated point of a plain line
            ax.plot(range(1, len(ys) + 1), _scaled(ys, percent), marker=".", label=row["name"])
    if percent:
        ax.set_ylim(bottom=0)  # a share never runs below 0%
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("training step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def panel_pngs(table: list[dict[str, Any]]) -> list[tuple[str, bytes]]:
    """One small PNG per curve panel (all rungs in each), for the page's wrapping grid."""
    out = []
    for stem, title, key, percent in _PANELS:
        fig, ax = plt.subplots(figsize=(3.9, 2.93), dpi=100)
        _draw_panel(ax, table, title, key, percent)
        ax.legend(fontsize=6)
        fig.tight_layout()
        out.append((stem, _png(fig)))
    return out


def bar_chart_png(table: list[dict[str, Any]]) -> bytes:
    """Held-out avg@k per rung, mean over seeds with its 95% interval (no bar where one seed)."""
    fig, ax = plt.subplots(figsize=(6.0, 3.4), dpi=100)
    names = [row["name"] for row in table]
    means = [100 * row["accuracy_mean"] for row in table]
    halves = [mean_interval(row["accuracy"])[1] for row in table]
    ax.bar(range(len(table)), means, yerr=[100 * h if h is not None else 0 for h in halves], capsize=4, color="#4c72b0")
    ax.set_xticks(range(len(table)), names, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel(f"held-out avg@{table[0]['eval_k']} (%)")
    ax.set_title("Held-out accuracy per rung (95% interval over seeds)", fontsize=10)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return _png(fig)


def write_curves(table: list[dict[str, Any]], path: Path) -> Path:
    """A 2 x 3 grid of per-rung curves (mean over seeds), one file (benchmarks/ablation.py copies it)."""
    fig, axes = plt.subplots(2, 3, figsize=(15, 8), dpi=100)
    for ax, (_, title, key, percent) in zip(axes.flat, _PANELS):
        _draw_panel(ax, table, title, key, percent)
    axes.flat[0].legend(fontsize=8)
    fig.suptitle("DAPO ablation ladder (mean over seeds)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(path)
    return path


def write_ablation(root: Path, results: list[dict[str, Any]], *, base: Any, seconds: float) -> tuple[list[dict[str, Any]], str]:
    """Write ``ablation.json``, ``ablation.md``, ``curves.png`` and ``index.html`` into ``root``.

    Returns the table and the HTML page with the curves inlined (for the Flyte report).
    """
    table = [rung_row(r) for r in results]
    write_text(root / "ablation.json", json.dumps(table, indent=2) + "\n")
    text = format_table(table)
    write_text(root / "ablation.md", f"# Ablation ladder ({base.source})\n\n{text}\n\nWall time: {seconds:.0f} s.\n")
    write_curves(table, root / "curves.png")
    page = render_page(table, source=str(base.source), seconds=seconds)
    write_text(root / "index.html", page)
    return table, page


def _per_seed_html(row: dict[str, Any]) -> str:
    """Each seed's final avg@k, linked to that seed's run page (relative to the ladder folder) when known."""
    pages = row.get("run_pages") or []
    cells = []
    for i, (seed, accuracy) in enumerate(zip(row["seeds"], row["accuracy"])):
        shown = html.escape(f"{accuracy:.1%}")
        cells.append(f"<a href='{html.escape(pages[i])}' title='seed {seed}: its run page'>{shown}</a>"
                     if i < len(pages) else shown)
    return ", ".join(cells)


def _interval_text(half: float | None) -> str:
    return "n/a (one seed)" if half is None else f"+/- {half * 100:.1f} pts"


def _img(png: bytes, alt: str, width: int, height: int) -> str:
    return (f"<img src='data:image/png;base64,{base64.b64encode(png).decode()}' alt='{html.escape(alt)}' "
            f"width='{width}' height='{height}'>")


_STYLE = (
    "*{box-sizing:border-box}"
    "body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:0 auto;padding:12px 16px;max-width:1240px;color:#222}"
    "h1{font-size:22px;margin:4px 0 10px}h2{font-size:17px;margin:18px 0 6px}.note{font-size:12px;color:#555}"
    ".scroll{overflow-x:auto;max-width:100%}table{border-collapse:collapse;font-size:13px}"
    "td,th{border:1px solid #ddd;padding:3px 6px;text-align:right;white-space:nowrap}th{background:#f4f4f4}"
    "th{white-space:normal;vertical-align:bottom;min-width:60px}td.seeds{white-space:normal;min-width:110px}"
    "td.name{text-align:left}.grid{display:flex;flex-wrap:wrap;gap:8px}img{max-width:100%;height:auto;border:1px solid #eee}"
)


def render_page(table: list[dict[str, Any]], *, source: str, seconds: float) -> str:
    """The ladder page: the paper's table as HTML, a bar chart with error bars, the curve panels."""
    k, n = table[0]["eval_k"], table[0]["eval_problems"]
    naive = table[0]["accuracy"]
    head = ["rung", f"held-out avg@{k} (mean)", "95% interval over seeds", "change vs naive GRPO",
            "95% interval of change", "per seed (its run page)", "entropy, last quarter (nats)", "length (tokens)",
            "truncated", "generation rounds", "seeds"]
    rows = []
    for i, row in enumerate(table):
        _, half = mean_interval(row["accuracy"])
        change, change_half = two_sample_change(naive, row["accuracy"])
        rounds = row["generation_rounds_total"]
        cells = [
            f"<td class='name'>{html.escape(row['name'])}</td>",
            f"<td id='rung-{i}-mean' data-value='{row['accuracy_mean']!r}'>{row['accuracy_mean']:.1%}</td>",
            f"<td id='rung-{i}-ci'>{_interval_text(half)}</td>",
            "<td>reference</td><td></td>" if i == 0 else
            f"<td>{change * 100:+.1f} pts</td><td>{_interval_text(change_half)}</td>",
            f"<td class='seeds'>{_per_seed_html(row)}</td>",
            f"<td>{_fmt(row['entropy_last_quarter'], '.3f')}</td>",
            f"<td>{_fmt(row.get('response_length_mean'), ',.1f')}</td>",
            f"<td>{_fmt(row['truncation_ratio_mean'], '.1%')}</td>",
            f"<td>{sum(rounds) / len(rounds):,.0f}</td>",
            f"<td>{len(row['accuracy'])}</td>",
        ]
        rows.append("<tr>" + "".join(cells) + "</tr>")
    table_html = (
        "<div class='scroll'><table id='ladder-table'><thead><tr>" + "".join(f"<th>{h}</th>" for h in head)
        + "</tr></thead><tbody>" + "".join(rows) + "</tbody></table></div>"
    )
    one_seed = any(len(row["accuracy"]) < 2 for row in table)
    notes = (
        f"Held-out set: {n:,} problems, k = {k}; before training {table[0]['accuracy_before']:.1%}; "
        f"{table[0]['steps']} steps per run; seeds {table[0]['seeds']}; ladder wall time {seconds:,.0f} s. "
        "Intervals: Student t over seeds; the change vs naive GRPO uses Welch's standard error."
        + (" A rung with one seed has no spread, so its interval reads n/a; run more seeds for one." if one_seed else "")
    )
    panels = "".join(_img(png, stem, 390, 293) for stem, png in panel_pngs(table))
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>DAPO ablation ladder</title>"
        f"<meta name='viewport' content='width=device-width'><style>{_STYLE}</style></head><body>"
        f"<h1>DAPO ablation ladder <span class='note'>{html.escape(source)}</span></h1>"
        f"{table_html}<p class='note'>{html.escape(notes)}</p>"
        f"<div class='grid'>{_img(bar_chart_png(table), 'bar chart', 600, 340)}</div>"
        f"<h2>Curves per rung (mean over seeds)</h2><div class='grid'>{panels}</div></body></html>"
    )
