"""Source readers of the curation stage (readers/problem_files.py): layouts, specs and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dapo_core.answers import DAPO_PROMPT_TEMPLATE, render_prompt
from readers.problem_files import CurationError, parse_input_spec, read_input


def chat(text: str) -> list[dict[str, str]]:
    return [{"content": text, "role": "user"}]


def test_parse_input_spec() -> None:
    assert parse_input_spec("a/b.parquet@test") == parse_input_spec("a/b.parquet@test")
    spec = parse_input_spec("a/b.parquet@test")
    assert (spec.kind, spec.target, spec.split) == ("file", "a/b.parquet", "test")
    spec = parse_input_spec("synthetic:n=5,seed=3")
    assert (spec.kind, spec.options) == ("synthetic", {"n": "5", "seed": "3"})
    assert parse_input_spec("hf:/x/y").kind == "hf"
    with pytest.raises(CurationError, match="not key=value"):
        parse_input_spec("synthetic:n")


def test_verl_layout_prefers_raw_problem_and_unwraps_the_template(tmp_path: Path) -> None:
    path = tmp_path / "verl.parquet"
    wrapped = render_prompt(DAPO_PROMPT_TEMPLATE, "What is 2+2?")
    pq.write_table(pa.Table.from_pylist([
        {"prompt": chat("Bare problem one."), "reward_model": {"ground_truth": "34"}, "extra_info": {"raw_problem": None}},
        {"prompt": chat(wrapped), "reward_model": {"ground_truth": "4"}, "extra_info": {"raw_problem": None}},
        {"prompt": chat(wrapped), "reward_model": {"ground_truth": "5"}, "extra_info": {"raw_problem": "Raw one."}},
    ]), path)
    (source,) = read_input(str(path))
    assert source.source == "verl.parquet"
    assert [(r.source_row, r.problem, r.answer) for r in source.records] == [
        (0, "Bare problem one.", "34"), (1, "What is 2+2?", "4"), (2, "Raw one.", "5")]


def test_gsm8k_and_math_layouts(tmp_path: Path) -> None:
    gsm = tmp_path / "gsm.parquet"
    pq.write_table(pa.table({"question": ["Q1", "Q2"], "answer": ["3+4=7\n#### 1,007", "no final line"]}), gsm)
    (source,) = read_input(str(gsm))
    assert (source.records[0].problem, source.records[0].answer) == ("Q1", "1,007")
    assert source.records[1].error_code == "missing_answer"
    math_file = tmp_path / "math.jsonl"
    math_file.write_text(
        json.dumps({"problem": "P1", "solution": "so $\\boxed{\\frac{68}{2}}$"}) + "\n"
        + json.dumps({"problem": "P2", "answer": "12", "solution": "x"}) + "\n"
    )
    (source,) = read_input(str(math_file) + "@test")
    assert [(r.problem, r.answer, r.split) for r in source.records] == [("P1", "\\frac{68}{2}", "test"), ("P2", "12", "test")]


def test_jsonl_bad_lines_become_row_errors(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(
        b'{"question": "ok", "answer": "#### 3"}\n'
        b'{"question": "caf\xe9", "answer": "#### 4"}\n'  # latin-1 byte: not UTF-8
        b'{"question": oops}\n'
        b'{"question": 5, "answer": "#### 6"}\n'  # wrong cell type
    )
    (source,) = read_input(str(path))
    assert [r.error_code for r in source.records] == [None, "bad_encoding", "unparseable", "unparseable"]
    assert "line 2" in (source.records[1].error or "")


def test_parquet_invalid_utf8_rows_are_rejected_not_fatal(tmp_path: Path) -> None:
    path = tmp_path / "enc.parquet"
    questions = pa.array([b"fine", b"caf\xe9"], pa.binary())
    pq.write_table(pa.table({"question": questions, "answer": ["#### 1", "#### 2"]}), path)
    (source,) = read_input(str(path))
    assert [r.error_code for r in source.records] == [None, "bad_encoding"]
    assert source.records[0].problem == "fine"
    # A string column holding invalid UTF-8 (Arrow does not validate on write): same outcome.
    strings = pa.table({"question": questions.view(pa.string()), "answer": ["#### 1", "#### 2"]})
    pq.write_table(strings, path)
    (source,) = read_input(str(path))
    assert [r.error_code for r in source.records] == [None, "bad_encoding"]


def test_whole_file_problems_raise_curation_error_naming_the_file(tmp_path: Path) -> None:
    empty = tmp_path / "empty.parquet"
    empty.write_bytes(b"")
    with pytest.raises(CurationError, match="empty.parquet: empty file"):
        read_input(str(empty))
    good = tmp_path / "good.parquet"
    pq.write_table(pa.table({"question": ["Q"] * 100, "answer": ["#### 1"] * 100}), good)
    truncated = tmp_path / "truncated.parquet"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(CurationError, match="truncated.parquet: cannot read as Parquet"):
        read_input(str(truncated))
    wrong = tmp_path / "wrong.parquet"
    pq.write_table(pa.table({"question": [1, 2], "answer": ["#### 1", "#### 2"]}), wrong)
    with pytest.raises(CurationError, match="wrong.parquet: column 'question' has type int64, expected string"):
        read_input(str(wrong))
    unknown = tmp_path / "unknown.parquet"
    pq.write_table(pa.table({"text": ["x"]}), unknown)
    with pytest.raises(CurationError, match="unknown.parquet: unknown layout"):
        read_input(str(unknown))
    verl = tmp_path / "verl.parquet"
    pq.write_table(pa.table({"prompt": [1], "reward_model": [{"ground_truth": "1"}]}), verl)
    with pytest.raises(CurationError, match="column 'prompt' has type int64"):
        read_input(str(verl))
    with pytest.raises(CurationError, match="no such file"):
        read_input(str(tmp_path / "missing.parquet"))
    with pytest.raises(CurationError, match=r"good.parquet@val: no such file \(a split suffix is @train or @test, not '@val'\)"):
        read_input(str(good) + "@val")
    csv = tmp_path / "problems.csv"
    csv.write_text("question,answer\nQ,#### 1\n")
    with pytest.raises(CurationError, match=r"problems.csv: unknown file type '.csv'; inputs are .parquet, .jsonl"):
        read_input(str(csv))


def test_synthetic_source_is_deterministic() -> None:
    (a,) = read_input("synthetic:n=20,seed=3,min_terms=2,max_terms=3,max_operand=9")
    (b,) = read_input("synthetic:n=20,seed=3,min_terms=2,max_terms=3,max_operand=9")
    assert a == b and a.source == "synthetic" and len(a.records) == 20
    first = a.records[0]
    # The answer is the sum of the terms of the problem text, e.g. "7+3-2" -> 8.
    from readers.synthetic import parse_terms
    assert int(first.answer or "") == sum(parse_terms(first.problem or ""))
    with pytest.raises(CurationError, match="unknown option"):
        read_input("synthetic:n=2,colour=red")
    with pytest.raises(CurationError, match=r"synthetic: n='abc' is not an integer"):
        read_input("synthetic:n=abc")
    with pytest.raises(CurationError, match=r"synthetic: test_fraction='x' is not a number"):
        read_input("synthetic:n=2,test_fraction=x")


def test_hf_dataset_saved_to_disk(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    dd = datasets.DatasetDict({
        "train": datasets.Dataset.from_dict({"problem": ["A", "B"], "answer": ["1", "\\frac{1}{2}"]}),
        "test": datasets.Dataset.from_dict({"problem": ["C"], "answer": ["3"]}),
    })
    dd.save_to_disk(str(tmp_path / "mini"))
    sources = read_input(f"hf:{tmp_path / 'mini'}")
    assert [s.source for s in sources] == ["hf:mini/test", "hf:mini/train"]
    assert [(r.problem, r.answer, r.split) for r in sources[1].records] == [("A", "1", "train"), ("B", "\\frac{1}{2}", "train")]
    with pytest.raises(CurationError, match="cannot load data set offline"):
        read_input(f"hf:{tmp_path / 'nothing-here'}")


def test_input_paths_that_are_not_readable_files_say_what_they_are(tmp_path: Path) -> None:
    """Issue 45: a gzip file was called "unknown layout" (or its lines rejected one by one), a folder
    and a symlink loop "no such file". Each now names the path and what it is."""
    import gzip

    lines = b'{"question": "Q", "answer": "#### 1"}\n'
    for name, body in (("rows.jsonl", lines), ("rows.jsonl.gz", lines), ("rows.parquet", b"PAR1")):
        packed = tmp_path / name
        packed.write_bytes(gzip.compress(body))
        with pytest.raises(CurationError, match=rf"{packed}: is gzip-compressed; decompress it first"):
            read_input(str(packed))
    folder = tmp_path / "folder"
    folder.mkdir()
    with pytest.raises(CurationError, match=rf"{folder}: is a directory, not a file; .*hf:{folder}"):
        read_input(str(folder))
    loop = tmp_path / "loop.parquet"
    loop.symlink_to(loop)
    with pytest.raises(CurationError, match=rf"{loop}: symbolic link loop"):
        read_input(str(loop))
    dangling = tmp_path / "dangling.parquet"
    dangling.symlink_to(tmp_path / "gone.parquet")
    with pytest.raises(CurationError, match=rf"{dangling}: no such file"):
        read_input(str(dangling))
    with pytest.raises(CurationError, match=rf"{tmp_path / 'missing.jsonl'}: no such file"):
        read_input(str(tmp_path / "missing.jsonl"))
    with pytest.raises(CurationError, match=rf"{loop}: symbolic link loop"):
        read_input(f"hf:{loop}")


def test_a_saved_hf_folder_given_as_a_file_points_to_hf(tmp_path: Path) -> None:
    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "dataset_dict.json").write_text("{}")
    with pytest.raises(CurationError, match=rf"{saved}: is a directory holding a Hugging Face data set; give it as hf:{saved}"):
        read_input(str(saved))
