"""``dapo bootstrap``: build or import the step-0 checkpoint outside the pipeline."""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict

from engines.bootstrap.stage import BootstrapError, bootstrap_policy
from storage import checkpoints
from workflows import json_output
from workflows.exit_codes import BAD_INPUT


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``dapo bootstrap``."""
    parser.add_argument("--out", required=True, help="checkpoint folder to publish (atomic)")
    parser.add_argument("--source", default=None, help="'tiny' (default: build and warm up), 'shipped:NAME' (assets/policies/NAME) or a local HF model folder to import")
    parser.add_argument("--link", action="store_true", help="import by symlinking instead of copying")
    parser.add_argument("--train", nargs="*", default=[], help="train Problem shards (default: synthetic problems)")
    parser.add_argument("--test", nargs="*", default=[], help="test Problem shards for the held-out check")
    parser.add_argument("--config", help="run config YAML whose `bootstrap` section to start from")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override a BootstrapConfig field")


def run_cli(args: argparse.Namespace) -> int:
    """``dapo bootstrap``: build or import the step-0 checkpoint; prints its metadata."""
    from workflows.config import ConfigError, stage_config

    try:
        flags = ([f"source={args.source}"] if args.source else []) + (["link_import=true"] if args.link else [])
        config = stage_config("bootstrap", args.config, [*flags, *args.set])
        if args.train and not args.test:
            raise BootstrapError("--train needs --test shards for the held-out accuracy check")
        folder = bootstrap_policy(args.out, config, args.train or None, args.test or None)
    except (BootstrapError, ConfigError, checkpoints.CheckpointError, ValueError) as err:
        print(f"dapo bootstrap: error: {err}", file=sys.stderr)
        return BAD_INPUT
    info = checkpoints.read_info(folder)
    print(json_output.dumps({"checkpoint": str(folder), **asdict(info)}))
    return 0
