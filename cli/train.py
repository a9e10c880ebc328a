"""``dapo train``: one DAPO step from a checkpoint and ScoredRollout shards, outside Flyte."""

from __future__ import annotations

import argparse
import sys

from engines.train.launch import train_step_in_store
from engines.train.publish import TrainInputError, TrainStepError
from storage.checkpoints import CheckpointError
from storage.pruning import PrunedWeightsError
from workflows import json_output
from workflows.exit_codes import BAD_INPUT, FAILED


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="published checkpoint folder (a path or an object-store URI) to train from; "
                        "its optimizer state is resumed only when its digest record (a run folder's) vouches for it, "
                        "else refused: --set train.resume_optimizer=false trains from its weights with a fresh optimizer")
    parser.add_argument("scored", nargs="+", help="ScoredRollout shard(s) (files or folders)")
    parser.add_argument("--out", required=True, help="folder of the next checkpoint (published atomically)")
    parser.add_argument("--step", type=int, required=True, help="the step number this update produces")
    parser.add_argument("--config", help="run config YAML whose `train` section to use")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override a TrainConfig field")


def run_cli(args: argparse.Namespace) -> int:
    from workflows.config import stage_config

    config = stage_config("train", args.config, args.set)
    try:
        result = train_step_in_store(args.checkpoint, args.scored, args.out, step=args.step, config=config)
    except (TrainInputError, CheckpointError, PrunedWeightsError) as err:  # the shards or the checkpoint given
        print(f"dapo train: {err}", file=sys.stderr)
        return BAD_INPUT
    except TrainStepError as err:  # the step itself failed
        print(f"dapo train: {err}", file=sys.stderr)
        return FAILED
    print(json_output.dumps({"checkpoint": result.checkpoint_dir, **result.metrics, "timings": result.timings}))
    return 0
