"""``dapo verify RUN``: check every output of a run folder against its digest record.

Walks the run folder (a path or an object-store URI), checks each digest record
(``<output>.sha256.json``, storage/digests.py) against the files it names, and reports what is
missing or damaged, one line per file. Shards and checkpoint files that no record covers, and a
``summary.json`` whose final checkpoint is gone, are reported too: deleting an output together
with its record must not make a run look intact. Files the retention policy pruned (named in
``<checkpoint>.pruned.json``, storage/pruning.py) are reported as pruned, one line per
checkpoint, not as missing. ``run.json`` is not a task output (the driver rewrites it on every
invocation), so no digest record covers it; its config is checked against the config digest it
records instead (:func:`run_record_problems`), so a hand-edited config does not pass for the one the
run computed. Exit status 1 when anything is wrong; 2 when the folder is not a run folder.
"""

from __future__ import annotations

import argparse
import json
import sys

from storage import checkpoints, digests, pruning, remakes, run_lookup, run_store
from storage.run_layout import RunLayout
from storage.run_summary import read_summary
from workflows.config import ConfigError, config_from_dict
from workflows.exit_codes import BAD_INPUT, FAILED, OK

# Written by the driver itself on every invocation (not task outputs): not recorded.
_UNRECORDED = ("run.json", "summary.json")


def _files_under(root: str) -> list[str]:
    """Every file under the run folder, as names relative to it (hidden temp files skipped)."""
    if run_store.is_remote(root):
        prefix = root.rstrip("/") + "/"
        names = [uri[len(prefix):] for uri in run_store.folder_files(root)]
    else:
        base = run_store.local_path(root)
        names = [p.relative_to(base).as_posix() for p in base.rglob("*") if p.is_file()]
    return sorted(n for n in names if not any(part.startswith(".") for part in n.split("/")))


def _needs_record(name: str) -> bool:
    return name.endswith(".parquet") or name.startswith("checkpoints/")


def run_record_problems(layout: RunLayout) -> list[str]:
    """Problems of the run's ``run.json``: a config that does not load, or whose digest (recomputed,
    ``RunConfig.digest``) is not the ``config_digest`` it records. A record without a config (none
    the driver writes), or none at all (a folder ``dapo verify`` would not take for a run), has
    nothing to check."""
    path = layout.run_record
    if not run_store.exists(path):
        return []
    try:
        record = json.loads(run_store.read_text(path))
    except ValueError as err:
        return [f"{path}: unreadable run record: {err}"]
    if not isinstance(record, dict) or "config" not in record:
        return []
    if "config_digest" not in record:
        return [f"{path}: records no config_digest; its config cannot be checked"]
    try:
        digest = config_from_dict(record["config"], source=path).digest()
    except (ConfigError, TypeError, AttributeError) as err:
        return [f"{path}: its config does not load: {err}"]
    if digest != record["config_digest"]:
        return [f"{path}: its config digests to {digest}, not the recorded {record['config_digest']} of the config "
                "the run computed (edited by hand?)"]
    return []


def verify_run(root: str, *, deep: bool = True) -> tuple[list[str], int]:
    """``(problems, files checked)`` of the run folder ``root``; no problems = intact."""
    layout = RunLayout(root)
    names = _files_under(layout.root)
    records = [n for n in names if n.endswith(digests.RECORD_SUFFIX)]
    problems: list[str] = run_record_problems(layout)
    covered: set[str] = set()
    checked = 0
    for rec in records:
        output = rec[: -len(digests.RECORD_SUFFIX)]
        parent = output.rpartition("/")[0]
        problems += pruning.check(run_store.join(layout.root, output), deep=deep)
        try:
            files = json.loads(run_store.read_text(run_store.join(layout.root, rec)))["files"]
        except (ValueError, KeyError, TypeError):
            continue  # reported by check
        covered.update(f"{parent}/{key}" if parent else key for key in files)
        checked += len(set(files) - set(pruning.pruned_files(run_store.join(layout.root, output))))
    for name in names:
        if (name in covered or name in _UNRECORDED
                or name.endswith((digests.RECORD_SUFFIX, pruning.PRUNED_SUFFIX, remakes.REMADE_SUFFIX))
                or name.startswith("flyte/")):
            continue
        if _needs_record(name):
            problems.append(f"{run_store.join(layout.root, name)}: no digest record covers it")
    if run_store.exists(layout.summary):
        final = read_summary(layout.root).get("final_checkpoint")
        if final and not checkpoints.is_complete(final):
            problems.append(f"{final}: the final checkpoint summary.json names is missing or incomplete")
    return problems, checked


def pruned_outputs(root: str) -> list[str]:
    """One line per checkpoint of the run folder ``root`` that the retention policy pruned."""
    names = _files_under(RunLayout(root).root)
    outputs = [n[: -len(pruning.PRUNED_SUFFIX)] for n in names if n.endswith(pruning.PRUNED_SUFFIX)]
    return [line for n in outputs if (line := pruning.describe_pruned(run_store.join(RunLayout(root).root, n)))]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="run folder (a path or an object-store URI), or a run name under --run-root")
    parser.add_argument("--run-root", default="runs", help="where run names are looked up (default: %(default)s)")
    parser.add_argument("--sizes-only", action="store_true",
                        help="compare sizes, not sha256 (no download from an object store)")


def run_cli(args: argparse.Namespace) -> int:
    """Print one line per missing or damaged file; exit 1 if there is any, 2 when ``args.run`` is no run folder."""
    try:
        root = run_lookup.run_folder(args.run, args.run_root)
    except run_lookup.RunNotFound as err:
        print(f"dapo verify: error: {err}", file=sys.stderr)
        return BAD_INPUT
    problems, checked = verify_run(root, deep=not args.sizes_only)
    pruned = pruned_outputs(root)
    for line in [*pruned, *problems]:
        print(line)
    verdict = f"{len(problems)} problem(s)" if problems else "intact"
    kept = f", {len(pruned)} checkpoint(s) pruned by the retention policy" if pruned else ""
    print(f"dapo verify: {root}: {checked} recorded file(s) checked{kept}, {verdict}", file=sys.stderr)
    return FAILED if problems else OK


__all__ = ["pruned_outputs", "run_record_problems", "verify_run"]
