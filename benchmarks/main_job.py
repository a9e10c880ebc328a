"""Benchmark the main job: `dapo run --config configs/tiny-cpu.yaml` from scratch, then again.

Prints held-out accuracy before/after, total wall time, the cached re-run's time, and per step
the split between generation (vLLM, the rollout manifests' ``seconds``), gradient computation
(old log-probs + updates in the DeepSpeed workers, ``train_timings.json``) and everything else
(process and worker-group start, scoring, shard I/O and validation, checkpoint export and
publish, digests, Flyte's bookkeeping, tracking, the report). A step's time runs from the end
of the previous step to the end of this one (its metrics shard's record is written last), so
the previous step's tracking, retention and report refresh count; evaluations between steps
are reported apart. Shares are given overall, in steady state (steps ``--steady-from``..N) and
for the first step, which starts the DeepSpeed worker group.

The first run is a fresh machine as far as a run can make it: ``TORCH_EXTENSIONS_DIR``, vLLM's
and Triton's caches and ``XDG_CACHE_HOME`` point at empty temporary folders (the shared caches
are never touched); pip packages and the OS page cache stay warm. Writes
benchmarks/results/main_job.json (``--out``) with the commit and the load average.

    python benchmarks/main_job.py [--config FILE] [--set k=v ...] [--keep DIR] [--no-rerun]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import cpu_model  # noqa: E402  (benchmarks/machine.py)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from storage.run_layout import RunLayout  # noqa: E402


def _dapo() -> list[str]:
    script = REPO / ".venv" / "bin" / "dapo"
    return [str(script)] if script.exists() else [sys.executable, "-m", "workflows.cli"]


def _fresh_caches(root: Path) -> dict[str, str]:
    """Empty cache folders a fresh machine would have (compiled extensions, vLLM, Triton, XDG)."""
    env = {}
    for var, name in (("TORCH_EXTENSIONS_DIR", "torch_extensions"), ("VLLM_CACHE_ROOT", "vllm"),
                      ("TRITON_CACHE_DIR", "triton"), ("XDG_CACHE_HOME", "xdg")):
        (root / name).mkdir(parents=True, exist_ok=True)
        env[var] = str(root / name)
    return env


def _run(config: str, sets: list[str], run_root: Path, env: dict[str, str]) -> tuple[float, dict]:
    args = [*_dapo(), "run", "--config", config, "--run-root", str(run_root)]
    for item in sets:
        args += ["--set", item]
    started = time.perf_counter()
    proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True, env={**os.environ, **env,
                                                                                "PYTHONPATH": str(REPO)})
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(f"dapo run failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    summary_path = next(run_root.glob("*/summary.json"))
    return seconds, json.loads(summary_path.read_text())


def _written(path: str) -> float:
    """When an output was published: its digest record is written last (storage/digests.py)."""
    return Path(path + ".sha256.json").stat().st_mtime


def step_times(layout: RunLayout, steps: int) -> tuple[list[float], dict[int, float]]:
    """Each step's seconds (end of the previous step to the end of this one, evaluations between
    them excluded) and each evaluation's seconds by step, from when the run folder's outputs were
    written. Step 1 starts when the step-0 evaluation was published."""
    ends = [_written(str(layout.eval_shard(0)))] + [_written(str(layout.metrics_shard(i))) for i in range(1, steps + 1)]
    evals = {i: _written(str(layout.eval_shard(i))) - ends[i] for i in range(1, steps)
             if Path(str(layout.eval_shard(i)) + ".sha256.json").exists()}
    return [ends[i] - ends[i - 1] - evals.get(i - 1, 0.0) for i in range(1, steps + 1)], evals


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
        "worker_group_start_s": timings.get("group_start_s", 0.0),  # processes up, DeepSpeed imported
        "worker_load_s": timings.get("load_s", 0.0),  # policy + optimizer state into the engine
        "train_launch_overhead_s": timings.get("launch_overhead_s", 0.0),  # train task time outside the workers' work
    }


def _totals(steps: list[dict[str, float]]) -> dict[str, float]:
    totals = {k: sum(s[k] for s in steps) for k in ("step_s", "generation_s", "gradient_s", "other_s")}
    totals["other_share"] = totals["other_s"] / totals["step_s"] if totals["step_s"] else float("nan")
    return {k: round(v, 3) for k, v in totals.items()}


def _commit() -> str:
    proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True,
                           text=True).stdout.strip()
    return proc.stdout.strip() + ("+dirty" if dirty else "") if proc.returncode == 0 else "unknown"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(REPO / "configs" / "tiny-cpu.yaml"))
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--keep", help="keep the run folder under this directory")
    parser.add_argument("--steady-from", type=int, default=3, help="first step of the steady state")
    parser.add_argument("--no-rerun", action="store_true", help="skip the cached re-run")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "main_job.json"))
    args = parser.parse_args()

    run_root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="dapo-main-job-"))
    if args.keep and run_root.exists():
        shutil.rmtree(run_root)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="dapo-main-job-caches-") as caches:
        first_s, summary = _run(args.config, args.set, run_root, _fresh_caches(Path(caches)))
    load_after = os.getloadavg()
    layout = RunLayout(Path(summary["run_dir"]))
    seconds, evals = step_times(layout, len(summary["step_seconds"]))
    steps = [step_split(layout, i + 1, s) for i, s in enumerate(seconds)]
    again_s = None if args.no_rerun else _run(args.config, args.set, run_root, {})[0]
    steady = steps[args.steady_from - 1:]
    result = {
        "commit": _commit(),
        "cpu": cpu_model(),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in load_after],
        "config": args.config,
        "overrides": args.set,
        "accuracy_before": summary["accuracy_before"],
        "accuracy_after": summary["accuracy_after"],
        "eval": {"problems": summary["eval_problems"], "k": summary["eval_k"]},
        "steps": summary["steps"],
        "wall_seconds_first_run": round(first_s, 1),
        "pipeline_seconds_first_run": summary["wall_seconds"],
        "wall_seconds_cached_rerun": None if again_s is None else round(again_s, 1),
        "evaluation_seconds_between_steps": {str(k): round(v, 2) for k, v in evals.items()},
        "overall": _totals(steps),
        "steady_state": {"steps": f"{args.steady_from}..{len(steps)}", **_totals(steady)} if steady else None,
        "first_step": {**{k: round(v, 3) for k, v in steps[0].items()}, "fresh_caches": True} if steps else None,
        "per_step": [{k: round(v, 3) for k, v in s.items()} for s in steps],
    }
    print(f"{'metric':44s} value")
    print(f"{'commit / cpu':44s} {result['commit']} / {result['cpu']}")
    print(f"{'load average before -> after':44s} {result['load_average_before']} -> {result['load_average_after']}")
    print(f"{'held-out accuracy before -> after':44s} {summary['accuracy_before']:.3f} -> {summary['accuracy_after']:.3f}")
    print(f"{'first run, wall (s)':44s} {first_s:.1f}")
    if again_s is not None:
        print(f"{'cached re-run, wall (s)':44s} {again_s:.1f}")
    for name, part in (("overall", result["overall"]), ("steady state", result["steady_state"]),
                       ("first step (fresh caches)", result["first_step"])):
        if not part:
            continue
        print(f"{name}: step {part['step_s']:.1f} s = generation {part['generation_s']:.1f} + gradient "
              f"{part['gradient_s']:.1f} + other {part['other_s']:.1f}  -> outside generation+gradient "
              f"{part['other_share']:.1%}")
    if steps:
        print(f"{'first step: worker group start / load (s)':44s} {steps[0]['worker_group_start_s']:.1f} / "
              f"{steps[0]['worker_load_s']:.1f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
