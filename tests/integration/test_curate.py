"""The curation stage end to end (tasks/curate.py): real data sets, bad input, determinism, CLI, Flyte."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dapo_core.answers import TINY_PROMPT_TEMPLATE, problem_id
from schemas import Problem, RejectedProblem, read_shards
from tasks.curate import CurateConfig, CurationError, curate_records, curate_sources
from tasks.readers import RawRecord, SourceRecords

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"shared data folder {DATA} is absent")


def files_under(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_dedup_conflicts_and_splits_on_hand_made_records() -> None:
    records = [
        RawRecord("s", 0, "What is 1+1?", "2"),
        RawRecord("s", 1, "What is  1+1? ", "2.0"),  # same problem after normalisation, same answer
        RawRecord("s", 2, "Odd one", "3"),
        RawRecord("s", 3, "Odd one", "4"),  # conflicting answers: both copies rejected
        RawRecord("s", 4, "Half", "\\frac{1}{2}"),
        RawRecord("s", 5, None, "1"),
        RawRecord("s", 6, None, None, None, "bad_encoding", "row 6 is not UTF-8"),
    ]
    eval_copy = RawRecord("e", 0, "What is 1+1?", "2", "test")  # the test copy wins over the train copy
    config = CurateConfig(prompt_template=TINY_PROMPT_TEMPLATE)
    problems, rejected = curate_records([SourceRecords("s", records), SourceRecords("e", [eval_copy])], config)
    assert [(p["source"], p["source_row"], p["answer"], p["split"]) for p in problems] == [("e", 0, 2, "test")]
    assert problems[0]["problem_id"] == problem_id("What is 1+1?")
    assert problems[0]["prompt"] == "What is 1+1?=\n"
    assert [(r["source"], r["source_row"], r["reason_code"]) for r in rejected] == [
        ("s", 0, "duplicate"), ("s", 1, "duplicate"), ("s", 2, "conflicting_answers"),
        ("s", 3, "conflicting_answers"), ("s", 4, "not_integer_fraction"), ("s", 5, "missing_problem"),
        ("s", 6, "bad_encoding")]
    # dedup off keeps both identical copies but still rejects the conflict.
    kept, _ = curate_records([SourceRecords("s", records)], CurateConfig(dedup=False))
    assert [p["source_row"] for p in kept] == [0, 1]
    with pytest.raises(CurationError, match="same source name"):
        curate_records([SourceRecords("s", []), SourceRecords("s", [])], config)


def test_synthetic_curation_is_deterministic_and_split_by_hash(tmp_path: Path) -> None:
    config = CurateConfig(prompt_template=TINY_PROMPT_TEMPLATE, test_fraction=0.2)
    spec = "synthetic:n=300,seed=0,min_terms=2,max_terms=4,max_operand=20"
    first = curate_sources([spec], tmp_path / "a", config)
    second = curate_sources([spec], tmp_path / "b", config)
    assert first == second
    assert files_under(tmp_path / "a") == files_under(tmp_path / "b")  # byte-identical shards and report
    assert first.kept + first.rejected == 300
    problems = read_shards(tmp_path / "a" / "problems", Problem)
    assert set(problems["source"].to_pylist()) == {"synthetic"}
    share = first.kept_by_split["test"] / first.kept
    assert 0.12 < share < 0.28  # ~0.2 of the unique problems; sd = sqrt(.2 * .8 / ~290) = 0.023
    row = problems.slice(0, 1).to_pylist()[0]
    assert row["prompt"] == row["problem"] + "=\n"
    # Re-curating into the same folder replaces the shards and leaves no staging folders behind.
    curate_sources([spec], tmp_path / "a", config)
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["curate_report.json", "problems", "rejected"]


def test_bad_whole_file_gives_clear_error_and_no_partial_output(tmp_path: Path) -> None:
    good = tmp_path / "good.parquet"
    pq.write_table(pa.table({"question": ["Q"] * 50, "answer": ["#### 1"] * 50}), good)
    truncated = tmp_path / "truncated.parquet"
    truncated.write_bytes(good.read_bytes()[:200])
    wrong = tmp_path / "wrong.parquet"
    pq.write_table(pa.table({"question": ["Q"], "answer": [1.5]}), wrong)
    out = tmp_path / "out"
    for bad, message in ((truncated, "truncated.parquet: cannot read"), (wrong, "wrong.parquet: column 'answer'")):
        with pytest.raises(CurationError, match=message):
            curate_sources([str(good), str(bad)], out, CurateConfig())
        assert not out.exists() or list(out.rglob("*")) == []


def test_bad_rows_are_rejected_not_fatal(tmp_path: Path) -> None:
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(
        b'{"question": "Q1", "answer": "#### 1,000"}\n'
        b'{"question": "Q2", "answer": "#### 2\xff"}\n'
        b'not json\n'
        b'{"question": "Q3", "answer": "#### \\\\frac{1}{2}"}\n'
    )
    report = curate_sources([str(path)], tmp_path / "out", CurateConfig())
    assert (report.input_rows, report.kept) == (4, 1)
    assert report.rejected_by_reason == {"bad_encoding": 1, "not_integer_fraction": 1, "unparseable": 1}
    kept = read_shards(tmp_path / "out" / "problems", Problem).to_pylist()
    assert (kept[0]["answer"], kept[0]["original_answer"]) == (1000, "1,000")
    rejected = read_shards(tmp_path / "out" / "rejected", RejectedProblem)
    assert rejected["source_row"].to_pylist() == [1, 2, 3]


@needs_data
def test_dapo_math_17k(tmp_path: Path) -> None:
    path = DATA / "dapo-math-17k.dedup.parquet"
    report = curate_sources([str(path)], tmp_path, CurateConfig())
    input_rows = pq.read_metadata(path).num_rows
    assert report.input_rows == input_rows == report.kept + report.rejected  # every row accounted for
    assert 17_000 <= report.kept <= 17_500
    rejected = read_shards(tmp_path / "rejected", RejectedProblem)
    conflicting = [r for r in rejected.to_pylist() if r["reason_code"] == "conflicting_answers"]
    assert len(conflicting) >= 20  # README: ~11 problems appear twice with different answers
    by_problem = Counter(problem_id(r["problem"]) for r in conflicting)  # copies may differ in whitespace
    assert all(n >= 2 for n in by_problem.values())  # every copy is rejected, not just one
    problems = read_shards(tmp_path / "problems", Problem)
    assert problems.num_rows == report.kept
    assert len(set(problems["problem_id"].to_pylist())) == report.kept  # unique after dedup
    assert set(problems["problem_id"].to_pylist()).isdisjoint(by_problem)  # no conflicting copy kept
    print(f"\ndapo-math-17k: {report.input_rows} rows -> kept {report.kept}; rejected {report.rejected_by_reason}")


@needs_data
def test_math500_aime(tmp_path: Path) -> None:
    report = curate_sources([str(DATA / "math500-aime24-aime25.parquet")], tmp_path, CurateConfig())
    assert report.input_rows == 560 == report.kept + report.rejected
    problems = read_shards(tmp_path / "problems", Problem)
    for original, answer in zip(problems["original_answer"].to_pylist(), problems["answer"].to_pylist()):
        assert int(original.replace(",", "").replace("^\\circ", "")) == answer
    rejected = read_shards(tmp_path / "rejected", RejectedProblem).to_pylist()
    assert all(r["reason_code"] and r["reason"] for r in rejected)
    assert {"not_integer_fraction", "expression", "tuple", "interval"} <= set(report.rejected_by_reason)
    fractions = [r["original_answer"] for r in rejected if r["reason_code"] == "not_integer_fraction"]
    assert "\\frac{14}{3}" in fractions
    print(f"\nmath500-aime24-aime25: kept {report.kept}, rejected by reason:")
    for reason, n in report.rejected_by_reason.items():
        print(f"  {reason:<22} {n}")


@needs_data
def test_gsm8k_test_all_kept(tmp_path: Path) -> None:
    report = curate_sources([str(DATA / "gsm8k-test.parquet")], tmp_path, CurateConfig())
    assert (report.input_rows, report.kept, report.rejected) == (1319, 1319, 0)
    problems = read_shards(tmp_path / "problems", Problem).to_pylist()
    by_row = {p["source_row"]: p for p in problems}
    assert by_row[0]["answer"] == 18  # "Janet's ducks": 16 - 3 - 4 = 9 eggs, 9 * 2 = $18
    assert any(p["original_answer"] == "1,450,000" and p["answer"] == 1_450_000 for p in problems)


@needs_data
def test_eval_file_given_as_test_split_wins_dedup(tmp_path: Path) -> None:
    inputs = [str(DATA / "math500-aime24-aime25.parquet"), str(DATA / "aime-2024.dapo-x32.parquet") + "@test"]
    report = curate_sources(inputs, tmp_path, CurateConfig())
    assert report.kept_by_source["aime-2024.dapo-x32.parquet"] == 30  # 960 rows = 30 problems x 32 copies
    assert report.kept_by_split["test"] == 30
    problems = read_shards(tmp_path / "problems", Problem).to_pylist()
    test_ids = {p["problem_id"] for p in problems if p["split"] == "test"}
    train_ids = {p["problem_id"] for p in problems if p["split"] == "train"}
    assert not test_ids & train_ids


def test_cli_and_flyte_task(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from workflows.cli import main

    os.environ.setdefault("DO_NOT_TRACK", "1")
    spec = "synthetic:n=40,seed=5"
    assert main(["curate", spec, "--template", "tiny", "--test-fraction", "0.25", "--out", str(tmp_path / "cli")]) == 0
    printed = capsys.readouterr().out
    assert "input rows: 40" in printed and "kept   train" in printed
    assert main(["curate", spec, "--template", "tiny", "--test-fraction", "0.25", "--flyte",
                 "--out", str(tmp_path / "flyte")]) == 0
    assert files_under(tmp_path / "cli") == files_under(tmp_path / "flyte")
    assert main(["curate", str(tmp_path / "missing.parquet"), "--out", str(tmp_path / "x")]) == 1
    assert "missing.parquet: no such file" in capsys.readouterr().err
