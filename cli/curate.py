"""``dapo curate INPUT... --out DIR``: curate outside the pipeline (in-process, or as a local Flyte task).

Like every stage command, its stdout is its result alone (the CurateReport as one JSON document,
`| jq .kept`); the counts for a reader go to stderr.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from dapo_core.answers import (
    DAPO_PROMPT_TEMPLATE,
    TINY_PROMPT_TEMPLATE,
)
from engines.curate.stage import CurateReport, curate_sources
from readers.problem_files import CurationError, split_suffix
from settings.curate import CurateConfig
from storage import digests, outputs, remakes, run_store
from tasks.curate import curate
from workflows import json_output
from workflows.exit_codes import BAD_INPUT
from workflows.local_flyte import run_local
from workflows.verified_calls import check_remade, must_remake, record_stamps

_TEMPLATES = {"dapo": DAPO_PROMPT_TEMPLATE, "tiny": TINY_PROMPT_TEMPLATE}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``dapo curate``."""
    parser.add_argument("inputs", nargs="+", metavar="INPUT",
                        help="file (.parquet/.jsonl), hf:NAME_OR_PATH or synthetic:n=..,seed=..; append @train/@test to force the split")
    parser.add_argument("--out", required=True, help="output folder (problems/, rejected/, curate_report.json)")
    parser.add_argument("--template", choices=sorted(_TEMPLATES), default="dapo", help="named prompt template")
    parser.add_argument("--prompt-template", default=None, help="custom template containing {problem} (overrides --template)")
    parser.add_argument("--test-fraction", type=float, default=CurateConfig.test_fraction)
    parser.add_argument("--split-seed", type=int, default=CurateConfig.split_seed)
    parser.add_argument("--no-dedup", action="store_true", help="keep every copy of a repeated problem")
    parser.add_argument("--rows-per-shard", type=int, default=CurateConfig.rows_per_shard)
    parser.add_argument("--rewrite", action="append", default=[], metavar="MODULE:FUNCTION",
                        help="answer rewrite hook tried before integer conversion (repeatable)")
    parser.add_argument("--no-rewrite", action="store_true",
                        help="reject non-integer answers instead of rewriting them (dapo_core.answer_rewrite)")
    parser.add_argument("--flyte", action="store_true", help="run as a local Flyte task (cached) instead of in-process")


def curate_on_flyte(inputs: list[str], out_dir: str, config: CurateConfig) -> CurateReport:
    """The curate task as a local Flyte run, cached as the pipeline caches it (workflows/driver.py):
    the input files' contents are in the cache key (an input edited in place is curated again), and
    a cache hit whose folder was deleted or damaged since is made again instead of being reported
    (workflows/verified_calls.py)."""
    import flyte

    flyte.init()
    upstream = digests.upstream_digest([split_suffix(spec)[0] for spec in inputs])

    def run(key: str) -> CurateReport:
        # Flyte's raw-data and action folders for the call (nothing is offloaded: the report is
        # small), removed after; left to Flyte, both stay in /tmp/flyte (workflows/local_flyte.py).
        with tempfile.TemporaryDirectory(prefix="dapo-flyte-") as folder:
            return run_local(curate, {"inputs": inputs, "out_dir": out_dir, "config": config, "upstream_digest": key},
                             raw_data=Path(folder) / "raw", actions=Path(folder) / "actions")

    stamps = record_stamps([out_dir])
    report = run(remakes.cache_key([out_dir], upstream))
    if must_remake("curate", [out_dir], stamps):  # made again under a key of its own (storage/remakes.py)
        report = run(remakes.record_remake([out_dir], upstream))
        check_remade("curate", [out_dir])
    return report


def run_cli(args: argparse.Namespace) -> int:
    """``dapo curate``: curate; print the report as JSON (stdout) and its counts per split, rule and
    reason as text (stderr); 2 on a curation error."""
    template = args.prompt_template.encode().decode("unicode_escape") if args.prompt_template else _TEMPLATES[args.template]
    config = CurateConfig(
        prompt_template=template,
        test_fraction=args.test_fraction,
        split_seed=args.split_seed,
        dedup=not args.no_dedup,
        rows_per_shard=args.rows_per_shard,
        answer_rewrites=tuple(args.rewrite),
        rewrite_answers=not args.no_rewrite,
    )
    if not run_store.is_remote(args.out) and Path(args.out).exists() and not Path(args.out).is_dir():
        print(f"dapo curate: error: --out {args.out} is a file; give a folder (created if missing)", file=sys.stderr)
        return BAD_INPUT
    try:
        if args.flyte:
            out_dir = args.out if run_store.is_remote(args.out) else str(Path(args.out).resolve())
            report = curate_on_flyte(list(args.inputs), out_dir, config)
        else:
            with outputs.output(args.out, folder=True) as local:  # a path, or an object-store URI
                report = curate_sources(args.inputs, local, config)
    except (CurationError, ValueError) as err:
        print(f"dapo curate: error: {err}", file=sys.stderr)
        return BAD_INPUT
    print(json_output.dumps(asdict(report)))  # stdout: the report alone, one JSON document
    print(summary_text(report, args.out), file=sys.stderr)
    return 0


def summary_text(report: CurateReport, out: str) -> str:
    """The report for a reader: counts per split, per rewrite rule and per rejection reason."""
    lines = [f"input rows: {report.input_rows}  kept: {report.kept}  rejected: {report.rejected}"]
    lines += [f"  kept   {split:<22} {n}" for split, n in report.kept_by_split.items()]
    lines += [f"  rewrite {rule:<21} {n}" for rule, n in report.kept_by_rule.items() if rule != "integer"]
    lines += [f"  reject {reason:<22} {n}" for reason, n in report.rejected_by_reason.items()]
    lines.append(f"shards under {out}: {len(report.problem_shards)} problem, {len(report.rejected_shards)} rejected")
    return "\n".join(lines)
