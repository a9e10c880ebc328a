"""What a config's step loop costs for an assumed solve-rate distribution (no model, seconds).

Runs the driver's real step loop (workflows/step_loop.py) over simulated stages
(workflows/step_simulation.py): every problem has a solve rate drawn from Beta(a, b), with given
shares pinned at exactly 0 (never solved) and 1 (always solved); a group of G samples has a
binomial number of correct answers, and dynamic sampling (paper sec. 3.2) keeps 0 < correct < G.
The policy does not learn in the simulation, so each scenario is one phase of a real run (early:
few problems solved; late: many solved by every sample).

Prints, per scenario and seed: generation rounds per step, samples generated per trained
sample, surplus carried (mean, max), largest policy lag of a carried group, partial and skipped
steps, epochs of the pool covered; writes benchmarks/results/sampling_plan.json.

    .venv/bin/python benchmarks/sampling_plan.py --config configs/qwen2.5-32b-dapo.yaml --pool 17200
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from workflows.config import load_config  # noqa: E402
from workflows.step_loop import LoopSettings  # noqa: E402
from workflows.step_simulation import beta_solve_rates, simulate  # noqa: E402
from result_file import write_result  # noqa: E402  (benchmarks/result_file.py)

# (name, Beta a, Beta b, share never solved, share always solved): assumptions, not measurements.
SCENARIOS = {
    "early": (0.5, 2.0, 0.30, 0.02),  # a base model on hard problems: most groups all-wrong
    "middle": (1.0, 1.0, 0.15, 0.10),
    "late": (2.0, 1.0, 0.05, 0.30),  # many problems solved by every sample: all-correct groups
}


def plan_one(loop: LoopSettings, pool: int, group: int, scenario: tuple[float, float, float, float]) -> dict[str, float]:
    a, b, failed, solved = scenario
    ids = [f"q{i:06d}" for i in range(pool)]
    rates = beta_solve_rates(ids, a=a, b=b, all_failed=failed, all_solved=solved, seed=loop.seed)
    started = time.perf_counter()
    plans, stages = simulate(loop, rates, group)
    trained = sum(len(p.result.kept) for p in plans) * group
    drawn = sum(len(ids) for p in plans for ids in p.requests)
    surplus = [len(p.result.surplus) for p in plans]
    return {
        "rounds_per_step_mean": statistics.mean(p.result.rounds for p in plans),
        "rounds_per_step_max": max(p.result.rounds for p in plans),
        "generated_per_trained_sample": stages.samples_generated / trained if trained else float("inf"),
        "surplus_groups_mean": statistics.mean(surplus),
        "surplus_groups_max": max(surplus),
        "max_policy_lag_steps": max((max(p.policy_lags(), default=0) for p in plans), default=0),
        "partial_steps": sum(p.result.outcome == "partial" for p in plans),
        "skipped_steps": sum(p.result.outcome == "skipped" for p in plans),
        "epochs_covered": drawn / pool,
        "simulated_in_s": time.perf_counter() - started,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/qwen2.5-32b-dapo.yaml")
    parser.add_argument("--pool", type=int, required=True, help="training problems after curation")
    parser.add_argument("--steps", type=int, default=0, help="override run.steps (0 = the config's)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=list(SCENARIOS))
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "sampling_plan.json"))
    args = parser.parse_args()

    cfg = load_config(args.config, [])
    drv = cfg.run
    group = cfg.rollout.samples_per_prompt
    header = ("scenario", "seed", "rounds/step", "max rounds", "gen/trained", "surplus mean", "surplus max",
              "max lag", "partial", "skipped", "epochs")
    print(f"{args.config}: {drv.prompts_per_step} groups of {group} per step from {drv.prompts_per_round}-prompt rounds, "
          f"max_rounds {drv.max_rounds} ({drv.on_max_rounds}), pool {args.pool}")
    print(" | ".join(header))
    rows = []
    for name in args.scenarios:
        for seed in args.seeds:
            loop = LoopSettings(steps=args.steps or drv.steps, prompts_per_step=drv.prompts_per_step,
                                prompts_per_round=drv.prompts_per_round, max_rounds=drv.max_rounds,
                                on_max_rounds=drv.on_max_rounds, seed=seed, round_size=drv.round_size)
            r = plan_one(loop, args.pool, group, SCENARIOS[name])
            rows.append({"scenario": name, "seed": seed, **r})
            print(f"{name} | {seed} | {r['rounds_per_step_mean']:.2f} | {r['rounds_per_step_max']} | "
                  f"{r['generated_per_trained_sample']:.2f} | {r['surplus_groups_mean']:.0f} | {r['surplus_groups_max']} | "
                  f"{r['max_policy_lag_steps']} | {r['partial_steps']} | {r['skipped_steps']} | {r['epochs_covered']:.2f}")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    out = {"config": args.config, "pool": args.pool, "steps": args.steps or drv.steps, "group": group,
           "scenarios": {k: dict(zip(("beta_a", "beta_b", "never_solved", "always_solved"), v)) for k, v in SCENARIOS.items()},
           "rows": rows, "commit": commit, "cpu": platform.processor() or platform.machine()}
    write_result(args.out, out)


if __name__ == "__main__":
    main()
