"""Benchmark DAPO training steps (engines/train/launch.py), cold vs warm: per-step time and where it goes.

Builds the tiny default policy (random weights, engines/bootstrap/tiny_policy.py) and ScoredRollout batches
shaped like the tiny pipeline's (prompts x G samples, synthetic token ids), then runs ``--steps``
consecutive steps (each from the previous published checkpoint, as the pipeline does) for each
process count, twice: **cold** (``keep_workers_warm=False``: one torchrun launch per step) and
**warm** (the default: one worker group serves every step of this process; the first warm step
includes starting it). Prints a table and writes ``benchmarks/results/train_step.json``.

    .venv/bin/python benchmarks/train_step.py [--prompts 16] [--group 8] [--processes 1 2] [--steps 3]

Per step: ``load`` (engine construction incl. resuming optimizer state; cold: from process start,
warm: ~0 when the engine continues from memory), ``old_lp`` (recomputing pi_old's log-probs),
``updates`` (all mini-batch updates), ``save`` (DeepSpeed state + HF export), ``overhead``
(everything else in ``total``: process start and imports, mailbox, validation, publishing),
``total`` (train_step wall clock) and ``not_lp_upd`` = the share of ``total`` that is not old
log-probs or updates. ``tok/s step`` is response tokens in the loss / total.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "integration"))

from train_fixtures import scored_row, write_scored  # noqa: E402

from engines.train import server as train_server
from engines.bootstrap.tiny_policy import build_random_checkpoint  # noqa: E402
from engines.train.launch import train_step
from engines.train.publish import TrainStepResult
from settings.train import TrainConfig  # noqa: E402
from result_file import write_result  # noqa: E402  (benchmarks/result_file.py)


def make_batch(path: Path, *, prompts: int, group: int, vocab: int, prompt_tokens: int, max_response: int,
               seed: int) -> Path:
    """``prompts`` groups of ``group`` samples with random tokens, lengths and +/-1 advantages."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for p in range(prompts):
        prompt = torch.randint(3, vocab, (prompt_tokens,), generator=g).tolist()
        for i in range(group):
            n = int(torch.randint(max_response // 4, max_response + 1, (1,), generator=g))
            rows.append(scored_row(f"p{p}-s{i}", prompt, torch.randint(3, vocab, (n,), generator=g).tolist(),
                                   1.0 if i % 2 == 0 else -1.0, log_probs=(-torch.rand(n, generator=g) * 3).tolist(),
                                   sample_index=i))
    return write_scored(path, rows)


def step_row(res: TrainStepResult, *, processes: int, mode: str, step: int) -> dict[str, Any]:
    """One table row: the step's timing split (seconds) and the share that is not compute."""
    t = res.timings
    total = t["time_train_s"]
    known = {k: t.get(k, 0.0) for k in ("load_s", "batch_s", "old_log_probs_s", "updates_s", "save_export_s")}
    compute = known["old_log_probs_s"] + known["updates_s"]
    return {
        "processes": processes,
        "mode": mode,
        "step": step,
        "continued_in_memory": bool(t.get("continued_in_memory", 0.0)),
        "group_started": bool(t.get("group_started", 0.0)),
        "samples": res.metrics["samples"],
        "tokens": res.metrics["tokens"],
        **known,
        "overhead_s": total - sum(known.values()),
        "total_s": total,
        "not_old_lp_or_updates_share": 1.0 - compute / total,
        "tokens_per_s_updates": res.metrics["tokens"] / known["updates_s"],
        "tokens_per_s_step": res.metrics["tokens"] / total,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group", type=int, default=8, help="G samples per prompt")
    parser.add_argument("--prompt-tokens", type=int, default=14)
    parser.add_argument("--max-response-tokens", type=int, default=64)
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--steps", type=int, default=3, help="consecutive steps per mode")
    parser.add_argument("--modes", nargs="+", default=["cold", "warm"], choices=["cold", "warm"])
    parser.add_argument("--micro-batch-samples", type=int, default=16)
    parser.add_argument("--updates-per-step", type=int, default=2)
    parser.add_argument("--zero-stage", type=int, default=1)
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--threads-per-process", type=int, default=1,
                        help="OMP_NUM_THREADS of each worker (oversubscribed threads are 10x slower on a busy machine)")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "train_step.json"))
    args = parser.parse_args()
    torch.set_flush_denormal(True)
    os.environ["OMP_NUM_THREADS"] = str(args.threads_per_process)  # the launched workers inherit it
    load_before = os.getloadavg()

    results = []
    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
        root = Path(tmp)
        ck0 = build_random_checkpoint(root / "ck0", seed=0)  # the tiny default: 3 layers, hidden 128
        vocab = json.loads((ck0 / "config.json").read_text())["vocab_size"]
        shards = [make_batch(root / f"batch{s}.parquet", prompts=args.prompts, group=args.group, vocab=vocab,
                             prompt_tokens=args.prompt_tokens, max_response=args.max_response_tokens, seed=s)
                  for s in range(1, args.steps + 1)]
        base = TrainConfig(micro_batch_samples=args.micro_batch_samples, updates_per_step=args.updates_per_step,
                           zero_stage=args.zero_stage, precision=args.precision, lr=1e-4, warmup_steps=0)
        for n in args.processes:
            for mode in args.modes:
                config = replace(base, num_processes=n, keep_workers_warm=mode == "warm")
                train_server.stop_active()  # the first warm step starts its own group
                parent = ck0
                for step, shard in enumerate(shards, start=1):
                    res = train_step(parent, [shard], root / f"{mode}-{n}" / f"ck{step}", step=step, config=config)
                    parent = Path(res.checkpoint_dir)
                    results.append({**step_row(res, processes=n, mode=mode, step=step), "config": asdict(config)})
                train_server.stop_active()

    header = f"{'procs':>5} {'mode':>4} {'step':>4} {'load':>6} {'old_lp':>6} {'updates':>7} {'save':>6} " \
             f"{'overhead':>8} {'total':>6} {'not_lp_upd':>10} {'tok/s step':>10}"
    print(header)
    for r in results:
        print(f"{r['processes']:>5} {r['mode']:>4} {r['step']:>4} {r['load_s']:>6.2f} {r['old_log_probs_s']:>6.2f} "
              f"{r['updates_s']:>7.2f} {r['save_export_s']:>6.2f} {r['overhead_s']:>8.2f} {r['total_s']:>6.2f} "
              f"{r['not_old_lp_or_updates_share']:>10.0%} {r['tokens_per_s_step']:>10.0f}")
    # Steady state: the mean over steps after the first (the first warm step starts the group).
    summary = []
    for n in args.processes:
        for mode in args.modes:
            later = [r for r in results if r["processes"] == n and r["mode"] == mode and r["step"] > 1]
            if later:
                total = sum(r["total_s"] for r in later) / len(later)
                share = sum(r["not_old_lp_or_updates_share"] for r in later) / len(later)
                summary.append({"processes": n, "mode": mode, "steady_step_s": total,
                                "steady_not_old_lp_or_updates_share": share})
                print(f"steady state ({n} proc, {mode}): {total:.2f} s/step, {share:.0%} not old-lp/updates")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": "train_step",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__,
                    "omp_num_threads_per_process": args.threads_per_process,
                    "load_average_1min_before_after": [load_before[0], os.getloadavg()[0]]},
        "model": "tiny Qwen2, 3 layers, hidden 128 (engines/bootstrap/tiny_policy.py defaults), fp32 weights",
        "steady_state": summary,
        "results": results,
    }
    write_result(out, payload)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
