"""Benchmark the main job: `dapo run --config configs/tiny-cpu.yaml` from scratch, then again.

Prints held-out accuracy before/after, total wall time, the cached re-run's time, and per step
the split between generation (vLLM), gradient computation (old log-probs + updates in the
DeepSpeed workers) and everything else (process start, engine setup, scoring, shard I/O,
checkpoint export, orchestration). Writes benchmarks/results/main_job.json.

    .venv/bin/python benchmarks/main_job.py [--config FILE] [--set k=v ...] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from storage.run_layout import RunLayout  # noqa: E402


def _run(config: str, sets: list[str], run_root: Path) -> tuple[float, dict]:
    args = [str(REPO / ".venv" / "bin" / "dapo"), "run", "--config", config, "--run-root", str(run_root)]
    for item in sets:
        args += ["--set", item]
    started = time.perf_counter()
    proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(f"dapo run failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    summary_path = next(run_root.glob("*/summary.json"))
    return seconds, json.loads(summary_path.read_text())


def step_split(layout: RunLayout, step: int, step_seconds: float) -> dict[str, float]:
    """Seconds of generation, gradient computation and the rest for one step."""
    generation = sum(
        json.loads(p.read_text())["seconds"] for p in Path(layout.step_dir(step)).glob("rollouts/*.manifest.json")
    )
    timings = json.loads((Path(layout.checkpoint(step)) / "train_timings.json").read_text())
    gradient = timings.get("old_log_probs_s", 0.0) + timings.get("updates_s", 0.0)
    other = max(0.0, step_seconds - generation - gradient)
    return {
        "step_s": step_seconds,
        "generation_s": generation,
        "gradient_s": gradient,
        "other_s": other,
        "other_share": other / step_seconds if step_seconds else float("nan"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(REPO / "configs" / "tiny-cpu.yaml"))
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--keep", help="keep the run folder under this directory")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "main_job.json"))
    args = parser.parse_args()

    run_root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="dapo-main-job-"))
    if args.keep and run_root.exists():
        shutil.rmtree(run_root)
    first_s, summary = _run(args.config, args.set, run_root)
    again_s, _ = _run(args.config, args.set, run_root)
    layout = RunLayout(Path(summary["run_dir"]))
    steps = [step_split(layout, i + 1, s) for i, s in enumerate(summary["step_seconds"])]
    totals = {k: sum(s[k] for s in steps) for k in ("step_s", "generation_s", "gradient_s", "other_s")}
    result = {
        "config": args.config,
        "overrides": args.set,
        "accuracy_before": summary["accuracy_before"],
        "accuracy_after": summary["accuracy_after"],
        "eval": {"problems": summary["eval_problems"], "k": summary["eval_k"]},
        "steps": summary["steps"],
        "wall_seconds_first_run": round(first_s, 1),
        "pipeline_seconds_first_run": summary["wall_seconds"],
        "wall_seconds_cached_rerun": round(again_s, 1),
        "step_totals_s": {k: round(v, 2) for k, v in totals.items()},
        "other_share_of_step_time": round(totals["other_s"] / totals["step_s"], 3) if totals["step_s"] else None,
        "per_step": [{k: round(v, 3) for k, v in s.items()} for s in steps],
    }
    print(f"{'metric':38s} value")
    print(f"{'held-out accuracy before':38s} {summary['accuracy_before']:.3f}")
    print(f"{'held-out accuracy after':38s} {summary['accuracy_after']:.3f}")
    print(f"{'steps':38s} {summary['steps']}")
    print(f"{'first run, wall (s)':38s} {first_s:.1f}")
    print(f"{'cached re-run, wall (s)':38s} {again_s:.1f}")
    print(f"{'step time total (s)':38s} {totals['step_s']:.1f}")
    print(f"{'  generation (s)':38s} {totals['generation_s']:.1f}")
    print(f"{'  gradient computation (s)':38s} {totals['gradient_s']:.1f}")
    print(f"{'  everything else (s)':38s} {totals['other_s']:.1f}")
    print(f"{'share outside generation+gradient':38s} {result['other_share_of_step_time']:.1%}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
