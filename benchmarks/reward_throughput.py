"""Benchmark: rule-reward verdicts per second (dapo_core.rewards.score_responses on the pipeline's
verifier pool, engines/score/verifier_pool.py).

Three workloads, each scored with 1 and 2 worker processes on a warm pool:

- ordinary:        DAPO-style responses (~1 KB of reasoning, then "Answer: N"; some boxed, some
                   wrong, some without an answer) against integer golds. Most verdicts take the
                   exact integer fast path; this is what a training step actually scores.
- ordinary_mv:     the same responses with the integer fast path off: every verdict through math-verify.
- math_verify:     non-trivial answers ("\\frac{2N}{2}", "N.0", "x = N") that only math-verify can judge.

Gold answers come from ../shared/data/dapo-math-17k.dedup.parquet when present (synthetic
integers otherwise). Target: >= 2,000 verdicts/s on 2 cores for ordinary answers.

Run:  .venv/bin/python benchmarks/reward_throughput.py [--n 4000] [--repeats 3]
Writes benchmarks/results/reward_throughput.json.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import time
from pathlib import Path

from dapo_core.rewards import (
    REWARD_VERSION,
    score_responses,
    summarize_verdicts,
)
from engines.score.verifier_pool import process_judge, shutdown_verifier_pool
from result_file import write_result  # noqa: E402  (benchmarks/result_file.py)

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / ".." / "shared" / "data" / "dapo-math-17k.dedup.parquet"
RESULTS = REPO / "benchmarks" / "results" / "reward_throughput.json"
TARGET_VERDICTS_PER_S = 2000.0

_FILLER = (
    "We first rewrite the condition in terms of the unknown and simplify both sides. "
    "Substituting the value found above and collecting like terms gives a linear equation. "
)


def load_golds(n: int, rng: random.Random) -> tuple[list[int], str]:
    if DATA.exists():
        import pyarrow.parquet as pq

        column = pq.read_table(DATA, columns=["reward_model"]).column("reward_model").to_pylist()
        answers = [int(row["ground_truth"]) for row in column]
        return [rng.choice(answers) for _ in range(n)], f"{DATA.name} ground truths"
    return [rng.randint(-50, 10_000) for _ in range(n)], "synthetic integers"


def ordinary_responses(golds: list[int], rng: random.Random) -> list[str]:
    responses = []
    for gold in golds:
        body = _FILLER * rng.randint(4, 10)
        kind = rng.random()
        if kind < 0.45:
            responses.append(f"{body}\nAnswer: {gold}")
        elif kind < 0.80:
            responses.append(f"{body}\nAnswer: {gold + rng.randint(1, 9)}")
        elif kind < 0.95:
            responses.append(f"{body} Hence the answer is $\\boxed{{{gold}}}$.")
        else:
            responses.append(body)  # truncated: no answer
    return responses


def math_verify_responses(golds: list[int], rng: random.Random) -> list[str]:
    forms = ("\\frac{{{double}}}{{2}}", "{gold}.0", "x = {gold}", "\\frac{{{double}}}{{2}} + 1")
    return [
        f"{_FILLER * 3}\nAnswer: " + rng.choice(forms).format(gold=gold, double=2 * gold) for gold in golds
    ]


def measure(responses: list[str], golds: list[int], workers: int, fast_path: bool, repeats: int) -> dict:
    shutdown_verifier_pool()
    score_responses(responses[:200], golds[:200], judge=process_judge(workers), integer_fast_path=fast_path)  # warm pool
    rates = []
    correct: set[int] = set()
    timeouts = errors = 0
    for _ in range(repeats):
        started = time.perf_counter()
        verdicts = score_responses(responses, golds, judge=process_judge(workers), integer_fast_path=fast_path)
        rates.append(len(responses) / (time.perf_counter() - started))
        counts = summarize_verdicts(verdicts)
        correct.add(counts.correct)
        timeouts += counts.timeout  # summed over repeats: a timeout in any run must show
        errors += counts.error
    return {
        "workers": workers,
        "n": len(responses),
        "verdicts_per_s_median": round(statistics.median(rates), 1),
        "verdicts_per_s_all": [round(r, 1) for r in rates],
        "correct": sorted(correct)[0] if len(correct) == 1 else sorted(correct),
        "timeouts_all_runs": timeouts,
        "errors_all_runs": errors,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=4000, help="responses per workload")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats per row (median reported)")
    args = parser.parse_args()
    rng = random.Random(0)
    golds, gold_source = load_golds(args.n, rng)
    ordinary = ordinary_responses(golds, rng)
    workloads = {
        "ordinary": (ordinary, True),
        "ordinary_mv": (ordinary, False),  # same responses: verdicts must match the fast path's
        "math_verify": (math_verify_responses(golds, rng), True),
    }
    rows = []
    load_before = os.getloadavg()
    for name, (responses, fast_path) in workloads.items():
        for workers in (1, 2):
            row = {"workload": name, **measure(responses, golds, workers, fast_path, args.repeats)}
            rows.append(row)
            print(f"{name:<12} workers={workers}  {row['verdicts_per_s_median']:>10,.0f} verdicts/s  "
                  f"(runs: {', '.join(f'{r:,.0f}' for r in row['verdicts_per_s_all'])}; "
                  f"correct {row['correct']}/{row['n']}, timeouts {row['timeouts_all_runs']}, "
              f"errors {row['errors_all_runs']})")
    shutdown_verifier_pool()
    fast = {r["correct"] for r in rows if r["workload"] == "ordinary"}
    slow = {r["correct"] for r in rows if r["workload"] == "ordinary_mv"}
    fast_path_agrees = fast == slow
    print(f"integer fast path and math-verify agree on ordinary answers: {fast_path_agrees} ({fast} vs {slow})")
    ordinary_2 = next(r for r in rows if r["workload"] == "ordinary" and r["workers"] == 2)
    meets = ordinary_2["verdicts_per_s_median"] >= TARGET_VERDICTS_PER_S
    print(f"target >= {TARGET_VERDICTS_PER_S:,.0f} verdicts/s (ordinary, 2 workers): {'MET' if meets else 'NOT MET'}")
    result = {
        "benchmark": "reward_throughput",
        "reward_version": REWARD_VERSION,
        "gold_source": gold_source,
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load_avg_before": [round(x, 2) for x in load_before],
        "load_avg_after": [round(x, 2) for x in os.getloadavg()],
        "target_verdicts_per_s": TARGET_VERDICTS_PER_S,
        "target_met": meets,
        "fast_path_agrees_with_math_verify": fast_path_agrees,
        "rows": rows,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    write_result(RESULTS, result)


if __name__ == "__main__":
    main()
