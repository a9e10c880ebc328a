"""``dapo score``: score rollout shards outside the pipeline."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from engines.scoring import score_shards
from storage import run_store


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("rollouts", nargs="+", help="Rollout shard(s) to score")
    parser.add_argument("--problems", nargs="+", required=True, help="Problem shard(s) holding the gold answers")
    parser.add_argument("--out", required=True, help="ScoredRollout shard to write")
    parser.add_argument("--max-response-tokens", type=int, required=True, help="the rollout's L_max (eq. 13)")
    parser.add_argument("--config", help="run config YAML whose `score` section to use")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override a ScoreConfig field")


def run_cli(args: argparse.Namespace) -> int:
    from workflows.config import stage_config

    config = stage_config("score", args.config, args.set)
    with run_store.output(args.out) as local:  # paths or object-store URIs, as in the task
        stats = score_shards(
            run_store.fetch_all(args.rollouts), run_store.fetch_all(args.problems), str(local),
            max_response_tokens=args.max_response_tokens, config=config,
        )
    print(json.dumps(asdict(stats), indent=2, sort_keys=True))
    print(f"wrote {args.out}")
    return 0
