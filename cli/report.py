"""``dapo report RUN``: draw a run folder's page (``report/index.html``) again from its records.

For a run folder copied from elsewhere, or one drawn by older code: the page is rebuilt from the
folder's summary.json, StepMetrics shards and trained batches (workflows/run_page.py) with today's
reports/run.py, its links relative to the folder. Prints the page's path.
"""

from __future__ import annotations

import argparse
import sys

from storage import run_lookup
from workflows.exit_codes import BAD_INPUT, OK


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="run folder (a path or an object-store URI), or a run name under --run-root")
    parser.add_argument("--run-root", default="runs", help="where run names are looked up (default: %(default)s)")


def run_cli(args: argparse.Namespace) -> int:
    from storage import run_store
    from storage.run_layout import RunLayout
    from workflows.run_page import rebuild

    try:
        root = run_lookup.run_folder(args.run, args.run_root)
    except run_lookup.RunNotFound as err:
        print(f"dapo report: error: {err}", file=sys.stderr)
        return BAD_INPUT
    if not run_store.exists(RunLayout(root).summary):
        print(f"dapo report: error: {root}: no summary.json (the run has not finished a step's page yet)", file=sys.stderr)
        return BAD_INPUT
    print(rebuild(root))
    return OK
