"""The main job three ways, the plain local run and two on a Ray cluster: the same checkpoint ids, and the speed.

Runs `dapo run --config configs/tiny-cpu.yaml` (all 75 steps unless ``--steps``) three times, one after the
other on this machine:

- ``in-process``: the plain local run (the vLLM engine and the warm DeepSpeed group in the driver);
- ``persistent actors``: the same command with ``DAPO_ENGINES_RAY_ADDRESS`` naming a two-node
  ``ray.cluster_utils.Cluster`` started here (one CPU and one logical GPU per node), so every rollout and
  evaluation round runs on the run's named, detached engine actors and every train step on its train host
  (settings/rollout.py: EngineHosting; engines/train/ray_host.py), as the tasks of a cluster would;
- ``restarted every call``: on the same cluster, every rollout and evaluation call on engine actors started
  for it and removed after it (benchmarks/restarted_every_call.py), and every train step a cold launch
  (``train.keep_workers_warm=false``): open-source Flyte's RayJob per call and fresh train pods, without the
  pods' and Ray's own starts.

Every checkpoint id of the three runs must be equal, and the held-out results too (checked: exit 1 and the
first differing step otherwise). Prints each way's steps/min over the step loop (evaluations excluded, as
benchmarks/main_job.py counts them), the ratios to in-process, and the 1-minute load average over each run.
The driver's task calls run in one process every way: a cluster's fresh task pod per call (its start,
imports and Ray attach) is not in this figure; benchmarks/warm_engines.py measures that over 3 steps.
Writes benchmarks/results/main_job_hosted.json (``--out``).

    .venv/bin/python benchmarks/main_job_hosted.py [--steps N] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from local_ray import logical_gpu_nodes  # noqa: E402  (benchmarks/local_ray.py)
from machine import cpu_model  # noqa: E402  (benchmarks/machine.py)
from main_job import REPO, LoadSampler, _commit, _run, step_times  # noqa: E402
from result_file import write_result  # noqa: E402
from scratch import scratch_dir  # noqa: E402

import schemas  # noqa: E402
from settings.rollout import ENGINES_NAMESPACE_ENV, ENGINES_RAY_ADDRESS_ENV  # noqa: E402
from storage import checkpoints  # noqa: E402
from storage.run_layout import RunLayout  # noqa: E402

WAYS = ("in-process", "persistent actors", "restarted every call")
RESTARTED = [sys.executable, str(Path(__file__).resolve().parent / "restarted_every_call.py")]  # + the Ray address


# Each way's own settings on top of this process's environment, which main() clears of every Ray address
# (main_job._run starts a run with os.environ and then these): the plain way must attach to no Ray.
PLAIN_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
RAY_ADDRESSES = ("RAY_ADDRESS", ENGINES_RAY_ADDRESS_ENV, ENGINES_NAMESPACE_ENV)


def _way(name: str, config: str, sets: list[str], root: Path, env: dict[str, str],
         dapo: list[str] | None = None) -> dict[str, Any]:
    """One run of the main job (``dapo``: the command standing for `dapo`); its ids, held-out results and speed."""
    print(f"{name}: running ...", flush=True)
    with LoadSampler() as sampler:
        seconds, summary = _run(config, [*sets, f"run.name={name.replace(' ', '-')}"], root, env, dapo)
    layout = RunLayout(Path(summary["run_dir"]))
    steps = summary["steps"]
    step_s = step_times(layout, steps)[0]
    result = {
        "way": name, "wall_s": round(seconds, 1), "pipeline_s": summary["wall_seconds"],
        "steps_per_min": round(60 * steps / sum(step_s), 2), "step_s_mean": round(sum(step_s) / steps, 3),
        "accuracy_before": summary["accuracy_before"], "accuracy_after": summary["accuracy_after"],
        "load": sampler.stats(),
        "ids": [checkpoints.read_info(layout.checkpoint(s)).checkpoint_id for s in range(steps + 1)],
    }
    print(f"{name}: {result['steps_per_min']} steps/min, {result['accuracy_before']:.3f} -> "
          f"{result['accuracy_after']:.3f}, load {result['load']}", flush=True)
    result["evals"] = {s: schemas.read_shard(layout.eval_shard(s), schemas.EvalResult)
                       for s in range(steps + 1) if Path(str(layout.eval_shard(s))).exists()}
    return result


def first_difference(a: dict[str, Any], b: dict[str, Any]) -> str | None:
    """The first checkpoint or held-out result on which two ways differ, or None."""
    for step, (x, y) in enumerate(zip(a["ids"], b["ids"], strict=True)):
        if x != y:
            return f"checkpoint of step {step}: {x} vs {y}"
    for step, table in a["evals"].items():
        if not b["evals"][step].equals(table):
            return f"held-out results of step {step}"
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(REPO / "configs" / "tiny-cpu.yaml"))
    parser.add_argument("--steps", type=int, help="run.steps (default: the config's)")
    parser.add_argument("--keep", help="keep the run folders under this directory")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "main_job_hosted.json"))
    args = parser.parse_args()
    if args.steps is not None and args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    sets = [] if args.steps is None else [f"run.steps={args.steps}"]

    for key in RAY_ADDRESSES:
        os.environ.pop(key, None)
    with scratch_dir(args.keep, "dapo-main-job-hosted-") as root:
        plain = _way(WAYS[0], args.config, sets, root / "plain", PLAIN_ENV)
        with logical_gpu_nodes(2) as address:
            env = PLAIN_ENV | {ENGINES_RAY_ADDRESS_ENV: address, ENGINES_NAMESPACE_ENV: f"bench-{uuid.uuid4().hex[:8]}"}
            hosted = _way(WAYS[1], args.config, sets, root / "hosted", env)
            restarted = _way(WAYS[2], args.config, [*sets, "train.keep_workers_warm=false"], root / "restarted",
                             PLAIN_ENV, [*RESTARTED, address])
    ways = (plain, hosted, restarted)
    differs = next((f"{way['way']}: {d}" for way in ways[1:] if (d := first_difference(plain, way))), None)
    ratios = {way["way"]: round(way["steps_per_min"] / plain["steps_per_min"], 3) for way in ways[1:]}
    print(f"commit {_commit()}, cpu {cpu_model()}; {len(plain['ids']) - 1} steps")
    print(f"checkpoint ids and held-out results: {'EQUAL' if differs is None else 'DIFFER at ' + differs}")
    print("steps/min: " + ", ".join(f"{way['way']} {way['steps_per_min']}" for way in ways)
          + "; over in-process: " + ", ".join(f"{name} {ratio:.2f}" for name, ratio in ratios.items()))
    write_result(args.out, {
        "commit": _commit(), "cpu": cpu_model(), "cores": os.cpu_count(), "config": args.config,
        "overrides": sets, "equal": differs is None, "first_difference": differs, "over_in_process": ratios,
        "ways": [{k: v for k, v in way.items() if k != "evals"} for way in ways],
    })
    return 0 if differs is None else 1


if __name__ == "__main__":
    raise SystemExit(main())
