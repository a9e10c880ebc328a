"""Benchmark the main job: `dapo run --config configs/tiny-cpu.yaml` from scratch, then again.

Prints held-out accuracy before/after, total wall time, the cached re-run's time, and per step
the split between generation (vLLM's ``generate``, the rollout manifests' ``generate_seconds``),
gradient computation (old log-probs + updates in the DeepSpeed workers, ``train_timings.json``)
and everything else (process and worker-group start, the new weights' reload into vLLM, scoring,
shard I/O and validation, checkpoint export and publish, digests, Flyte's bookkeeping, tracking,
the report). A step's time runs from the end of the previous step to the end of this one (its
metrics shard's record is written last), so the previous step's tracking, retention and report
refresh count; evaluations between steps are reported apart. Shares are given overall, in steady state (steps ``--steady-from``..N) and
for the first step, which starts the DeepSpeed worker group.

The first run is a fresh machine as far as a run can make it: ``TORCH_EXTENSIONS_DIR``, vLLM's
and Triton's caches and ``XDG_CACHE_HOME`` point at empty temporary folders (the shared caches
are never touched); pip packages and the OS page cache stay warm. Writes
benchmarks/results/main_job.json (``--out``) with the commit and the load average.

    python benchmarks/main_job.py [--config FILE] [--set k=v ...] [--keep DIR] [--no-rerun]

Seeds mode (``--seeds 0 1 2 3 4``): one run per seed S (``--set run.seed=S --set train.seed=S``),
one after another, each in a fresh run folder under ``--keep``. Prints per seed the held-out avg@k
before, best (and its step) and final with their 95% intervals, the change with its paired 95%
interval over problems (summary.json), the pipeline's own seconds (summary.json ``wall_seconds``:
curation, warm-up, steps and evaluations; process start excluded) and the 1-minute load average
over the run (sampled every 10 s: the machine may be shared, so a run's time is only comparable at
similar load), its steps per minute over the step loop, its first step's seconds and its share of
step time outside generation and gradients (overall and from ``--steady-from``, as above, from the
run folder's files); then the median, range and a t interval of the mean change over seeds, and the
median and largest share. A seed whose finished run folder is already under ``--keep`` is read, not
re-run. Writes
benchmarks/results/main_job_seeds.json (``--out``) with the commit and the CPU model.

    python benchmarks/main_job.py --seeds 0 1 2 3 4 [--config FILE] [--set k=v ...] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Self

from machine import cpu_model  # noqa: E402  (benchmarks/machine.py)
from scratch import scratch_dir  # noqa: E402  (benchmarks/scratch.py)
from result_file import write_result  # noqa: E402  (benchmarks/result_file.py)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dapo_core.intervals import mean_interval  # noqa: E402
from storage.run_layout import RunLayout  # noqa: E402
from storage.run_summary import read_summary  # noqa: E402


def _dapo() -> list[str]:
    script = REPO / ".venv" / "bin" / "dapo"
    return [str(script)] if script.exists() else [sys.executable, "-m", "cli.main"]


def _fresh_caches(root: Path) -> dict[str, str]:
    """Empty cache folders a fresh machine would have (compiled extensions, vLLM, Triton, XDG)."""
    env = {}
    for var, name in (("TORCH_EXTENSIONS_DIR", "torch_extensions"), ("VLLM_CACHE_ROOT", "vllm"),
                      ("TRITON_CACHE_DIR", "triton"), ("XDG_CACHE_HOME", "xdg")):
        (root / name).mkdir(parents=True, exist_ok=True)
        env[var] = str(root / name)
    return env


def _run(config: str, sets: list[str], run_root: Path, env: dict[str, str],
         dapo: list[str] | None = None) -> tuple[float, dict]:
    """``dapo run`` (``dapo``: another command standing for it) of ``config`` with ``sets``; seconds and summary."""
    args = [*(dapo or _dapo()), "run", "--config", config, "--run-root", str(run_root)]
    for item in sets:
        args += ["--set", item]
    started = time.perf_counter()
    proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True, env={**os.environ, **env,
                                                                                "PYTHONPATH": str(REPO)})
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(f"dapo run failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    summary_path = next(run_root.glob("*/summary.json"))
    return seconds, read_summary(str(summary_path.parent))  # its paths resolved (summary.json's are relative)


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
    """Seconds of generation, gradient computation and the rest for one step.

    Generation is the time in vLLM's ``generate`` (a manifest's ``generate_seconds``); the rest of
    a rollout round (reloading the new weights into the engine, tokenizing) counts as the rest. A
    run folder from before that field reads the whole round as generation.
    """
    manifests = [json.loads(p.read_text()) for p in Path(layout.step_dir(step)).glob("rollouts/*.manifest.json")]
    generation = sum(m.get("generate_seconds", m["seconds"]) for m in manifests)
    rollout_rest = sum(m["seconds"] for m in manifests) - generation
    timings = json.loads((Path(layout.checkpoint(step)) / "train_timings.json").read_text())
    gradient = timings.get("old_log_probs_s", 0.0) + timings.get("updates_s", 0.0)
    other = max(0.0, step_seconds - generation - gradient)
    return {
        "step_s": step_seconds,
        "generation_s": generation,
        "gradient_s": gradient,
        "other_s": other,
        "other_share": other / step_seconds if step_seconds else float("nan"),
        "rollout_outside_generate_s": rollout_rest,  # weight reload into the engine, tokenizing
        "worker_group_start_s": timings.get("group_start_s", 0.0),  # processes up, DeepSpeed imported
        "worker_load_s": timings.get("load_s", 0.0),  # policy + optimizer state into the engine
        "train_launch_overhead_s": timings.get("launch_overhead_s", 0.0),  # train task time outside the workers' work
    }


def step_splits(layout: RunLayout, steps: int) -> tuple[list[dict[str, float]], dict[int, float]]:
    """:func:`step_split` of every step of a run folder, and the evaluations' seconds by step."""
    seconds, evals = step_times(layout, steps)
    return [step_split(layout, i + 1, s) for i, s in enumerate(seconds)], evals


def _totals(steps: list[dict[str, float]]) -> dict[str, float]:
    totals = {k: sum(s[k] for s in steps) for k in ("step_s", "generation_s", "gradient_s", "other_s")}
    totals["other_share"] = totals["other_s"] / totals["step_s"] if totals["step_s"] else float("nan")
    return {k: round(v, 3) for k, v in totals.items()}


def _commit() -> str:
    proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True,
                           text=True).stdout.strip()
    return proc.stdout.strip() + ("+dirty" if dirty else "") if proc.returncode == 0 else "unknown"


class LoadSampler:
    """The 1-minute load average every ``every_s`` seconds while a run goes (a background thread)."""

    def __init__(self, every_s: float = 10.0) -> None:
        self.every_s, self.samples = every_s, [os.getloadavg()[0]]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.samples.append(os.getloadavg()[0])

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(os.getloadavg()[0])

    def stats(self) -> dict[str, float]:
        return {"mean": round(statistics.fmean(self.samples), 2), "min": round(min(self.samples), 2),
                "max": round(max(self.samples), 2), "samples": len(self.samples)}


def step_shares(run_dir: Path, summary: dict, steady_from: int) -> dict[str, float | None]:
    """A finished run folder's share of step time outside generation and gradients, overall and in
    steady state (steps ``steady_from``..N), and its first step's seconds (fractions, not percent).

    None for a pipelined run (``run.pipelined``): its generation overlaps the previous step's
    training, so a step's time is no sum of the two and the split means nothing there; None too
    for a run of fewer steps than ``steady_from``.
    """
    pipelined = json.loads((run_dir / "run.json").read_text())["config"]["run"].get("pipelined")
    if pipelined or len(summary["step_seconds"]) < steady_from:
        return {"overall_share": None, "steady_share": None, "steady_other_s_per_step": None, "first_step_s": None}
    steps, _ = step_splits(RunLayout(run_dir), len(summary["step_seconds"]))
    overall, steady = _totals(steps), _totals(steps[steady_from - 1:])
    return {"overall_share": overall["other_share"], "steady_share": steady["other_share"],
            "steady_other_s_per_step": round(steady["other_s"] / len(steps[steady_from - 1:]), 3),
            "first_step_s": round(steps[0]["step_s"], 3)}


def seed_row(seed: int, summary: dict, load: dict | None) -> dict:
    """One seed's line of the table, from its summary.json (fractions, not percent)."""
    evals = summary["evals"]
    best = max(evals, key=lambda e: e["avg_at_k"])
    before, after = summary["accuracy_before"], summary["accuracy_after"]
    return {
        "seed": seed,
        "before": before,
        "before_ci95_half": evals[0].get("avg_at_k_ci95_half"),
        "best": best["avg_at_k"],
        "best_step": best["step"],
        "best_ci95_half": best.get("avg_at_k_ci95_half"),
        "final": after,
        "final_ci95_half": evals[-1].get("avg_at_k_ci95_half"),
        "change": after - before,
        "change_ci95": summary.get("accuracy_change_ci95"),
        "best_minus_final": best["avg_at_k"] - after,
        "evals": [(e["step"], e["avg_at_k"]) for e in evals],
        "steps": summary["steps"],
        "pipeline_seconds": summary["wall_seconds"],
        "step_seconds_mean": round(statistics.fmean(summary["step_seconds"]), 2) if summary["step_seconds"] else None,
        "steps_per_min": 60 * len(summary["step_seconds"]) / sum(summary["step_seconds"]) if summary["step_seconds"] else None,
        "load_1min": load,
        "run_dir": summary["run_dir"],
    }


def over_seeds(changes: list[float]) -> dict:
    """Median, range and the t interval of the mean of the per-seed change."""
    mean, half = mean_interval(changes)
    return {
        "median": statistics.median(changes), "min": min(changes), "max": max(changes), "mean": mean,
        "mean_ci95": None if half is None else [mean - half, mean + half],
        "method": f"t interval of the mean over {len(changes)} seeds (df {len(changes) - 1})",
    }


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _share(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.1f}"


def _row_text(r: dict) -> str:
    def with_half(v: float, half: float | None) -> str:
        return _pct(v) + (f" +/-{half * 100:.1f}" if half is not None else "")

    ci = r["change_ci95"]
    change = f"{r['change'] * 100:+.1f}" + (f" [{ci[0] * 100:+.1f}, {ci[1] * 100:+.1f}]" if ci else "")
    load = r["load_1min"]
    load_text = f"{load['mean']:.1f} ({load['min']:.1f}-{load['max']:.1f})" if load else "n/a"
    return (f"{r['seed']:>4} {with_half(r['before'], r['before_ci95_half']):>13} "
            f"{_pct(r['best']) + ' (' + str(r['best_step']) + ')':>13} {with_half(r['final'], r['final_ci95_half']):>13} "
            f"{change:>24} {r['best_minus_final'] * 100:>10.1f} {r['pipeline_seconds']:>10.0f} {load_text:>20} "
            f"{_share(r['steps_per_min'], '.1f'):>9} {_share(r['first_step_s'], '.2f'):>8} {_share(r['overall_share'], '.1%'):>8} "
            f"{_share(r['steady_share'], '.1%'):>8}")


def run_seeds(args: argparse.Namespace) -> int:
    """One run per seed, the per-seed table and the spread over seeds; writes ``args.out``. The run
    folders stay under ``--keep`` (a finished seed there is read, not run again), else they go."""
    with scratch_dir(args.keep, "dapo-main-job-seeds-") as run_root:
        return _run_seeds(args, run_root)


def _run_seeds(args: argparse.Namespace, run_root: Path) -> int:
    rows = []
    for seed in args.seeds:
        name = f"seed-{seed}"
        summary_path, load_path = run_root / name / "summary.json", run_root / f"{name}.load.json"
        if summary_path.exists() and json.loads(summary_path.read_text()).get("status") == "finished":
            print(f"seed {seed}: reading the finished run in {summary_path.parent}", flush=True)
        else:
            print(f"seed {seed}: running ...", flush=True)
            sets = [*args.set, f"run.seed={seed}", f"train.seed={seed}", f"run.name={name}"]
            with LoadSampler() as sampler:
                _run(args.config, sets, run_root, {})
            # Kept beside the run folder, so reading the folder again later still reports its load.
            load_path.write_text(json.dumps(sampler.stats()) + "\n")
        summary = read_summary(str(summary_path.parent))
        load = json.loads(load_path.read_text()) if load_path.exists() else None
        rows.append({**seed_row(seed, summary, load), **step_shares(summary_path.parent, summary, args.steady_from)})
        print(_row_text(rows[-1]), flush=True)

    stats = over_seeds([r["change"] for r in rows])
    k, n = summary["eval_k"], summary["eval_problems"]
    print()
    print(f"commit {_commit()}, cpu {cpu_model()}; config {args.config} {' '.join(args.set)}")
    print(f"held-out avg@{k} on {n} problems, {summary['steps']} steps; percent, +/- = 95% interval half-width")
    print(f"{'seed':>4} {'before':>13} {'best (step)':>13} {'final':>13} {'change [paired 95%]':>24} "
          f"{'best-final':>10} {'pipeline s':>10} {'load mean (min-max)':>20} {'steps/min':>9} {'step 1 s':>8} "
          f"{'other':>8} {'steady':>8}")
    for r in rows:
        print(_row_text(r))
    ci = stats["mean_ci95"]
    print(f"change over seeds: median {stats['median'] * 100:+.1f}, range {stats['min'] * 100:+.1f} to "
          f"{stats['max'] * 100:+.1f}, mean {stats['mean'] * 100:+.1f}"
          + (f" (95% t interval {ci[0] * 100:+.1f} to {ci[1] * 100:+.1f})" if ci else ""))
    secs = [r["pipeline_seconds"] for r in rows]
    print(f"pipeline seconds: median {statistics.median(secs):.0f}, max {max(secs):.0f}")
    rates = [r["steps_per_min"] for r in rows if r["steps_per_min"] is not None]
    if rates:
        print(f"steps/min over the step loop: median {statistics.median(rates):.1f}")
    shares = {key: _spread([r[key] for r in rows]) for key in ("overall_share", "steady_share", "first_step_s")
              if all(r[key] is not None for r in rows)}
    if shares:
        print("outside generation and gradients (other / steady = overall / steps "
              f"{args.steady_from}..N): overall median {shares['overall_share']['median']:.1%} "
              f"(max {shares['overall_share']['max']:.1%}), steady median {shares['steady_share']['median']:.1%} "
              f"(max {shares['steady_share']['max']:.1%}); first step median {shares['first_step_s']['median']:.2f} s")
    result = {
        "commit": _commit(), "cpu": cpu_model(), "cores": os.cpu_count(),
        "config": args.config, "overrides": args.set, "seeds": args.seeds, "eval_k": k, "eval_problems": n,
        "steps": summary["steps"], "per_seed": rows, "change_over_seeds": stats,
        "pipeline_seconds": {"median": statistics.median(secs), "max": max(secs)},
        "steady_from": args.steady_from, "step_time_over_seeds": shares,
    }
    write_result(args.out, result)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(REPO / "configs" / "tiny-cpu.yaml"))
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--keep", help="keep the run folder under this directory")
    parser.add_argument("--steady-from", type=int, default=3, help="first step of the steady state")
    parser.add_argument("--no-rerun", action="store_true", help="skip the cached re-run")
    parser.add_argument("--seeds", type=int, nargs="+", help="run once per seed and report the spread (seeds mode)")
    parser.add_argument("--out", help="JSON output (default: benchmarks/results/main_job.json, or "
                                      "main_job_seeds.json with --seeds)")
    args = parser.parse_args()
    if args.seeds:
        args.out = args.out or str(REPO / "benchmarks" / "results" / "main_job_seeds.json")
        return run_seeds(args)
    args.out = args.out or str(REPO / "benchmarks" / "results" / "main_job.json")

    if args.keep and Path(args.keep).exists():
        shutil.rmtree(args.keep)  # the first run starts from scratch
    with scratch_dir(args.keep, "dapo-main-job-") as run_root:
        return run_once(args, run_root)


def run_once(args: argparse.Namespace, run_root: Path) -> int:
    """The main job from scratch with fresh caches, then (unless ``--no-rerun``) again over its
    cache; the step-time split of the first run; writes ``args.out``."""
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="dapo-main-job-caches-") as caches:
        first_s, summary = _run(args.config, args.set, run_root, _fresh_caches(Path(caches)))
    load_after = os.getloadavg()
    layout = RunLayout(Path(summary["run_dir"]))
    steps, evals = step_splits(layout, len(summary["step_seconds"]))
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
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
