"""Entry point standing for one rollout task on a cluster: ``python rollout_task_main.py ARGS.json``.

A fresh process, as a Flyte task's pod is: it writes one Rollout shard with engines/rollout/stage.py
(``rollout_shard``, what tasks/rollout.py runs) for the checkpoint, problems and round in ARGS, with the
engine hosting its environment names (settings/rollout.py: EngineHosting.from_environ), then prints
the manifest's engine backend, engine count and how each engine got the weights as one JSON line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from engines.rollout.stage import manifest_path, rollout_shard
from settings.rollout import RolloutConfig


def main() -> int:
    torch.set_flush_denormal(True)
    args = json.loads(Path(sys.argv[1]).read_text())
    out = rollout_shard(args["checkpoint"], args["problem_paths"], args["problem_ids"], args["out"],
                        RolloutConfig(**args["config"]), seed=args["seed"], policy_version=args["policy_version"],
                        generation_round=args["generation_round"], engines=args.get("engines"))
    manifest = json.loads(Path(manifest_path(out)).read_text())
    print(json.dumps({key: manifest[key] for key in ("engine_backend", "engines", "engine_weights")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
