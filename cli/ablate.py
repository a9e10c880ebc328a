"""`dapo ablate`: the paper's ablation ladder (Table 1) over several seeds; its arguments and the
table it prints. The ladder itself, its rungs and folder: workflows/ablation.py.
"""

from __future__ import annotations

import argparse
import sys

from cli.run import add_verbose_argument, exit_interrupted
from workflows import ablation
from workflows.config import SHIPPED_CONFIGS, load_config
from workflows.exit_codes import BAD_INPUT
from workflows.local_run import RunInterrupted, stop_on_sigterm
from workflows.run_binding import RunFolderError, check_can_hold
from workflows.run_output import LOG_NAME


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=str(SHIPPED_CONFIGS / "ablation-addsub.yaml"),
                        help="the full DAPO config the ladder ends at (default: configs/ablation-addsub.yaml of this checkout)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                        help="override one config field for every rung, e.g. --set run.steps=10 (repeatable)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds per rung (default: 0 1 2)")
    parser.add_argument("--rungs", type=int, nargs="+", help="run only these rungs (indices 0-5; default: all)")
    parser.add_argument("--run-root", default="runs", help="the ladder folder is <run-root>/<run name>-ladder")
    parser.add_argument("--report-only", action="store_true",
                        help="run nothing: rebuild ablation.json, the table and curves from the finished runs")
    add_verbose_argument(parser)


def run_cli(args: argparse.Namespace) -> int:
    from reports.ablation import format_table

    config = load_config(args.config, args.set)
    ablation.check_ladder_ends_at(config)  # before anything runs or any folder is made
    count = len(ablation.ladder(config))
    bad = [index for index in args.rungs or [] if not 0 <= index < count]
    if bad:
        print(f"dapo ablate: --rungs {' '.join(map(str, bad))}: no such rung; the ladder has rungs 0-{count - 1}", file=sys.stderr)
        return BAD_INPUT
    if args.report_only:
        from reports.ablation import write_ablation

        ladder_dir = ablation.ladder_folder(config, args.run_root)
        try:
            results = ablation.collect_results(config, ladder_dir, seeds=args.seeds, rungs=args.rungs)
        except FileNotFoundError as err:  # no finished runs of these rungs and seeds in the ladder folder
            print(f"dapo ablate: {err}", file=sys.stderr)
            return BAD_INPUT
        seconds = sum(run["summary"]["wall_seconds"] for r in results for run in r["runs"])  # of the runs
        table, _ = write_ablation(ladder_dir, results, base=config, seconds=seconds)
    else:
        from workflows.run_output import run_output

        ladder_dir = ablation.ladder_folder(config, args.run_root)
        log = ladder_dir / LOG_NAME
        try:
            check_can_hold(log.parent)
            ablation.check_ladder_folder(config, ladder_dir)  # before the log is written there
            with run_output(log, command="ablate", verbose=args.verbose), stop_on_sigterm():
                table = ablation.run_ablation(config, args.run_root, seeds=args.seeds, rungs=args.rungs)
        except RunFolderError as err:
            print(f"dapo ablate: {err}", file=sys.stderr)
            return BAD_INPUT
        except RunInterrupted as err:
            exit_interrupted("ablate", err)
    print(format_table(table))
    return 0
