"""``dapo report RUN``: a folder that is no run folder, or one without summary.json, is the user's
mistake: one line naming it, exit code 2, nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.main import main


def test_no_run_folder_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nowhere" in err[0] and "not a run folder" in err[0]


def test_a_run_folder_without_summary_is_refused_before_drawing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "run.json").write_text("{}")
    assert main(["report", str(tmp_path)]) == 2
    assert "no summary.json" in capsys.readouterr().err
    assert not (tmp_path / "report").exists()
