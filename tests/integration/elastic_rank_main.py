"""Entry point for the elastic-rank test: ``torchrun --nproc_per_node N elastic_rank_main.py ARGS.json``.

Each rank runs engines.train.rank.train_step_as_rank, as the Flyte PyTorch plugin would run the
train task body; rank 0 writes the published result to ARGS["result_path"].
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

import torch

from engines.train.rank import running_as_elastic_rank, train_step_as_rank
from settings.train import TrainConfig


def main() -> int:
    torch.set_flush_denormal(True)
    args = json.loads(Path(sys.argv[1]).read_text())
    assert running_as_elastic_rank()
    result = train_step_as_rank(args["checkpoint"], args["shards"], args["out"], step=args["step"],
                                config=TrainConfig(**args["config"]))
    if result is not None:
        Path(args["result_path"]).write_text(json.dumps(asdict(result), default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
