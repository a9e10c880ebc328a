"""Curation: raw problem sources into Problem shards (integer answers) plus a RejectedProblem
shard that accounts for every other input row (paper sec. 3.5, "Dataset Transformation").

Each row is converted (``dapo_core.answers``, rewritten by rule with ``dapo_core.answer_rewrite``)
or rejected with a reason code; problems are deduplicated by normalised text and a problem seen
with two different answers is rejected everywhere ("conflicting_answers"). Output folder::

    OUT/problems/{split}-00000.parquet   Problem rows, sorted by (source, source_row)
    OUT/rejected/part-00000.parquet      RejectedProblem rows, same order (may be empty)
    OUT/curate_report.json               counts per split / reason / source

Deterministic (no timestamps, stable sort): the same inputs give byte-identical files. Shards are
built in a hidden staging folder and moved into place only when all are written."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from dapo_core.answer_rewrite import rewrite_answer
from dapo_core.answers import (
    AnswerRewrite,
    convert_problem_answer,
    problem_id,
    render_prompt,
    split_for,
)
from readers.problem_files import CurationError, RawRecord, SourceRecords, read_input
from schemas import Problem, RejectedProblem, write_shard
from settings.curate import CurateConfig
from storage import run_store

REPORT_NAME = "curate_report.json"


@dataclass(frozen=True)
class CurateReport:
    """What a curation run produced; every input row is either kept or rejected."""

    input_rows: int
    kept: int
    rejected: int
    kept_by_split: dict[str, int]
    rejected_by_reason: dict[str, int]
    kept_by_source: dict[str, int]
    kept_by_rule: dict[str, int]
    """Kept rows per Problem.answer_rule: ``integer`` (as written), a rewrite rule, or ``hook_<i>``."""
    rejected_by_source: dict[str, int]
    problem_shards: list[str] = field(default_factory=list)
    rejected_shards: list[str] = field(default_factory=list)


# Reasons a rule-based rewrite may fix; every other rejection (text, choice, matrix, ...) stands.
REWRITABLE_REASONS = frozenset({"not_integer_fraction", "not_integer_decimal", "expression", "tuple", "interval", "base"})


def _rejected(record: RawRecord, code: str, reason: str, problem: str | None = None) -> dict[str, Any]:
    return {
        "source": record.source,
        "source_row": record.source_row,
        "problem": record.problem if problem is None else problem,
        "original_answer": record.answer,
        "reason_code": code,
        "reason": reason,
    }


def resolve_rewrites(names: Sequence[str]) -> list[AnswerRewrite]:
    """Import ``module:function`` rewrite hooks."""
    hooks = []
    for name in names:
        module_name, _, attr = name.partition(":")
        try:
            hooks.append(getattr(importlib.import_module(module_name), attr))
        except (ImportError, AttributeError, ValueError) as err:
            raise CurationError(f"answer rewrite {name!r} cannot be imported: {err}") from None
    return hooks


# One converted copy of a problem: (record, problem text, integer answer, test_fraction, answer rule).
_Copy = tuple[RawRecord, str, int, float, str]


def _check_source_names(sources: Sequence[SourceRecords]) -> None:
    """Refuse two inputs with one source name (rows are identified by source and row)."""
    names = [s.source for s in sources]
    clashes = sorted({n for n in names if names.count(n) > 1})
    if clashes:
        raise CurationError(f"two inputs have the same source name {clashes}; rename one (the name is the file name)")


def _convert_record(
    record: RawRecord, config: CurateConfig, rewrites: Sequence[AnswerRewrite]
) -> tuple[str, int, str] | dict[str, Any]:
    """(problem text, integer answer, answer rule) of one record, or its RejectedProblem row."""
    if record.error_code is not None:
        return _rejected(record, record.error_code, record.error or record.error_code)
    if record.problem is None or not record.problem.strip():
        return _rejected(record, "missing_problem", "the problem text is missing or blank")
    if len(record.problem) > config.max_problem_chars:
        return _rejected(record, "problem_too_long", f"the problem has {len(record.problem):,} characters, "
                         f"more than curate.max_problem_chars={config.max_problem_chars:,}",
                         record.problem[:200])
    verdict = convert_problem_answer(record.problem, record.answer, rewrites)
    text, value = verdict.problem, verdict.value
    rule = "integer" if verdict.rewritten_by is None else f"hook_{verdict.rewritten_by}"
    if value is None and config.rewrite_answers and verdict.reason_code in REWRITABLE_REASONS:
        rewritten = rewrite_answer(record.problem, record.answer or "")
        if rewritten is not None:
            text, value, rule = rewritten.problem, rewritten.value, rewritten.rule
    if value is None:  # the conversion's reason stands (the rewriter returns no reason)
        return _rejected(record, verdict.reason_code or "expression", verdict.reason)
    return text, value, rule


def _convert_sources(
    sources: Sequence[SourceRecords], config: CurateConfig, rewrites: Sequence[AnswerRewrite]
) -> tuple[dict[str, list[_Copy]], list[dict[str, Any]]]:
    """(problem_id -> its converted copies in input order, RejectedProblem rows of the others)."""
    rejected: list[dict[str, Any]] = []
    groups: dict[str, list[_Copy]] = {}
    for source in sources:
        fraction = config.test_fraction if source.test_fraction is None else source.test_fraction
        for record in source.records:
            converted = _convert_record(record, config, rewrites)
            if isinstance(converted, dict):
                rejected.append(converted)
                continue
            text, value, rule = converted
            groups.setdefault(problem_id(text), []).append((record, text, value, fraction, rule))
    return groups, rejected


def _problem_row(pid: str, record: RawRecord, text: str, value: int, rule: str, split: str,
                 config: CurateConfig) -> dict[str, Any]:
    """The Problem row of a kept copy."""
    return {
        "problem_id": pid,
        "source": record.source,
        "source_row": record.source_row,
        "problem": text,
        "answer": value,
        "original_answer": record.answer if record.answer is not None else str(value),
        "answer_rule": rule,
        "prompt": render_prompt(config.prompt_template, text),
        "split": split,
    }


def _resolve_copies(
    pid: str, members: list[_Copy], config: CurateConfig
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(Problem rows, RejectedProblem rows) of the copies of one problem: conflicting answers
    reject them all; otherwise one copy is kept (all of them without dedup), and every kept copy
    is in the problem's one split."""
    answers = sorted({value for _, _, value, _, _ in members})
    if len(answers) > 1:
        seen = "; ".join(f"{r.source} row {r.source_row}: {v}" for r, _, v, _, _ in members[:6])
        return [], [
            _rejected(record, "conflicting_answers", f"problem {pid} has answers {answers} ({seen})", text)
            for record, text, _, _, _ in members
        ]
    # One split per problem, whatever dedup says: if any copy is a test problem (an evaluation file
    # marked @test, or a source whose test_fraction draws it) every kept copy is a test one, so an
    # evaluation set given alongside training data never leaks into the train split.
    splits = [record.split or split_for(pid, fraction, config.split_seed) for record, _, _, fraction, _ in members]
    keep_index = splits.index("test") if "test" in splits else 0
    split, first = splits[keep_index], members[keep_index][0]
    problems: list[dict[str, Any]] = []
    rejected: list[dict[str, Any]] = []
    for index, (record, text, value, _, rule) in enumerate(members):
        if index != keep_index and config.dedup:
            rejected.append(
                _rejected(record, "duplicate", f"same problem {pid} as {first.source} row {first.source_row}", text)
            )
            continue
        problems.append(_problem_row(pid, record, text, value, rule, split, config))
    return problems, rejected


def curate_records(
    sources: Sequence[SourceRecords], config: CurateConfig, rewrites: Sequence[AnswerRewrite] = ()
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Convert, deduplicate, split and render: (Problem rows, RejectedProblem rows), both sorted
    by (source, source_row). Among copies of a problem the first test-split copy wins, else the
    first copy (earlier inputs, then earlier rows); its split is every kept copy's."""
    _check_source_names(sources)
    groups, rejected = _convert_sources(sources, config, rewrites)
    problems: list[dict[str, Any]] = []
    for pid, members in groups.items():
        kept, dropped = _resolve_copies(pid, members, config)
        problems.extend(kept)
        rejected.extend(dropped)
    problems.sort(key=lambda r: (r["source"], r["source_row"]))
    rejected.sort(key=lambda r: (r["source"], r["source_row"]))
    return problems, rejected


def _count(rows: list[dict[str, Any]], key: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in rows:
        counts[row[key]] = counts.get(row[key], 0) + 1
    return dict(sorted(counts.items()))


def _write_outputs(
    problems: list[dict[str, Any]], rejected: list[dict[str, Any]], out_dir: Path, rows_per_shard: int
) -> tuple[list[str], list[str]]:
    """Write every shard into a staging folder, then move the folders into place."""
    out_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".curate-staging-", dir=out_dir))
    try:
        problem_shards: list[str] = []
        for split in sorted({p["split"] for p in problems}):
            rows = [p for p in problems if p["split"] == split]
            for index, start in enumerate(range(0, len(rows), rows_per_shard)):
                name = f"problems/{split}-{index:05d}.parquet"
                write_shard(rows[start : start + rows_per_shard], staging / name, Problem)
                problem_shards.append(name)
        rejected_shards: list[str] = []
        for index, start in enumerate(range(0, max(len(rejected), 1), rows_per_shard)):
            name = f"rejected/part-{index:05d}.parquet"
            write_shard(rejected[start : start + rows_per_shard], staging / name, RejectedProblem)
            rejected_shards.append(name)
        (staging / "problems").mkdir(exist_ok=True)
        # Swap each folder in: move the old one aside, move the new one in, then delete the old.
        for sub in ("problems", "rejected"):
            final, old = out_dir / sub, staging / f"old-{sub}"
            if final.exists():
                os.replace(final, old)
            os.replace(staging / sub, final)
        return problem_shards, rejected_shards
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def curate_sources(inputs: Sequence[str], out_dir: str | Path, config: CurateConfig = CurateConfig()) -> CurateReport:
    """Read every input spec, curate, and write the shards and report under ``out_dir``."""
    if config.rows_per_shard < 1:
        raise ValueError(f"rows_per_shard must be >= 1, got {config.rows_per_shard}")
    if not inputs:
        raise CurationError("no inputs given")
    render_prompt(config.prompt_template, "")  # fail early on a template without {problem}
    rewrites = resolve_rewrites(config.answer_rewrites)
    sources = [source for spec in inputs for source in read_input(spec)]  # all reading before any writing
    problems, rejected = curate_records(sources, config, rewrites)
    out = Path(out_dir)
    problem_shards, rejected_shards = _write_outputs(problems, rejected, out, config.rows_per_shard)
    report = CurateReport(
        input_rows=sum(len(s.records) for s in sources),
        kept=len(problems),
        rejected=len(rejected),
        kept_by_split=_count(problems, "split"),
        rejected_by_reason=_count(rejected, "reason_code"),
        kept_by_source=_count(problems, "source"),
        kept_by_rule=_count(problems, "answer_rule"),
        rejected_by_source=_count(rejected, "source"),
        problem_shards=problem_shards,
        rejected_shards=rejected_shards,
    )
    if report.kept + report.rejected != report.input_rows:  # every row must be accounted for
        raise AssertionError(f"curation lost rows: {report.kept} + {report.rejected} != {report.input_rows}")
    run_store.write_text(out / REPORT_NAME, json.dumps(asdict(report), indent=2, sort_keys=True) + "\n")
    return report


class SplitOverlapError(RuntimeError):
    """Curated train and test shards share a problem: held-out accuracy would measure memory."""


def check_splits_disjoint(train: Mapping[str, Sequence[str]], test: Mapping[str, Sequence[str]]) -> None:
    """Raise ``SplitOverlapError`` when a problem id is in both splits (``{shard: its problem ids}``
    each), naming the first few such ids (sorted) and the shards that hold them. Curation puts each
    problem in one split; this is the driver's guard that it did, before any work uses them."""
    train_ids = {pid for ids in train.values() for pid in ids}
    shared = sorted(train_ids.intersection(pid for ids in test.values() for pid in ids))
    if not shared:
        return
    common = set(shared)
    shards = [shard for split in (train, test) for shard, ids in split.items() if common.intersection(ids)]
    raise SplitOverlapError(
        f"{len(shared)} problem ids are in both the train and the test split (e.g. {', '.join(shared[:5])}), "
        f"in shards {', '.join(shards)}: held-out problems must never be trained on; curate again "
        "(each problem is put in one split, test when any copy is a test one)"
    )


def check_curated_splits_disjoint(train_paths: Sequence[str], test_paths: Sequence[str]) -> None:
    """``check_splits_disjoint`` over curated Problem shards (paths or URIs; their ``problem_id`` column only)."""
    def ids(paths: Sequence[str]) -> dict[str, list[str]]:
        return {path: pq.read_table(run_store.fetch(path), columns=["problem_id"]).column(0).to_pylist() for path in paths}

    check_splits_disjoint(ids(train_paths), ids(test_paths))
