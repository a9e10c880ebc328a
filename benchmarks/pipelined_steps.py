"""Benchmark synchronous against pipelined steps (``run.pipelined``): steps/min and held-out accuracy.

For each seed (``run.seed``: problem order and rollout seeds) the same config runs N steps twice,
synchronously and pipelined (step N+1's rollouts generated from the policy after step N-1 while
step N trains), from one shared start: curation, the step-0 policy and its evaluation are made
once (a ``run.steps=0`` run) and every run starts from a copy of that folder at the same path, so
those tasks are cache hits and both modes train the same step-0 policy. Steps/min is over the
step loop only (``summary.json: step_seconds``, from the first step's rollouts to the last
step's report); accuracy is the held-out avg@k after the last step. Every figure is measured
on whatever machine runs it: the JSON records the CPU model and the load average before and
after each run (other work on a shared machine slows both modes, unevenly).

    python benchmarks/pipelined_steps.py --seeds 0 1 --steps 10 [--config FILE] [--set k=v ...]

Writes benchmarks/results/pipelined_steps.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from machine import cpu_model  # noqa: E402  (benchmarks/machine.py)
from result_file import write_result  # noqa: E402  (benchmarks/result_file.py)

REPO = Path(__file__).resolve().parents[1]
# mode -> (run.pipelined, OMP_NUM_THREADS for the whole run or None = the run's own choice).
# "sync-1thread" is the control: synchronous with each side on one thread, as pipelined runs them,
# which tells the overlap's gain apart from the thread count's (on a loaded machine 2 OpenMP threads
# can be slower than 1).
MODES = {"sync": ("false", None), "pipelined": ("true", None), "sync-1thread": ("false", "1")}


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _dapo_run(config: str, sets: list[str], run_root: Path, log: Path, threads: str | None = None) -> float:
    """``dapo run`` in a child process (its own engines and thread counts); returns its wall seconds."""
    args = [sys.executable, "-m", "cli.main", "run", "--config", config, "--run-root", str(run_root)]
    for item in sets:
        args += ["--set", item]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    env.pop("OMP_NUM_THREADS", None)  # each mode picks its own thread counts (engines/runtime/threads.py)
    if threads is not None:
        env["OMP_NUM_THREADS"] = threads
    started = time.perf_counter()
    with log.open("w") as handle:
        proc = subprocess.run(args, cwd=REPO, env=env, stdout=handle, stderr=subprocess.STDOUT, check=False)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(f"dapo run failed ({' '.join(args)}); see {log}:\n{log.read_text()[-3000:]}")
    return seconds


def _step_metrics(run_dir: Path, steps: int) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    cols = ["step", "max_policy_lag_steps", "carried_groups", "trained_groups", "time_rollout_s", "time_train_s"]
    return [pq.read_table(run_dir / "steps" / f"step-{s:04d}" / "metrics.parquet", columns=cols).to_pylist()[0]
            for s in range(1, steps + 1)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(REPO / "configs" / "tiny-cpu.yaml"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=["sync", "pipelined"])
    parser.add_argument("--set", action="append", default=[], help="extra overrides for every run")
    parser.add_argument("--work", default="/tmp/dapo-pipelined-bench", help="scratch folder (logs, the prepared copy)")
    parser.add_argument("--run-root", help="where the runs run (default WORK/runs); a run.steps=0 run of the "
                        "same config already there is resumed as the shared start")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "pipelined_steps.json"))
    args = parser.parse_args()

    sys.path.insert(0, str(REPO))
    from workflows.config import load_config

    name = load_config(args.config, args.set).run.name
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)  # its logs go here before any run exists
    root, prepared = Path(args.run_root or work / "runs"), work / "prepared"
    run_dir = root / name
    common = [*args.set, "run.eval_every_steps=0"]
    if not prepared.exists():
        if (run_dir / "run.json").exists():
            (run_dir / "run.json").unlink()  # a run of this config with other loop settings: resumed as the start
        print(f"preparing (curation, step-0 policy, its evaluation) in {run_dir} ...", flush=True)
        prepare_s = _dapo_run(args.config, [*common, "run.steps=0"], root, work / "prepare.log")
        shutil.copytree(run_dir, prepared, symlinks=True)
        print(f"  {prepare_s:.0f} s", flush=True)
    runs = []
    for seed in args.seeds:
        for mode in args.modes:
            flag, threads = MODES[mode]
            # Same path as the prepared run: the shared tasks' cache keys (their output paths) match.
            shutil.rmtree(run_dir, ignore_errors=True)
            shutil.copytree(prepared, run_dir, symlinks=True)
            for stale in ("run.json", "summary.json"):
                (run_dir / stale).unlink(missing_ok=True)
            load_before = _load()
            wall = _dapo_run(args.config, [*common, f"run.steps={args.steps}", f"run.seed={seed}",
                                           f"run.pipelined={flag}"], root, work / f"{mode}-seed{seed}.log", threads)
            summary = json.loads((run_dir / "summary.json").read_text())
            metrics = _step_metrics(run_dir, args.steps)
            loop_s = sum(summary["step_seconds"])
            run = {
                "mode": mode, "omp_num_threads": threads, "seed": seed, "steps": args.steps,
                "steps_per_min": round(60 * args.steps / loop_s, 3), "loop_seconds": round(loop_s, 1),
                "wall_seconds": round(wall, 1), "step_seconds": summary["step_seconds"],
                "accuracy_before": summary["accuracy_before"], "accuracy_after": summary["accuracy_after"],
                "eval_problems": summary["eval_problems"], "eval_k": summary["eval_k"],
                "final_checkpoint": Path(summary["final_checkpoint"]).name,
                "max_policy_lag_steps": max(m["max_policy_lag_steps"] for m in metrics),
                "carried_groups": sum(m["carried_groups"] for m in metrics),
                "trained_groups": [m["trained_groups"] for m in metrics],
                "load_before": load_before, "load_after": _load(),
            }
            runs.append(run)
            print(f"{mode:12s} seed {seed}: {run['steps_per_min']:.2f} steps/min ({loop_s:.0f} s loop), held-out "
                  f"{run['accuracy_before']:.3f} -> {run['accuracy_after']:.3f}, load {load_before} -> {run['load_after']}",
                  flush=True)

    def mean(mode: str, key: str) -> float:
        return statistics.fmean(r[key] for r in runs if r["mode"] == mode)

    by_mode = {mode: {"steps_per_min": round(mean(mode, "steps_per_min"), 3),
                      "accuracy_after": round(mean(mode, "accuracy_after"), 4),
                      "accuracy_before": round(mean(mode, "accuracy_before"), 4)} for mode in args.modes}
    speedups = [p["steps_per_min"] / s["steps_per_min"] for s in runs if s["mode"] == "sync"
                for p in runs if p["mode"] == "pipelined" and p["seed"] == s["seed"]]
    result = {
        "config": args.config, "overrides": common, "steps": args.steps, "seeds": args.seeds,
        "cpu_model": cpu_model(), "cpus": os.cpu_count(), "python": platform.python_version(),
        "mean": by_mode, "speedup_per_seed": [round(x, 3) for x in speedups], "runs": runs,
    }
    print()
    print(f"{'mode':12s} {'seed':>4s} {'steps/min':>10s} {'loop s':>8s} {'acc before':>10s} {'acc after':>10s} "
          f"{'max lag':>7s} {'load 1m':>12s}")
    for r in runs:
        print(f"{r['mode']:12s} {r['seed']:4d} {r['steps_per_min']:10.2f} {r['loop_seconds']:8.0f} "
              f"{r['accuracy_before']:10.3f} {r['accuracy_after']:10.3f} {r['max_policy_lag_steps']:7d} "
              f"{r['load_before'][0]:5.2f}->{r['load_after'][0]:5.2f}")
    for mode, m in by_mode.items():
        print(f"{mode:12s} mean {m['steps_per_min']:10.2f} {'':8s} {m['accuracy_before']:10.3f} {m['accuracy_after']:10.3f}")
    print(f"pipelined / sync steps/min per seed: {result['speedup_per_seed']}  (CPU: {result['cpu_model']}, {os.cpu_count()} cores)")
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
