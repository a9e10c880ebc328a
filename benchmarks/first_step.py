"""Benchmark the first training step on a fresh machine: worker group start with an empty torch extensions cache.

DeepSpeed's CPU communication backend used to JIT-compile its ``deepspeed_shm_comm`` op into
``TORCH_EXTENSIONS_DIR`` (default ``~/.cache/torch_extensions``) the first time a rank joined the
process group; on a fresh machine that compile was charged to the first training step. This
script points ``TORCH_EXTENSIONS_DIR`` at a new empty temporary folder (the shared cache is never
touched), runs one warm step of the tiny policy (engines/train/launch.py: the step starts the
worker group, engines/train/server.py), and reports the step's wall time, the engine-load part,
and what the extensions folder holds afterwards (an empty folder: nothing was compiled).

    .venv/bin/python benchmarks/first_step.py [--processes 1] [--label after]

Writes ``benchmarks/results/first_step-<label>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import torch
from machine import cpu_model  # noqa: E402  (benchmarks/machine.py)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "tests" / "integration"))

from train_step import make_batch  # noqa: E402

from engines.train import server as train_server  # noqa: E402
from engines.bootstrap.tiny_policy import build_random_checkpoint  # noqa: E402
from engines.train.launch import train_step  # noqa: E402
from settings.train import TrainConfig  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--label", default="now", help="names the result file (e.g. before / after)")
    parser.add_argument("--out-dir", default=str(REPO / "benchmarks" / "results"))
    args = parser.parse_args()
    torch.set_flush_denormal(True)
    os.environ["OMP_NUM_THREADS"] = "1"  # the launched workers inherit it
    with tempfile.TemporaryDirectory(prefix="bench-first-step-") as tmp:
        root = Path(tmp)
        ext_dir = root / "torch_extensions"
        ext_dir.mkdir()
        os.environ["TORCH_EXTENSIONS_DIR"] = str(ext_dir)  # a fresh machine's empty cache, inherited by the ranks
        ck0 = build_random_checkpoint(root / "ck0", seed=0)
        vocab = json.loads((ck0 / "config.json").read_text())["vocab_size"]
        shard = make_batch(root / "batch.parquet", prompts=4, group=4, vocab=vocab, prompt_tokens=14,
                           max_response=32, seed=1)
        config = TrainConfig(num_processes=args.processes, micro_batch_samples=16, updates_per_step=1, lr=1e-4,
                             warmup_steps=0, keep_workers_warm=True)
        load_before = os.getloadavg()
        train_server.stop_active()
        t = time.perf_counter()
        res = train_step(ck0, [shard], root / "ck1", step=1, config=config)
        wall = time.perf_counter() - t
        train_server.stop_active()
        built = sorted(p.relative_to(ext_dir).as_posix() for p in ext_dir.rglob("*") if p.is_file())
    result = {
        "label": args.label,
        "processes": args.processes,
        "first_step_wall_s": round(wall, 2),
        "time_train_s": round(res.timings["time_train_s"], 2),
        "load_s": round(res.timings.get("load_s", float("nan")), 2),
        "group_started": bool(res.timings.get("group_started", 0.0)),
        "extensions_built": built,
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "config": asdict(config),
    }
    print(json.dumps({k: v for k, v in result.items() if k != "config"}, indent=1))
    out = Path(args.out_dir) / f"first_step-{args.label}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
