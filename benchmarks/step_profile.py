"""Where a DAPO step's time goes in the driver process: a sampling profile of `dapo run`.

Runs ``dapo run`` in this process with a sampler thread that reads every thread's Python stack
every ``--interval-ms`` (``sys._current_frames``; py-spy's idea without py-spy) and keeps the
samples of the thread that runs the driver task (its stack holds ``workflows/driver.py``). The
driver runs every task in-process in local Flyte mode, so this covers rollout, scoring, shard
I/O, the train task's launch and wait, checkpoint publish, digests and Flyte's bookkeeping; the
DeepSpeed workers' own split is in each checkpoint's ``train_timings.json``.

Each sample is charged to the first matching span of ``SPANS`` (innermost frame first), so the
shares are exclusive: "generation" is vLLM's work, "train: waiting on workers" the driver
blocked on the warm worker group, and so on. Steady state is every step after ``--warm-steps``
(default 2). Prints a table and writes benchmarks/results/step_profile-<label>.json.

    OMP_NUM_THREADS=1 python benchmarks/step_profile.py --set run.steps=6 --label before
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from scratch import scratch_dir  # (benchmarks/scratch.py)
from result_file import write_result  # noqa: E402  (benchmarks/result_file.py)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# (span, predicate on "file:function" frames), matched innermost frame first: the first frame
# (from the leaf up) that matches any span charges the sample to that span.
SPANS: list[tuple[str, tuple[str, ...]]] = [
    ("generation (vLLM)", ("vllm/", "engines/rollout/vllm_engine.py:generate", "engines/rollout/stage.py:_generate")),
    ("train: waiting on workers", ("engines/train/server.py:", "engines/train/launch.py:_wait")),
    ("pandera validation", ("pandera/",)),
    ("parquet read/write", ("pyarrow/parquet", "schemas/shards.py:write_shard", "schemas/shards.py:read_shard")),
    ("digests (sha256, records)", ("storage/digests.py:",)),
    ("reward verdicts (pool)", ("engines/score/verifier_pool.py:", "dapo_core/rewards.py:")),
    ("checkpoint publish/copy", ("storage/checkpoints.py:", "engines/train/publish.py:")),
    ("report refresh", ("reports/run.py:", "reports/svg_charts.py:")),
    ("tracking", ("tracking/",)),
    ("retention", ("storage/pruning.py:", "storage/retention_policy.py:")),
    ("Flyte bookkeeping", ("flyte/", "flyte_", "grpc/", "google/protobuf", "sqlite3", "aiosqlite", "obstore")),
]


# Spans charged when their frame is anywhere in the stack, before the innermost-first pass: the
# weight reload and the prompts' tokenisation run inside vLLM's and transformers' own frames,
# which the pass above would charge to generation.
ENCLOSING_SPANS: list[tuple[str, tuple[str, ...]]] = [
    ("vLLM weight reload", ("engines/rollout/vllm_engine.py:reload_weights",)),
    ("prompt tokenisation", ("engines/rollout/stage.py:tokenize_prompts",)),
]


def _span(stack: list[str]) -> str:
    for name, needles in ENCLOSING_SPANS:
        if any(n in frame for frame in stack for n in needles):
            return name
    for frame in stack:  # innermost first
        for name, needles in SPANS:
            if any(n in frame for n in needles):
                return name
    return "other Python (driver, scoring math, shard columns)"


_IDLE_LEAVES = ("selectors.py:select", "threading.py:wait", "threading.py:_wait_for_tstate_lock", "queue.py:get",
                "base_events.py:_run_once", "time.sleep", "connection.py:wait", "connection.py:_poll")


def _is_idle(stack: list[str]) -> bool:
    return any(leaf in stack[0] for leaf in _IDLE_LEAVES)


class Sampler(threading.Thread):
    """Every ``interval`` seconds, one (time, span, leaf frames) for the driver process.

    A coroutine that awaits is on no thread's stack, so each tick looks at every thread: a task
    body (a thread whose stack holds ``tasks/``, waiting included: waiting on the train workers
    or the verifier pool is that task's time) wins; else the driver's own code when it runs; else
    any other busy thread (Flyte's loop, gRPC, SQLite: bookkeeping); else the tick is idle.
    """

    def __init__(self, interval: float) -> None:
        super().__init__(daemon=True)
        self.interval, self.samples = interval, []
        self.stop = threading.Event()

    def run(self) -> None:
        me = threading.get_ident()
        while not self.stop.wait(self.interval):
            now = time.perf_counter()
            task, driver, busy = None, None, None
            for tid, frame in sys._current_frames().items():
                if tid == me:
                    continue
                stack, f = [], frame
                while f is not None:
                    stack.append(f"{f.f_code.co_filename}:{f.f_code.co_name}")
                    f = f.f_back
                if any(f"{REPO}/tasks/" in s for s in stack):
                    task = stack
                elif any("workflows/driver.py" in s for s in stack) and not _is_idle(stack):
                    driver = stack
                elif not _is_idle(stack):
                    busy = stack
            stack = task or driver or busy
            if stack is None:
                self.samples.append((now, "idle (nothing running in the driver process)", ()))
                continue
            span = _span(stack) if (task or driver) else "Flyte bookkeeping"
            if task and span.startswith("other") and _is_idle(stack):
                span = "task waiting (other)"
            self.samples.append((now, span, tuple(_short(s) for s in stack[:3])))


def _short(frame: str) -> str:
    path, _, func = frame.rpartition(":")
    parts = Path(path).parts
    return f"{'/'.join(parts[-2:])}:{func}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(REPO / "configs" / "tiny-cpu.yaml"))
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--warm-steps", type=int, default=2, help="steps before steady state")
    parser.add_argument("--interval-ms", type=float, default=5.0)
    parser.add_argument("--label", default="now")
    parser.add_argument("--run-root", help="default: a new temporary folder")
    args = parser.parse_args()

    from cli import main as cli
    from workflows import progress

    ends: list[float] = []
    original = progress.step_done

    def step_done(report: progress.StepReport) -> None:
        ends.append(time.perf_counter())
        original(report)

    progress.step_done = step_done
    load_before = os.getloadavg()
    sampler = Sampler(args.interval_ms / 1000)
    with scratch_dir(args.run_root, "dapo-profile-") as run_root:
        argv = ["run", "--config", args.config, "--run-root", str(run_root)]
        for item in args.set:
            argv += ["--set", item]
        sampler.start()
        started = time.perf_counter()
        rc = cli.main(argv)
        wall = time.perf_counter() - started
        sampler.stop.set()
        sampler.join()
    if rc != 0:
        sys.exit(f"dapo run exited {rc}")
    if len(ends) <= args.warm_steps:
        sys.exit(f"only {len(ends)} steps: give more than --warm-steps={args.warm_steps}")
    lo, hi = ends[args.warm_steps - 1], ends[-1]
    window = [(span, leaf) for t, span, leaf in sampler.samples if lo <= t <= hi]
    spans = Counter(span for span, _ in window)
    leafs = Counter(leaf for span, leaf in window if span.startswith(("other", "task waiting", "Flyte")))
    seconds_per_sample = (hi - lo) / max(1, len(window))
    steady_steps = len(ends) - args.warm_steps
    result = {
        "label": args.label,
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                 text=True).stdout.strip(),
        "overrides": args.set,
        "wall_s": round(wall, 1),
        "steady_steps": steady_steps,
        "steady_seconds_per_step": round((hi - lo) / steady_steps, 3),
        "step_end_times_s": [round(t - started, 2) for t in ends],
        "samples": len(window),
        "per_step_s": {k: round(v * seconds_per_sample / steady_steps, 4) for k, v in spans.most_common()},
        "share": {k: round(v / len(window), 4) for k, v in spans.most_common()},
        "top_other_stacks": [[list(k), v] for k, v in leafs.most_common(25)],
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
    }
    print(f"steady state: steps {args.warm_steps + 1}..{len(ends)}, {result['steady_seconds_per_step']} s/step, "
          f"load {result['load_average_before']} -> {result['load_average_after']}")
    print(f"{'span':52s} {'s/step':>8s} {'share':>7s}")
    for k, v in result["per_step_s"].items():
        print(f"{k:52s} {v:8.3f} {result['share'][k]:7.1%}")
    out = REPO / "benchmarks" / "results" / f"step_profile-{args.label}.json"
    write_result(out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
