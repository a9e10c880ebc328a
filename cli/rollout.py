"""``dapo rollout``: generate rollouts for a checkpoint outside the pipeline."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from engines.rollout.stage import (
    RolloutError,
    load_problems_ids,
    manifest_path,
    rollout_shard,
)
from storage import checkpoints, outputs, run_store
from workflows.exit_codes import BAD_INPUT


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``dapo rollout``."""
    parser.add_argument("checkpoint", help="published checkpoint folder")
    parser.add_argument("problems", nargs="+", help="Problem shard(s) (files or folders)")
    parser.add_argument("--out", required=True, help="Rollout shard to write (.parquet)")
    parser.add_argument("--ids", nargs="*", default=None, help="problem ids to generate for (default: all rows)")
    parser.add_argument("--limit", type=int, default=0, help="only the first N problems (0 = all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--policy-version", type=int, default=None, help="default: the checkpoint's step")
    parser.add_argument("--round", type=int, default=0, help="dynamic-sampling round (generation_round)")
    parser.add_argument("--engines", type=int, default=None, help="engines to split prompts over (default: config)")
    parser.add_argument("--config", help="run config YAML whose `rollout` section to start from")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override a RolloutConfig field")


def run_cli(args: argparse.Namespace) -> int:
    """``dapo rollout``: generate one Rollout shard and print its manifest."""
    import schemas
    from workflows.config import ConfigError, stage_config

    try:
        config = stage_config("rollout", args.config, args.set)
        problems = run_store.fetch_all(args.problems)  # paths or URIs (files or folders)
        paths = [str(p) for p in schemas.shard_paths(problems if len(problems) > 1 else problems[0])]
        ids = args.ids
        if args.limit:
            ids = (ids or load_problems_ids(paths))[: args.limit]
        version = (args.policy_version if args.policy_version is not None
                   else checkpoints.read_info(args.checkpoint).step)  # a URI: its metadata file alone
        with outputs.output(args.out) as local_out, outputs.output(manifest_path(args.out)):
            rollout_shard(
                args.checkpoint, paths, ids, local_out, config,
                seed=args.seed, policy_version=version, generation_round=args.round, engines=args.engines,
            )
    except (RolloutError, ConfigError, checkpoints.CheckpointError, schemas.ShardValidationError, FileNotFoundError,
            ValueError) as err:
        print(f"dapo rollout: error: {err}", file=sys.stderr)
        return BAD_INPUT
    print(Path(manifest_path(local_out)).read_text())
    return 0
