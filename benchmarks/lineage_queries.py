"""How long the documented lineage questions take: every recipe of docs/LINEAGE.md run as a user
types it (`dapo audit ...`, `dapo lineage ...`: a fresh process each, DuckDB's start included)
against a finished run folder, repeated; wall and CPU seconds per command, and the machine's load.
Target (issue 48): about a second per query on the main job's 75-step run.

    .venv/bin/python benchmarks/lineage_queries.py --run-dir /tmp/copy-of-tiny-cpu [--repeats 5] [--problem ID]

The run folder is only read. ``--problem`` is the id the recipes' PROBLEM_ID stands for (default: the
problem the run trained on most). Writes benchmarks/results/lineage_queries.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from report_refresh import machine  # noqa: E402  (benchmarks/report_refresh.py)
from result_file import write_result  # noqa: E402  (benchmarks/result_file.py)
from tests.unit.test_lineage_recipes import DOC_RUN, recipes  # noqa: E402

DAPO = str(REPO / ".venv" / "bin" / "dapo")
AUDITOR_QUESTIONS = ("Which problems did the final policy train on most?", "Every +1 sample of problem X")


def most_trained_problem(run_dir: str) -> str:
    sql = "SELECT problem_id FROM batches GROUP BY problem_id ORDER BY count(*) DESC, problem_id LIMIT 1"
    out = subprocess.run([DAPO, "audit", run_dir, "--json", "--sql", sql], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["rows"][0]["problem_id"]


def time_command(argv: list[str], repeats: int) -> dict[str, object]:
    """Wall and CPU (user + system, the process and its children) seconds of ``dapo argv``, ``repeats`` times."""
    wall, cpu = [], []
    for _ in range(repeats):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run([DAPO, *argv], capture_output=True, text=True)
        wall.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        if proc.returncode != 0:
            raise SystemExit(f"dapo {shlex.join(argv)}: exit {proc.returncode}: {proc.stderr.strip()}")
    return {"command": f"dapo {shlex.join(argv)}", "wall_median_s": statistics.median(wall), "wall_min_s": min(wall),
            "cpu_median_s": statistics.median(cpu), "output_lines": len(proc.stdout.splitlines())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", required=True, help="a finished run folder (only read)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--problem", help="the problem id PROBLEM_ID stands for (default: the most trained one)")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "lineage_queries.json"))
    args = parser.parse_args()
    problem = args.problem or most_trained_problem(args.run_dir)
    load_before = os.getloadavg()[0]
    rows = []
    for question, commands in recipes().items():
        for argv in commands:
            argv = [args.run_dir if a == DOC_RUN else a.replace("PROBLEM_ID", problem) for a in argv]
            rows.append({"question": question, "auditor_question": question in AUDITOR_QUESTIONS,
                         **time_command(argv, args.repeats)})
    print(f"{'wall':>7} {'min':>7} {'cpu':>7}  question")
    for row in rows:
        print(f"{row['wall_median_s']:>6.2f}s {row['wall_min_s']:>6.2f}s {row['cpu_median_s']:>6.2f}s  "
              f"{'* ' if row['auditor_question'] else ''}{row['question']}")
    result = {"machine": {**machine(), "load_1m_before": f"{load_before:.2f}"}, "run_dir": args.run_dir,
              "problem": problem, "repeats": args.repeats, "target_s": 1.0, "queries": rows}
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
