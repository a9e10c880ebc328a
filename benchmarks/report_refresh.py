"""What one refresh of the run page costs, the redraw the driver does after every training step.

Builds the page (nine SVG charts, the tables, the headline) exactly as the driver does
(reports/run.py: write_report) from synthetic run data of N steps (tests/report_data.py:
realistic values and shapes) with the status "running", and times it several times per size.
With ``--run-dir`` it also reads that run's measured step times and prints the refresh as a
share of a step (both measured on this machine). Target: at most 0.3 s per step on the tiny
config (issue: the pages users look at). Writes benchmarks/results/report_refresh.json.

    .venv/bin/python benchmarks/report_refresh.py [--steps 20 200 1000] [--repeats 7] [--run-dir runs/NAME]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.report_data import run_data  # noqa: E402
from reports.run import write_report  # noqa: E402
from result_file import write_result  # noqa: E402  (benchmarks/result_file.py)


def time_refresh(steps: int, repeats: int) -> dict[str, float]:
    data = run_data(steps)
    summary = {**data["summary"], "status": "running", "steps_done": steps, "steps": steps * 2}
    seconds: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(repeats + 1):  # the first is a warm-up (imports, caches)
            t0 = time.perf_counter()
            _, page = write_report(Path(tmp), title="DAPO run bench", summary=summary, metrics=data["metrics"],
                                   evals=data["evals"], samples=[])
            seconds.append(time.perf_counter() - t0)
    timed = seconds[1:]
    return {"steps": steps, "repeats": repeats, "median_s": statistics.median(timed), "min_s": min(timed),
            "max_s": max(timed), "page_bytes": len(page.encode())}


def machine() -> dict[str, str]:
    cpu = "unknown"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    return {"cpu": cpu, "cores": str(os.cpu_count()), "load_1m": f"{os.getloadavg()[0]:.2f}", "commit": commit,
            "python": platform.python_version()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[20, 200, 1000])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--run-dir", help="a finished run folder: compare with its measured step times")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "report_refresh.json"))
    args = parser.parse_args()
    rows = [time_refresh(n, args.repeats) for n in args.steps]
    print(f"{'steps':>6} {'median':>9} {'min':>9} {'max':>9} {'page':>9}")
    for r in rows:
        print(f"{r['steps']:>6} {r['median_s'] * 1000:>7.1f}ms {r['min_s'] * 1000:>7.1f}ms {r['max_s'] * 1000:>7.1f}ms "
              f"{r['page_bytes'] / 1024:>7.0f}kB")
    result: dict[str, object] = {"machine": machine(), "refresh": rows, "target_s_per_step": 0.3}
    if args.run_dir:
        summary = json.loads((Path(args.run_dir) / "summary.json").read_text())
        step_s = statistics.median(summary["step_seconds"])
        own = time_refresh(len(summary["step_seconds"]), args.repeats)["median_s"]
        result["run"] = {"run_dir": args.run_dir, "step_median_s": step_s, "refresh_median_s": own,
                         "refresh_share_of_step": own / step_s}
        print(f"run {args.run_dir}: step median {step_s:.1f} s, refresh {own * 1000:.1f} ms = {own / step_s:.3%} of a step")
    write_result(args.out, result)
    print(f"machine: {result['machine']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
