"""Entry point standing for one train task on a cluster: ``python train_task_main.py ARGS.json``.

A fresh process, as a Flyte task's pod is: it runs one training step with engines/train/launch.py
(``train_step_in_store``, what tasks/train.py runs) for the parent, batch and step in ARGS, with the
hosting its environment names (settings/rollout.py: EngineHosting.from_environ), then prints the new
checkpoint's id and whether the step continued a warm group in memory, as one JSON line.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from engines.train.launch import train_step_in_store
from settings.train import TrainConfig


def main() -> int:
    torch.set_flush_denormal(True)
    args = json.loads(Path(sys.argv[1]).read_text())
    result = train_step_in_store(args["checkpoint"], args["shards"], args["out"], step=args["step"],
                                 config=TrainConfig(**args["config"]))
    print(json.dumps({"checkpoint_id": result.checkpoint_id, "pid": os.getpid(),
                      "continued_in_memory": result.timings.get("continued_in_memory", 0.0)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
