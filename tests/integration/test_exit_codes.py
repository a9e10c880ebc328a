"""Every command exits 2, with one line naming the bad file or folder, when what it was given is
wrong (README "Exit codes"); before, curate, rollout, train, bootstrap, ask, lineage and deploy said 1,
the code for "the work failed", so a script could not tell a typo from a crash."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.main import main
from workflows.exit_codes import BAD_INPUT, FAILED

REPO = Path(__file__).resolve().parents[2]
POLICY = REPO / "assets" / "policies" / "tiny-addsub30"


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    not_a_shard = tmp_path / "notes.parquet"
    not_a_shard.write_text("not parquet\n")
    no_layout = tmp_path / "rows.jsonl"
    no_layout.write_text('{"colour": "red"}\n')
    math = tmp_path / "math.jsonl"
    math.write_text('{"problem": "3+4", "answer": "7"}\n')
    return {"missing": tmp_path / "missing.jsonl", "not_a_shard": not_a_shard, "no_layout": no_layout, "math": math,
            "empty": tmp_path / "empty", "out": tmp_path / "out", **_pruned_run(tmp_path / "runs")}


def _pruned_run(root: Path) -> dict[str, Path]:
    """A main-job run folder under ``root`` whose step-1 checkpoint lost its weights to the retention
    policy, and whose run.json records other rollout code than this one."""
    import json
    import shutil

    from workflows.config import load_config
    from workflows.driver import generating_versions

    config = load_config(REPO / "configs" / "tiny-cpu.yaml")
    run = root / config.run.name
    (run / "curate").mkdir(parents=True)
    checkpoint = run / "checkpoints" / "step-0001"
    shutil.copytree(POLICY, checkpoint, ignore=shutil.ignore_patterns("*.safetensors"))
    weights = {"bytes": 1, "sha256": "0" * 64, "part": "weights"}
    (run / "checkpoints" / "step-0001.pruned.json").write_text(json.dumps({"files": {"step-0001/model.safetensors": weights}}))
    versions = {**generating_versions(), "rollout": "rollout-0000000000000000"}
    (run / "run.json").write_text(json.dumps({"config": config.to_dict(), "stage_versions": versions}))
    return {"runs": root, "pruned": checkpoint}


CASES = {
    "curate, a missing file": (["curate", "{missing}", "--out", "{out}"], "{missing}"),
    "curate, rows of no known layout": (["curate", "{no_layout}", "--out", "{out}"], "{no_layout}"),
    "rollout, a file that is no shard": (["rollout", str(POLICY), "{not_a_shard}", "--out", "{out}/r.parquet"],
                                         "{not_a_shard}"),
    "train, a file that is no shard": (["train", str(POLICY), "{not_a_shard}", "--step", "1", "--out", "{out}"],
                                       "{not_a_shard}"),
    "train, a folder that is no checkpoint": (["train", "{empty}", "{not_a_shard}", "--step", "1", "--out", "{out}"],
                                              "{empty}"),
    "eval, rows of no known layout": (["eval", str(POLICY), "{no_layout}", "--out", "{out}/e.parquet"], "{no_layout}"),
    "ask, a folder that is no checkpoint": (["ask", "{empty}", "3+4"], "{empty}"),
    "lineage, a folder that is no run": (["lineage", "{empty}", "--step", "1"], "{empty}"),
    "deploy, an unknown --model": (["deploy", "--dry-run", "--config", str(REPO / "configs" / "tiny-cpu.yaml"),
                                     "--model", "no-such-model"], "no-such-model"),
    "bootstrap, an unknown setting": (["bootstrap", "--out", "{out}", "--set", "no_such_field=1"], "no_such_field"),
    # A checkpoint whose weights the retention policy deleted: named, with its pruned record.
    "ask, a pruned checkpoint": (["ask", "{pruned}", "3+4"], "{pruned}.pruned.json"),
    "serve, a pruned checkpoint": (["serve", "{pruned}"], "{pruned}.pruned.json"),
    "eval, a pruned checkpoint": (["eval", "{pruned}", "{math}", "--out", "{out}/e.parquet"], "{pruned}.pruned.json"),
    "train, a pruned checkpoint": (["train", "{pruned}", "{not_a_shard}", "--step", "2", "--out", "{out}"],
                                   "{pruned}.pruned.json"),
    # Resumed with other rollout code, it would generate from that checkpoint again: refused before any work.
    "run, a resume that would generate from a pruned checkpoint": (
        ["run", "--config", str(REPO / "configs" / "tiny-cpu.yaml"), "--run-root", "{runs}"], "{pruned}"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_exits_2_naming_it(case: str, files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    files["empty"].mkdir()
    argv, named = CASES[case]
    code = main([arg.format(**files) for arg in argv])
    err = capsys.readouterr().err
    assert code == BAD_INPUT, (code, err[-2000:])
    assert named.format(**files) in err, err[-2000:]
    assert "Traceback" not in err
    assert not files["out"].exists()  # nothing written


def test_an_engine_fault_in_ask_exits_1_with_its_traceback(monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    # What the engine returned, not what the user gave: before, `dapo ask` said 2 ("bad input") for it.
    from engines.rollout.stage import EngineOutputError
    from cli import ask

    def engine_fault(*args: object, **kwargs: object) -> None:
        raise EngineOutputError("problem p1 sample 0: finish reason 'abort'")

    monkeypatch.setattr(ask, "generate_rollouts", engine_fault)
    code = main(["ask", str(POLICY), "3+4"])
    err = capsys.readouterr().err
    assert code == FAILED, (code, err[-2000:])
    assert "Traceback" in err and "finish reason 'abort'" in err, err[-2000:]
