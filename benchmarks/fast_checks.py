"""Time one validation of a step's shards: pandera vs the vectorised checks (schemas/fast_checks.py).

Reads the shards one step of a finished run wrote (rollout, scored, batch, surplus, the train
task's StepMetrics row, the step's metrics row) and times, per shard, ``model.validate`` (pandera,
what ``validate_table`` ran before) and ``fast_checks.passes`` (what it runs first now), median of
``--repeats``. Prints a table and writes benchmarks/results/fast_checks.json.

    python benchmarks/fast_checks.py RUN_DIR [--step 3] [--repeats 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from machine import cpu_model  # noqa: E402  (benchmarks/machine.py)
from result_file import write_result  # noqa: E402  (benchmarks/result_file.py)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import pyarrow.parquet as pq  # noqa: E402

import schemas  # noqa: E402
from schemas import fast_checks  # noqa: E402


def _median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("--step", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "fast_checks.json"))
    args = parser.parse_args()
    run, step = Path(args.run_dir), f"step-{args.step:04d}"
    shards = [
        ("rollout", run / "steps" / step / "rollouts" / "round-00.parquet", schemas.Rollout),
        ("scored", run / "steps" / step / "scored" / "round-00.parquet", schemas.ScoredRollout),
        ("batch", run / "steps" / step / "batch.parquet", schemas.ScoredRollout),
        ("surplus", run / "steps" / step / "surplus.parquet", schemas.ScoredRollout),
        ("train metrics row", run / "checkpoints" / step / "train_metrics.parquet", schemas.StepMetrics),
        ("step metrics row", run / "steps" / step / "metrics.parquet", schemas.StepMetrics),
    ]
    load_before = os.getloadavg()
    rows = []
    for name, path, model in shards:
        table = pq.read_table(path).replace_schema_metadata(schemas.arrow_schema(model).metadata)
        assert fast_checks.passes(table, model), f"{path}: not valid for the fast checks"
        model.validate(table, lazy=True)  # warm both (imports, plan)
        rows.append({"shard": name, "rows": table.num_rows, "model": model.__name__,
                     "pandera_ms": round(_median_ms(lambda: model.validate(table, lazy=True), args.repeats), 2),
                     "fast_ms": round(_median_ms(lambda: fast_checks.passes(table, model), args.repeats), 3)})
    result = {
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                 text=True).stdout.strip(),
        "cpu": cpu_model(), "run_dir": str(run), "step": args.step, "repeats": args.repeats,
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "shards": rows,
        "total_pandera_ms": round(sum(r["pandera_ms"] for r in rows), 1),
        "total_fast_ms": round(sum(r["fast_ms"] for r in rows), 2),
    }
    print(f"{'shard':20s} {'model':14s} {'rows':>5s} {'pandera ms':>11s} {'fast ms':>8s}")
    for r in rows:
        print(f"{r['shard']:20s} {r['model']:14s} {r['rows']:5d} {r['pandera_ms']:11.1f} {r['fast_ms']:8.2f}")
    print(f"{'all six':41s} {result['total_pandera_ms']:11.1f} {result['total_fast_ms']:8.2f}   "
          f"load {result['load_average_before']} -> {result['load_average_after']}")
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
