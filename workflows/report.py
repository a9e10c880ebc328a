"""The run report: PNG plots and one HTML page built from a run folder's shards.

Plots per step: reward and accuracy, entropy, response length, clip fractions (low/high side,
the clip-higher signal of sec. 3.1), truncation, generation rounds (dynamic sampling, sec. 3.2),
stage timings, and held-out accuracy at each evaluation; plus a few sample responses of the
last step. The same HTML is written to ``<run>/report/index.html`` and published as the Flyte
report of the driver task.
"""

from __future__ import annotations

import base64
import html
import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display on servers and CI
import matplotlib.pyplot as plt  # noqa: E402

from tasks.run_store import write_text  # noqa: E402

_PLOTS: list[tuple[str, str, list[tuple[str, str]]]] = [
    # (file stem, title, [(metrics column, label), ...])
    ("reward", "Reward and training accuracy", [("reward_mean", "reward mean"), ("accuracy", "accuracy")]),
    ("entropy", "Policy entropy (token mean)", [("entropy", "entropy")]),
    ("length", "Response length (tokens)", [("response_length_mean", "mean length")]),
    ("clip", "Clip fractions", [("clip_frac_low", "low side (1-eps_low)"), ("clip_frac_high", "high side (1+eps_high)")]),
    ("truncation", "Truncated responses", [("truncation_ratio", "truncation ratio")]),
    ("rounds", "Generation rounds per step", [("generation_rounds", "rounds")]),
    ("timings", "Stage time per step (s)", [("time_rollout_s", "rollout"), ("time_score_s", "score"), ("time_train_s", "train")]),
]


def nan_to_none(row: dict[str, Any]) -> dict[str, Any]:
    """A metrics row with NaN / inf floats as None (JSON-safe; plots and tables skip them)."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}


def _finite(values: list[Any]) -> bool:
    return any(v is not None and isinstance(v, (int, float)) and math.isfinite(v) for v in values)


def write_plots(metrics: list[dict[str, Any]], evals: list[dict[str, Any]], out_dir: Path) -> list[Path]:
    """One PNG per plot that has data; returns the files written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    steps = [m["step"] for m in metrics]
    for stem, title, series in _PLOTS:
        if not any(_finite([m.get(col) for m in metrics]) for col, _ in series):
            continue
        fig, ax = plt.subplots(figsize=(5, 3.2), dpi=100)
        for col, label in series:
            ax.plot(steps, [m.get(col, float("nan")) for m in metrics], marker="o", label=label)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if len(series) > 1:
            ax.legend(fontsize=8)
        fig.tight_layout()
        path = out_dir / f"{stem}.png"
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    if evals:
        fig, ax = plt.subplots(figsize=(5, 3.2), dpi=100)
        ax.plot([e["step"] for e in evals], [e["avg_at_k"] for e in evals], marker="o", label="avg@k")
        ax.plot([e["step"] for e in evals], [e["pass_at_k"] for e in evals], marker="s", label="pass@k")
        ax.set_title("Held-out evaluation")
        ax.set_xlabel("step")
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out_dir / "eval.png"
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written


def _table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return "nan" if not math.isfinite(v) else f"{v:.4g}"
        return html.escape(str(v))

    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{fmt(r.get(c, ''))}</td>" for c in columns) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def render_html(
    *,
    title: str,
    summary: dict[str, Any],
    metrics: list[dict[str, Any]],
    evals: list[dict[str, Any]],
    samples: list[dict[str, Any]],
    plot_files: list[Path],
    inline_images: bool = False,
) -> str:
    """The report page. Images are referenced by file name (they sit beside index.html), or
    embedded as data URIs with ``inline_images`` (for the Flyte report, which is one file)."""
    style = (
        "body{font-family:sans-serif;margin:1.5em;max-width:1100px}"
        "table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px}"
        "img{margin:4px;border:1px solid #eee}pre{background:#f6f6f6;padding:6px;font-size:12px}"
    )
    parts = [f"<html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>{style}</style></head><body>"]
    parts.append(f"<h1>{html.escape(title)}</h1>")
    parts.append("<h2>Summary</h2>" + _table([summary], list(summary)))
    def src(path: Path) -> str:
        if inline_images:
            return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()
        return path.name

    parts.append("<h2>Plots</h2>" + "".join(f"<img src='{src(p)}' width='440'>" for p in plot_files))
    metric_cols = [
        "step", "reward_mean", "accuracy", "entropy", "response_length_mean", "truncation_ratio",
        "clip_frac_low", "clip_frac_high", "grad_norm", "lr", "generation_rounds", "verdict_timeouts",
        "time_rollout_s", "time_score_s", "time_train_s",
    ]
    parts.append("<h2>Steps</h2>" + _table(metrics, metric_cols))
    if evals:
        parts.append("<h2>Evaluations</h2>" + _table(evals, list(evals[0])))
    if samples:
        parts.append("<h2>Sample responses (last step)</h2>")
        for s in samples:
            parts.append(
                f"<p><b>{html.escape(str(s['problem_id']))}</b> reward={s['reward']:.3g} "
                f"correct={s['correct']} filter={html.escape(str(s['filter_reason']))} "
                f"length={s['response_length']} finish={html.escape(str(s['finish_reason']))}</p>"
                f"<pre>{html.escape(str(s['response_text']))}</pre>"
            )
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
    """Write the PNGs and ``index.html`` (atomically: temp file then rename).

    Returns the page's path and a self-contained copy of it (images inlined) for the Flyte report.
    """
    plot_files = write_plots(metrics, evals, out_dir)
    common = dict(title=title, summary=summary, metrics=metrics, evals=evals, samples=samples, plot_files=plot_files)
    target = out_dir / "index.html"
    write_text(target, render_html(**common))
    return target, render_html(**common, inline_images=True)
