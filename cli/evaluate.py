"""``dapo eval``: evaluate a checkpoint outside the pipeline."""

from __future__ import annotations

import argparse
import dataclasses
import sys

from engines.evaluate.stage import evaluate_checkpoint
from settings.evaluate import EvalConfig
from settings.rollout import RolloutConfig
from storage import outputs, run_store
from workflows import json_output


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="checkpoint folder (HF + dapo_checkpoint.json)")
    parser.add_argument("problems", nargs="+",
                        help="Problem shard(s) or folder(s), or raw problem files (e.g. DAPO's AIME 2024 x32 parquet: "
                             "copies of a problem count once, and --set samples_per_problem=0 draws one sample per copy)")
    parser.add_argument("--out", required=True, help="EvalResult shard to write")
    parser.add_argument("--step", type=int, default=0, help="training step of the checkpoint (recorded)")
    parser.add_argument("--config", help="run config YAML whose `evaluate` and `rollout` sections to start from")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help=f"override an EvalConfig field: {[f.name for f in dataclasses.fields(EvalConfig)]}")


def run_cli(args: argparse.Namespace) -> int:
    from workflows.config import stage_config

    config = stage_config("evaluate", args.config, args.set)
    if args.config and not config.prompt_template:
        # Raw inputs get the run's own prompt template, the one its policy was trained on.
        config = dataclasses.replace(config, prompt_template=stage_config("curate", args.config).prompt_template)
    engine_config = stage_config("rollout", args.config) if args.config else RolloutConfig()
    with outputs.output(args.out) as local:  # paths or object-store URIs, as in the task
        summary = evaluate_checkpoint(args.checkpoint, run_store.fetch_all(list(args.problems)), str(local), args.step,
                                      config, engine_config)
    print(json_output.dumps(dataclasses.asdict(summary)))
    print(f"wrote {args.out}", file=sys.stderr)  # stdout: the JSON alone
    return 0
