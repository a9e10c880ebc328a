"""The ablation ladder's outputs: ``ablation.json``, a Markdown table in the paper's form, curves.

``ablation.json`` is a list of rungs in ladder order, each ``{"name", "config", "accuracy": [one
held-out avg@k per seed], ...}`` plus spreads and the per-step means the curves are drawn from.
The curves (``curves.png``): held-out avg@k at each evaluation, policy entropy (does clip-higher
keep it from collapsing, sec. 3.1), mean response length and truncation (sec. 3.4), and training
accuracy of the generated groups, each as the mean over seeds per rung.
"""

from __future__ import annotations

import base64
import html
import json
import math
import statistics
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display on servers and CI
import matplotlib.pyplot as plt  # noqa: E402

from tasks.run_store import write_text  # noqa: E402


def _mean(values: list[float | None]) -> float | None:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return sum(finite) / len(finite) if finite else None


def _std(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def _per_step_mean(runs: list[dict[str, Any]], key: str) -> list[float | None]:
    """Mean over seeds of metrics column ``key`` at each step."""
    steps = min(len(r["metrics"]) for r in runs)
    return [_mean([r["metrics"][i].get(key) for r in runs]) for i in range(steps)]


def rung_row(result: dict[str, Any]) -> dict[str, Any]:
    """One ``ablation.json`` entry from a rung's runs (see workflows/ablation.py)."""
    runs = result["runs"]
    finals = [r["summary"]["accuracy_after"] for r in runs]
    eval_steps = [e["step"] for e in runs[0]["summary"]["evals"]]
    tail = max(1, min(len(r["metrics"]) for r in runs) // 4)  # the last quarter of the steps
    return {
        "name": result["name"],
        "config": result["settings"],
        "accuracy": finals,
        "seeds": [r["seed"] for r in runs],
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
        "entropy_last_quarter": _mean([_mean([m["entropy"] for m in r["metrics"][-tail:]]) for r in runs]),
        "truncation_ratio_mean": _mean([_mean([m["truncation_ratio"] for m in r["metrics"]]) for r in runs]),
        "generation_rounds_total": [sum(m["generation_rounds"] for m in r["metrics"]) for r in runs],
        "wall_seconds": [r["summary"]["wall_seconds"] for r in runs],
    }


def format_table(table: list[dict[str, Any]]) -> str:
    """The paper's Table 1 form: held-out avg@k per rung, mean and spread over seeds."""
    if not table:
        return "(no rung)"
    k, n = table[0]["eval_k"], table[0]["eval_problems"]
    lines = [
        f"| rung | held-out avg@{k} (mean +/- std over seeds) | per seed | vs naive | entropy (last quarter) "
        f"| truncated | generation rounds |",
        "|---|---|---|---|---|---|---|",
    ]
    naive = table[0]["accuracy_mean"]
    for row in table:
        per_seed = ", ".join(f"{a:.1%}" for a in row["accuracy"])
        lines.append(
            f"| {row['name']} | {row['accuracy_mean']:.1%} +/- {row['accuracy_std']:.1%} | {per_seed} "
            f"| {(row['accuracy_mean'] - naive) * 100:+.1f} pts | {_fmt(row['entropy_last_quarter'], '.3f')} "
            f"| {_fmt(row['truncation_ratio_mean'], '.1%')} | {sum(row['generation_rounds_total']) / len(row['generation_rounds_total']):.0f} |"
        )
    lines.append("")
    lines.append(f"Held-out set: {n} problems, k = {k}, before training: {table[0]['accuracy_before']:.1%}; "
                 f"{table[0]['steps']} steps per run; seeds {table[0]['seeds']}.")
    return "\n".join(lines)


def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def write_curves(table: list[dict[str, Any]], path: Path) -> Path:
    """A 2 x 3 grid of per-rung curves (mean over seeds)."""
    panels = [
        ("eval", "Held-out avg@k", None),
        ("entropy", "Policy entropy (token mean)", "entropy"),
        ("response_length_mean", "Response length (tokens, trained batch)", "response_length_mean"),
        ("truncation_ratio", "Truncated responses (generated)", "truncation_ratio"),
        ("accuracy", "Training accuracy (generated)", "accuracy"),
        ("clip_frac_high", "Clip fraction, high side", "clip_frac_high"),
    ]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8), dpi=100)
    for ax, (_, title, key) in zip(axes.flat, panels):
        for row in table:
            if key is None:
                xs, ys = row["eval_curve"]["steps"], row["eval_curve"]["avg_at_k_mean"]
                ax.plot(xs, ys, marker="o", label=row["name"])
            else:
                ys = row["step_curves"][key]
                # markers: a step without a value (e.g. NaN accuracy when carried groups alone
                # filled the batch) leaves a gap that would hide an isolated point of a plain line
                ax.plot(range(1, len(ys) + 1), [float("nan") if v is None else v for v in ys], marker=".",
                        label=row["name"])
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
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
    curves = write_curves(table, root / "curves.png")
    image = base64.b64encode(curves.read_bytes()).decode()
    page = (
        "<html><head><meta charset='utf-8'><title>DAPO ablation ladder</title></head><body>"
        f"<h1>DAPO ablation ladder</h1><pre>{html.escape(text)}</pre>"
        f"<img src='data:image/png;base64,{image}' alt='curves'></body></html>"
    )
    write_text(root / "index.html", page)
    return table, page
