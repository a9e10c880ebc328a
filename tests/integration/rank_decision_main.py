"""Entry point for the rank-decision test: ``torchrun --nproc_per_node 2 rank_decision_main.py OUT_DIR CASE``.

Each rank calls engines.train.rank._decided_by_rank_0 with a ``decide`` that says which rank ran it
(CASE "value") or, on rank 0, raises the pruned-weights error (CASE "error"); each rank writes what
it got, or the error it raised, to OUT_DIR/rank-<r>.json.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from engines.train import rank as train_rank
from storage.pruning import PrunedWeightsError


def main() -> int:
    out, case = Path(sys.argv[1]), sys.argv[2]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    calls: list[int] = []

    def decide() -> str:
        calls.append(rank)
        if case == "error":
            raise PrunedWeightsError(f"ck0: pruned by the retention policy (decided on rank {rank})")
        return f"decided on rank {rank}"

    try:
        got = {"value": train_rank._decided_by_rank_0(rank, world, decide)}
    except PrunedWeightsError as err:
        got = {"error": type(err).__name__, "message": str(err)}
    finally:  # as train_step_as_rank does: a rank left in its group aborts in gloo's teardown at exit
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    (out / f"rank-{rank}.json").write_text(json.dumps({**got, "decide_calls": calls}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
