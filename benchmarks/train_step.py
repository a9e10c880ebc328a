"""Benchmark one DAPO training step (tasks/train.py): training tokens/s and where the time goes.

Builds the tiny default policy (random weights, tasks/tiny_policy.py) and a ScoredRollout batch
shaped like the tiny pipeline's (prompts x G samples, synthetic token ids), runs ``train_step``
for each process count, prints a table and writes ``benchmarks/results/train_step.json``.

    .venv/bin/python benchmarks/train_step.py [--prompts 16] [--group 8] [--processes 1 2]

Times: ``load`` (process start to engine ready, incl. resuming optimizer state), ``old_lp``
(recomputing pi_old's log-probs), ``updates`` (all mini-batch updates), ``save`` (DeepSpeed
state + HF export), ``launch`` (torchrun + imports, i.e. everything else in the launch) and
``total`` (train_step wall clock, validation and publishing included). ``tok/s upd`` is response
tokens in the loss / update time; ``tok/s step`` is the same over the whole step.
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

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "integration"))

from tasks.tiny_policy import build_random_checkpoint  # noqa: E402
from tasks.train import TrainConfig, train_step  # noqa: E402
from train_fixtures import scored_row, write_scored  # noqa: E402


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group", type=int, default=8, help="G samples per prompt")
    parser.add_argument("--prompt-tokens", type=int, default=14)
    parser.add_argument("--max-response-tokens", type=int, default=64)
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
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
        shard = make_batch(root / "batch.parquet", prompts=args.prompts, group=args.group, vocab=vocab,
                           prompt_tokens=args.prompt_tokens, max_response=args.max_response_tokens, seed=0)
        base = TrainConfig(micro_batch_samples=args.micro_batch_samples, updates_per_step=args.updates_per_step,
                           zero_stage=args.zero_stage, precision=args.precision, lr=1e-4, warmup_steps=0)
        for n in args.processes:
            config = replace(base, num_processes=n)
            res = train_step(ck0, [shard], root / f"ck1-{n}", step=1, config=config)
            t = res.timings
            tokens = res.metrics["tokens"]
            results.append({
                "processes": n,
                "samples": res.metrics["samples"],
                "tokens": tokens,
                "load_s": t["load_s"],
                "old_log_probs_s": t["old_log_probs_s"],
                "updates_s": t["updates_s"],
                "save_export_s": t["save_export_s"],
                "launch_overhead_s": t["launch_overhead_s"],
                "total_s": t["time_train_s"],
                "tokens_per_s_updates": tokens / t["updates_s"],
                "tokens_per_s_step": tokens / t["time_train_s"],
                "config": asdict(config),
            })

    header = f"{'procs':>5} {'samples':>7} {'tokens':>7} {'load':>6} {'old_lp':>6} {'updates':>7} {'save':>6} " \
             f"{'launch':>6} {'total':>6} {'tok/s upd':>9} {'tok/s step':>10}"
    print(header)
    for r in results:
        print(f"{r['processes']:>5} {r['samples']:>7} {r['tokens']:>7} {r['load_s']:>6.2f} {r['old_log_probs_s']:>6.2f} "
              f"{r['updates_s']:>7.2f} {r['save_export_s']:>6.2f} {r['launch_overhead_s']:>6.2f} {r['total_s']:>6.2f} "
              f"{r['tokens_per_s_updates']:>9.0f} {r['tokens_per_s_step']:>10.0f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": "train_step",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__,
                    "omp_num_threads_per_process": args.threads_per_process,
                    "load_average_1min_before_after": [load_before[0], os.getloadavg()[0]]},
        "model": "tiny Qwen2, 3 layers, hidden 128 (tasks/tiny_policy.py defaults), fp32 weights",
        "results": results,
    }
    tmp_out = out.with_suffix(".json.tmp")
    tmp_out.write_text(json.dumps(payload, indent=2) + "\n")
    os.replace(tmp_out, out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
