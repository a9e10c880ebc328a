"""The driver's check that curated train and test shards share no problem (issue 45): held-out
accuracy must measure problems the policy never trained on (engines/curate/stage.py: check_splits_disjoint)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from dapo_core.answers import TINY_PROMPT_TEMPLATE, problem_id, render_prompt
from engines.curate.stage import CurateReport, SplitOverlapError, check_curated_splits_disjoint, check_splits_disjoint
from schemas import Problem, write_shard


def test_disjoint_splits_pass_and_an_overlap_names_ids_and_shards() -> None:
    check_splits_disjoint({"train-00000.parquet": ["a", "b"]}, {"test-00000.parquet": ["c"]})
    check_splits_disjoint({}, {"test-00000.parquet": ["c"]})
    train = {"p/train-00000.parquet": ["a", "b"], "p/train-00001.parquet": ["c", "d", "e", "f", "g"]}
    test = {"p/test-00000.parquet": ["x", "b", "c", "d", "e", "f", "g"]}
    with pytest.raises(SplitOverlapError) as caught:
        check_splits_disjoint(train, test)
    message = str(caught.value)
    assert "6 problem ids are in both" in message
    assert message.split("e.g. ")[1].split(")")[0] == "b, c, d, e, f"  # the first five, sorted
    assert all(shard in message for shard in (*train, *test))
    # Only the shards that hold an overlapping id are named.
    with pytest.raises(SplitOverlapError) as caught:
        check_splits_disjoint({"t0": ["a"], "t1": ["b"]}, {"s0": ["b"], "s1": ["z"]})
    assert "t1" in str(caught.value) and "s0" in str(caught.value)
    assert "t0" not in str(caught.value) and "s1" not in str(caught.value)


def _problem_rows(numbers: list[int], split: str) -> list[dict[str, Any]]:
    return [{"problem_id": problem_id(f"{n}+0"), "source": "s", "source_row": n, "problem": f"{n}+0", "answer": n,
             "original_answer": str(n), "prompt": render_prompt(TINY_PROMPT_TEMPLATE, f"{n}+0"), "split": split,
             "answer_rule": "integer"} for n in numbers]


def test_the_check_reads_the_curated_shards(tmp_path: Path) -> None:
    train, test = tmp_path / "train-00000.parquet", tmp_path / "test-00000.parquet"
    write_shard(_problem_rows([1, 2, 3], "train"), train, Problem)
    write_shard(_problem_rows([4], "test"), test, Problem)
    check_curated_splits_disjoint([str(train)], [str(test)])
    write_shard(_problem_rows([3, 4], "test"), test, Problem)
    with pytest.raises(SplitOverlapError, match=f"e.g. {problem_id('3+0')}"):
        check_curated_splits_disjoint([str(train)], [str(test)])


def test_the_driver_refuses_overlapping_splits_right_after_curation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """prepare_run checks the curated shards before the pool size, the prompt lengths and bootstrap."""
    from storage.run_layout import RunLayout
    from workflows import driver
    from workflows.config import load_config

    cfg = load_config(Path(__file__).resolve().parents[2] / "configs" / "tiny-cpu.yaml")
    layout = RunLayout(str(tmp_path / "run"))
    calls: list[str] = []

    async def fake_call_verified(task: Any, outputs: Any, *args: Any, upstream: Any = ()) -> Any:
        calls.append(getattr(task, "short_name", None) or getattr(task, "name", repr(task)))
        problems = Path(layout.problems_dir)
        write_shard(_problem_rows(list(range(40)), "train"), problems / "train-00000.parquet", Problem)
        write_shard(_problem_rows([7, 100], "test"), problems / "test-00000.parquet", Problem)
        return CurateReport(input_rows=42, kept=42, rejected=0, kept_by_split={"train": 40, "test": 2},
                            rejected_by_reason={}, kept_by_source={"s": 42}, kept_by_rule={"integer": 42},
                            rejected_by_source={})

    monkeypatch.setattr(driver, "call_verified", fake_call_verified)
    with pytest.raises(SplitOverlapError, match=problem_id("7+0")):
        asyncio.run(driver.prepare_run(cfg, layout))
    assert len(calls) == 1  # curation only: nothing was bootstrapped
