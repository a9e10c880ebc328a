"""``dapo score``: score rollout shards outside the pipeline."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from engines.rollout.stage import manifest_path
from engines.score.stage import score_shards
from storage import outputs, run_store
from workflows import json_output
from workflows.exit_codes import BAD_INPUT


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("rollouts", nargs="+", help="Rollout shard(s) to score")
    parser.add_argument("--problems", nargs="+", required=True, help="Problem shard(s) holding the gold answers")
    parser.add_argument("--out", required=True, help="ScoredRollout shard to write")
    parser.add_argument("--max-response-tokens", type=int, default=None,
                        help="the rollout's L_max (eq. 13); default: read from the shards' manifests")
    parser.add_argument("--config", help="run config YAML whose `score` section to use")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override a ScoreConfig field")


def rollout_cap(rollouts: list[str]) -> int:
    """The response cap the shards were generated with, from their manifests (engines/rollout/stage.py)."""
    caps = set()
    for shard in rollouts:
        path = manifest_path(shard)
        if not run_store.exists(path):
            raise ValueError(f"{path}: no manifest beside the shard; give --max-response-tokens")
        caps.add(int(json.loads(run_store.read_text(path))["config"]["max_response_tokens"]))
    if len(caps) != 1:
        raise ValueError(f"the shards were generated with different response caps {sorted(caps)}; give --max-response-tokens")
    return caps.pop()


def run_cli(args: argparse.Namespace) -> int:
    from workflows.config import stage_config

    config = stage_config("score", args.config, args.set)
    try:
        max_tokens = args.max_response_tokens or rollout_cap(args.rollouts)
    except ValueError as err:
        print(f"dapo score: {err}", file=sys.stderr)
        return BAD_INPUT
    with outputs.output(args.out) as local:  # paths or object-store URIs, as in the task
        stats = score_shards(
            run_store.fetch_all(args.rollouts), run_store.fetch_all(args.problems), str(local),
            max_response_tokens=max_tokens, config=config,
        )
    print(json_output.dumps(asdict(stats)))
    print(f"wrote {args.out}", file=sys.stderr)  # stdout: the JSON alone
    return 0
