"""benchmarks/result_file.py: a benchmark's JSON result is written whole, through a renamed
temporary file, into a folder made for it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from result_file import write_result  # noqa: E402


def test_the_result_lands_whole_and_no_temporary_file_stays(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "results" / "bench.json"
    assert write_result(out, {"seeds": [0, 1], "ratio": 1.5}) == out
    assert json.loads(out.read_text()) == {"seeds": [0, 1], "ratio": 1.5}
    assert sorted(p.name for p in out.parent.iterdir()) == ["bench.json"]
    assert capsys.readouterr().out == f"wrote {out}\n"


def test_a_result_that_cannot_be_written_leaves_the_previous_one(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    write_result(out, {"run": 1})
    with pytest.raises(TypeError):
        write_result(out, {"run": 2, "bad": object()})  # not JSON: nothing replaces the old result
    assert json.loads(out.read_text()) == {"run": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.json"]
