"""Evaluation sets: copies of a problem are one problem (DAPO's AIME x32 layout), Problem shards pass through."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import schemas
from dapo_core.answers import problem_id
from engines.evaluate.eval_sets import load_eval_set

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
AIME_X32 = DATA / "aime-2024.dapo-x32.parquet"


def _verl_rows(items: list[tuple[str, str]]) -> pa.Table:
    """verl/DAPO layout rows: (problem, ground truth) each."""
    return pa.Table.from_pylist([
        {
            "data_source": "math_dapo",
            "prompt": [{"role": "user", "content": f"Solve.\n\n{problem}\n\nRemember to put your answer..."}],
            "reward_model": {"ground_truth": answer, "style": "rule"},
            "extra_info": {"index": i, "raw_problem": problem},
        }
        for i, (problem, answer) in enumerate(items)
    ])


def test_copies_collapse_into_one_problem_each(tmp_path: Path) -> None:
    # 3 distinct problems copied 4, 4 and 2 times (interleaved, like a shuffled x32 file), and one
    # row whose answer is not an integer: 3 problems, not 11, and one rejected row.
    items = [("What is 2+3?", "5"), ("What is 7*6?", "42"), ("Compute 10-1.", "9")] * 2
    items += [("What is 2+3?", "5"), ("What is 7*6?", "42")] * 2
    items += [("Find x if x^2 = 2.", "\\sqrt{2}")]
    path = tmp_path / "aime-like.parquet"
    pq.write_table(_verl_rows(items), path)

    got = load_eval_set([str(path)], prompt_template="Q: {problem}\nA:")
    assert [p.copies for p in got.problems] == [4, 4, 2]
    assert [p.answer for p in got.problems] == [5, 42, 9]
    assert got.problems[0].prompt == "Q: What is 2+3?\nA:"
    assert got.problems[0].problem_id == problem_id("What is 2+3?")
    assert got.input_rows == 11
    assert sum(got.rejected.values()) == 1


def test_problem_shards_keep_their_prompts(tmp_path: Path) -> None:
    rows = [
        {"problem_id": problem_id(text), "source": "s", "source_row": i, "problem": text, "answer": ans,
         "original_answer": str(ans), "prompt": f"{text}=\n", "split": "test", "answer_rule": "integer"}
        for i, (text, ans) in enumerate([("1+2", 3), ("4-9", -5)])
    ]
    shard = tmp_path / "problems" / "test-00000.parquet"
    schemas.write_shard(rows, shard, schemas.Problem)
    got = load_eval_set([str(shard.parent)])  # a folder of shards works too
    assert [(p.prompt, p.answer, p.copies) for p in got.problems] == [("1+2=\n", 3, 1), ("4-9=\n", -5, 1)]


def test_a_problem_with_two_gold_answers_is_an_error(tmp_path: Path) -> None:
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    pq.write_table(_verl_rows([("What is 2+3?", "5")]), a)
    pq.write_table(_verl_rows([("What is 2+3?", "6")]), b)
    with pytest.raises(ValueError, match=r"b.parquet.*gold answer 6 here and 5"):
        load_eval_set([str(a), str(b)])


def test_nothing_to_evaluate_names_the_inputs(tmp_path: Path) -> None:
    path = tmp_path / "bad.parquet"
    pq.write_table(_verl_rows([("Find x.", "\\sqrt{2}")]), path)
    with pytest.raises(ValueError, match="bad.parquet.*no problem with an integer answer"):
        load_eval_set([str(path)])


@pytest.mark.skipif(not AIME_X32.is_file(), reason=f"shared data file {AIME_X32} is absent")
def test_dapo_aime_x32_is_30_problems_of_32_copies() -> None:
    got = load_eval_set([str(AIME_X32)])
    assert got.input_rows == 960
    assert len(got.problems) == 30
    assert {p.copies for p in got.problems} == {32}
    assert len({p.problem_id for p in got.problems}) == 30
    assert got.rejected == {}
