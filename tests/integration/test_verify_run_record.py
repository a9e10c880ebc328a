"""``dapo verify`` checks the run record too, and tells a folder that is no run from a damaged run.

Before, a hand-edited ``run.json`` (another config under the digest the run computed) verified as
intact, and ``dapo verify`` on a folder that is no run folder exited 1 ("a check found a problem")
where the README promises 2 for input that is wrong.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from storage.run_layout import RunLayout
from cli.main import main
from workflows.config import load_config
from workflows.exit_codes import BAD_INPUT, FAILED, OK
from cli.verify import verify_run

REPO = Path(__file__).resolve().parents[2]


def _run_folder(root: Path) -> RunLayout:
    """A run folder with what the driver writes first: run.json (the config and its digest)."""
    layout = RunLayout(str(root))
    config = load_config(REPO / "configs" / "tiny-cpu.yaml")
    root.mkdir(parents=True)
    Path(layout.run_record).write_text(json.dumps({"config": config.to_dict(), "config_digest": config.digest(),
                                                   "stage_versions": {}, "python": "3.11"}))
    return layout


def _edit_record(layout: RunLayout, edit) -> None:
    record = json.loads(Path(layout.run_record).read_text())
    edit(record)
    Path(layout.run_record).write_text(json.dumps(record))


def test_an_intact_run_record_verifies(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    layout = _run_folder(tmp_path / "run")
    assert verify_run(layout.root) == ([], 0)
    assert main(["verify", layout.root]) == OK


def test_a_hand_edited_run_record_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    layout = _run_folder(tmp_path / "run")
    digest = json.loads(Path(layout.run_record).read_text())["config_digest"]
    _edit_record(layout, lambda record: record["config"]["train"].update(eps_high=0.3))
    problems, _ = verify_run(layout.root)
    assert len(problems) == 1 and problems[0].startswith(f"{layout.run_record}: ") and digest in problems[0], problems
    assert main(["verify", layout.root]) == FAILED
    assert problems[0] in capsys.readouterr().out


def test_a_run_record_whose_config_no_longer_loads_is_reported(tmp_path: Path) -> None:
    layout = _run_folder(tmp_path / "run")
    _edit_record(layout, lambda record: record["config"]["train"].update(no_such_field=1))
    problems, _ = verify_run(layout.root)
    assert len(problems) == 1 and problems[0].startswith(f"{layout.run_record}: ") and "no_such_field" in problems[0]


def test_a_run_record_without_its_digest_is_reported(tmp_path: Path) -> None:
    layout = _run_folder(tmp_path / "run")
    _edit_record(layout, lambda record: record.pop("config_digest"))
    problems, _ = verify_run(layout.root)
    assert problems == [f"{layout.run_record}: records no config_digest; its config cannot be checked"]


@pytest.mark.parametrize("kind", ["empty folder", "missing folder", "a file"])
def test_a_folder_that_is_no_run_is_bad_input(kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "target"
    if kind == "empty folder":
        target.mkdir()
    elif kind == "a file":
        target.write_text("x")
    code = main(["verify", str(target), "--run-root", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert code == BAD_INPUT, err
    assert err.startswith("dapo verify: error: ") and str(target) in err and len(err.strip().splitlines()) == 1, err
