"""A run folder belongs to one config and one driver: the record check, the lock, and temp clean-up."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from workflows.run_binding import (
    LOCK_FILE,
    RunFolderError,
    check_run_folder,
    check_run_record,
    config_changes,
    hold_run_folder,
)

REPO = Path(__file__).resolve().parents[2]
OLD = {"run": {"name": "r", "steps": 4, "data": ["synthetic:n=10"]}, "train": {"lr": 1e-4, "eps_high": 0.28}}


def _with(section: str, field: str, value: object) -> dict:
    new = json.loads(json.dumps(OLD))
    new[section][field] = value
    return new


def test_same_config_resumes_and_tuples_equal_lists() -> None:
    check_run_record("runs/r", {"config": OLD}, {**OLD, "run": {**OLD["run"], "data": ("synthetic:n=10",)}})
    check_run_record("runs/r", None, OLD)  # a fresh folder


def test_more_steps_is_a_resume_fewer_is_refused() -> None:
    check_run_record("runs/r", {"config": OLD}, _with("run", "steps", 10))
    with pytest.raises(RunFolderError, match=r"run\.steps 4 -> 2"):
        check_run_record("runs/r", {"config": OLD}, _with("run", "steps", 2))


def test_retention_may_change_on_resume_and_be_missing_from_an_older_record() -> None:
    # run.json written before the retention fields existed lacks them; turning retention on (or
    # changing it) resumes the same run: it decides what is stored, not what a step computes.
    check_run_record("runs/r", {"config": OLD}, _with("run", "keep_optimizer_checkpoints", 2))
    newer = _with("run", "keep_optimizer_checkpoints", 2)
    newer["run"]["keep_weights_every_steps"] = 5
    check_run_record("runs/r", {"config": newer}, {**newer, "run": {**newer["run"], "keep_weights_every_steps": 10}})
    with pytest.raises(RunFolderError, match=r"train\.lr"):
        check_run_record("runs/r", {"config": OLD}, {**_with("train", "lr", 2e-4), "run": newer["run"]})


def test_a_run_that_published_no_checkpoint_binds_nothing(tmp_path: Path) -> None:
    """A run refused before its step-0 policy was published (a missing input file; after curation: a
    pool too small for a step, a prompt too long, a bad bootstrap.source) leaves a run.json, and curate/
    maybe; a run of the corrected config (the refusal's own advice, e.g. --set run.max_rounds=1) starts
    in that folder, rebinding it (curate/ is re-made by its cached task when its inputs changed). Once
    a checkpoint exists the record binds: a step-0 policy of another config is never replaced."""
    from storage.run_layout import RunLayout

    layout = RunLayout(tmp_path / "r")
    Path(layout.root).mkdir()
    Path(layout.run_record).write_text(json.dumps({"config": OLD}))
    fixed = _with("run", "data", ["synthetic:n=20"])
    check_run_folder(layout, fixed)
    Path(layout.curate_dir).mkdir()
    check_run_folder(layout, fixed)
    Path(layout.checkpoint(0)).mkdir(parents=True)
    with pytest.raises(RunFolderError, match=r"run\.data"):
        check_run_folder(layout, fixed)


def test_a_moved_run_folder_is_refused_in_one_line_naming_both_places(tmp_path: Path) -> None:
    """A run folder's cached stages are keyed on its absolute paths: moved or copied, a resume used to
    fail after 24 s blaming a code change. run.json records where it was bound; elsewhere it is refused
    before any work, naming both places."""
    from storage.run_layout import RunLayout

    layout = RunLayout(tmp_path / "moved")
    Path(layout.checkpoint(0)).mkdir(parents=True)
    Path(layout.run_record).write_text(json.dumps({"config": OLD, "run_dir": str(tmp_path / "r")}))
    with pytest.raises(RunFolderError) as info:
        check_run_folder(layout, OLD)
    message = str(info.value)
    assert f"run folder {layout.root} was moved or copied from {tmp_path / 'r'}" in message, message
    assert "--set run.name=" in message and "\n" not in message
    Path(layout.run_record).write_text(json.dumps({"config": OLD, "run_dir": str(layout.root)}))
    check_run_folder(layout, OLD)  # where it was bound
    Path(layout.run_record).write_text(json.dumps({"config": OLD}))
    check_run_folder(layout, OLD)  # a record from before run_dir was kept checks nothing


def test_the_lock_file_is_never_opened_through_a_symlink(tmp_path: Path) -> None:
    """A symlink at .dapo-run.lock had its target overwritten with the holder's record."""
    target = tmp_path / "precious.txt"
    target.write_text("keep me\n")
    folder = tmp_path / "r"
    folder.mkdir()
    (folder / LOCK_FILE).symlink_to(target)
    with pytest.raises(RunFolderError, match=r"\.dapo-run\.lock.*not a regular file"):
        with hold_run_folder(folder):
            pass
    assert target.read_text() == "keep me\n"
    (folder / LOCK_FILE).unlink()
    (folder / LOCK_FILE).mkdir()
    with pytest.raises(RunFolderError, match=r"\.dapo-run\.lock.*not a regular file"):
        with hold_run_folder(folder):
            pass


def test_a_run_root_that_cannot_be_written_is_refused_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A read-only run root (or run folder) gave a PermissionError traceback and exit 1. As root every
    folder is writable, so the refusal is checked through os.access, as a non-root user sees it."""
    import os as os_module

    from cli.main import main

    root = tmp_path / "readonly"
    root.mkdir()
    real_access = os_module.access
    monkeypatch.setattr(os_module, "access", lambda path, mode, **kw: False if Path(path) == root and mode & os_module.W_OK
                        else real_access(path, mode, **kw))
    assert main(["run", "--run-root", str(root), "--set", "run.steps=0"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [err.strip()] and f"{root} is not writable" in err, err
    assert list(root.iterdir()) == []


def test_another_config_is_refused_naming_each_field() -> None:
    new = _with("train", "lr", 2e-4)
    new["train"]["eps_high"] = 0.2
    assert config_changes(OLD, new) == [("train.eps_high", 0.28, 0.2), ("train.lr", 1e-4, 2e-4)]
    with pytest.raises(RunFolderError) as info:
        check_run_record("runs/r", {"config": OLD}, new)
    message = str(info.value)
    assert "train.eps_high 0.28 -> 0.2; train.lr 0.0001 -> 0.0002" in message
    assert "--set run.name=" in message and "--run-root" in message and "\n" not in message


_HOLDER = """
import sys, time
from workflows.run_binding import hold_run_folder
with hold_run_folder(sys.argv[1]):
    print("held", flush=True)
    time.sleep(60)
"""


def test_a_second_driver_is_refused_while_the_first_lives(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunFolderError) as info:
            with hold_run_folder(tmp_path):
                pass
        assert f"run folder {tmp_path} is already in use by pid {holder.pid} on {socket.gethostname()} since " in str(info.value)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # killed: the kernel dropped its lock; the record it left is taken over with a note
    notes: list[str] = []
    with hold_run_folder(tmp_path, note=notes.append):
        record = json.loads((tmp_path / LOCK_FILE).read_text())
        assert record["pid"] == os.getpid()
    assert len(notes) == 1 and f"stale lock of run folder {tmp_path} (pid {holder.pid}" in notes[0]
    # released cleanly: the next holder takes it without a note
    with hold_run_folder(tmp_path, note=notes.append):
        pass
    assert len(notes) == 1


def test_stale_train_temp_folders_are_removed(tmp_path: Path) -> None:
    from engines.train.launch import clean_stale_temp_dirs

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = Path(tempfile.mkdtemp(prefix=f"dapo-train-3-pid{dead.pid}-", dir=tmp_path))
    serve = Path(tempfile.mkdtemp(prefix=f"dapo-train-serve-pid{dead.pid}-", dir=tmp_path))
    live = Path(tempfile.mkdtemp(prefix=f"dapo-train-3-pid{os.getpid()}-", dir=tmp_path))
    unknown = Path(tempfile.mkdtemp(prefix="dapo-train-3-", dir=tmp_path))
    assert sorted(clean_stale_temp_dirs(tmp_path)) == sorted([stale, serve])
    assert live.is_dir() and unknown.is_dir() and not stale.exists()


def test_published_checkpoint_files_are_world_readable(tmp_path: Path) -> None:
    from storage import checkpoints

    final = tmp_path / "ckpt" / "step-1"
    staging = checkpoints.staging_dir(final)
    staging.chmod(0o700)
    weights = staging / "model.safetensors"
    weights.write_bytes(b"x")
    weights.chmod(0o600)
    info = checkpoints.CheckpointInfo(checkpoint_id="train-1-abc", step=1, parent_checkpoint_id=None, produced_by="train")
    checkpoints.publish(staging, final, info)
    assert (final / "model.safetensors").stat().st_mode & 0o777 == 0o644
    assert final.stat().st_mode & 0o777 == 0o755



def test_a_record_from_before_run_pipelined_resumes_synchronously_only() -> None:
    # run.json written before run.pipelined existed lacks it: the synchronous default is that run;
    # pipelined is another run (its rollouts come from other checkpoints).
    check_run_record("runs/r", {"config": OLD}, _with("run", "pipelined", False))
    with pytest.raises(RunFolderError, match=r"run\.pipelined"):
        check_run_record("runs/r", {"config": OLD}, _with("run", "pipelined", True))
    with pytest.raises(RunFolderError, match=r"run\.pipelined"):
        check_run_record("runs/r", {"config": _with("run", "pipelined", True)}, _with("run", "pipelined", False))


def test_a_run_root_that_is_a_file_is_refused_before_anything_is_created(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from cli.main import main

    root = tmp_path / "rootfile"
    root.write_text("not a folder")
    for argv in (["run", "--run-root", str(root)], ["run", "--run-root", str(root / "deeper")],
                 ["ablate", "--config", str(REPO / "configs" / "ablation-addsub.yaml"), "--run-root", str(root)]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert f"{root} is a file, not a folder" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rootfile"]


def test_ablate_refuses_a_rung_the_ladder_does_not_have(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from cli.main import main

    for rungs in (["9"], ["2", "-1"]):
        argv = ["ablate", "--config", str(REPO / "configs" / "ablation-addsub.yaml"), "--run-root", str(tmp_path), "--rungs", *rungs]
        assert main(argv) == 2
        assert f"--rungs {rungs[-1]}: no such rung; the ladder has rungs 0-5" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_a_stop_that_reaches_the_command_line_says_which_signal(monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """A SIGTERM that lands outside the driver's own handling (e.g. while the summary is printed) reaches
    `dapo` as the pipeline's Terminated: one line naming SIGTERM and 143, not Ctrl-C's 130."""
    from cli import main as cli
    from workflows.local_run import Terminated

    def stopped(argv: list[str]) -> int:
        raise Terminated

    monkeypatch.setattr(cli, "_run_command", stopped)
    assert cli.main(["run"]) == 143
    assert capsys.readouterr().err.strip() == "dapo run: stopped (SIGTERM)"

    def interrupted(argv: list[str]) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_run_command", interrupted)
    assert cli.main(["run"]) == 130
    assert capsys.readouterr().err.strip() == "dapo run: interrupted (Ctrl-C)"


def _pruned_run(tmp_path: Path, versions: dict[str, str] | None, *, pruned: dict[int, str], evaluated: tuple[int, ...] = ()):
    """A run folder that published its curation, whose run.json records ``versions``, with pruned
    records for ``pruned`` (step -> part) and evaluation shards at ``evaluated``."""
    from storage.run_layout import RunLayout

    layout = RunLayout(tmp_path / "r")
    Path(layout.curate_dir).mkdir(parents=True)
    Path(layout.run_record).write_text(json.dumps({"config": OLD, **({"stage_versions": versions} if versions else {})}))
    Path(layout.checkpoints_dir).mkdir()
    for step, part in pruned.items():
        name = f"step-{step:04d}"
        Path(layout.checkpoint(step)).mkdir()
        files = {f"{name}/model.safetensors": {"bytes": 10, "sha256": "0" * 64, "part": part}}
        Path(layout.checkpoint(step) + ".pruned.json").write_text(json.dumps({"files": files}))
    Path(layout.eval_shard(0)).parent.mkdir()
    for step in evaluated:
        Path(layout.eval_shard(step)).write_bytes(b"")
    return layout


NOW = {"evaluate": "evaluate-2", "rollout": "rollout-2"}


def test_a_resume_with_other_rollout_code_is_refused_once_a_checkpoints_weights_were_pruned(tmp_path: Path) -> None:
    layout = _pruned_run(tmp_path, {"evaluate": "evaluate-2", "rollout": "rollout-1"}, pruned={1: "weights", 2: "weights"})
    with pytest.raises(RunFolderError, match=r"code of the rollout stage changed.*pruned the weights of 2 of them "
                                             r"\(.*checkpoints/step-0001 \.\.\. step-0002\).*bootstrap\.source="):
        check_run_folder(layout, OLD, NOW)
    check_run_folder(layout, OLD, {**NOW, "rollout": "rollout-1"})  # the code that wrote it resumes
    check_run_folder(layout, OLD)  # no versions given: the config check alone


def test_the_resume_check_reads_a_run_in_an_object_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import uuid

    from storage import run_store
    from storage.run_layout import RunLayout

    monkeypatch.setenv(run_store.MIRROR_ENV, str(tmp_path / "mirror"))
    layout = RunLayout(f"memory://dapo-test/run-{uuid.uuid4().hex[:8]}")
    run_store.write_text(run_store.join(layout.curate_dir, "curate_report.json"), "{}")
    run_store.write_text(layout.run_record, json.dumps({"config": OLD, "stage_versions": {**NOW, "rollout": "rollout-1"}}))
    check_run_folder(layout, OLD, NOW)  # nothing pruned yet
    files = {"step-0003/model.safetensors": {"bytes": 10, "sha256": "0" * 64, "part": "weights"}}
    run_store.write_text(layout.checkpoint(3) + ".pruned.json", json.dumps({"files": files}))
    with pytest.raises(RunFolderError, match=r"rollout stage changed.*memory://.*/checkpoints/step-0003\)"):
        check_run_folder(layout, OLD, NOW)


def test_other_code_resumes_while_every_checkpoint_keeps_its_weights(tmp_path: Path) -> None:
    # Only optimizer state pruned: rollouts and evaluations can run again (and do, with the new code).
    check_run_folder(_pruned_run(tmp_path, {"evaluate": "evaluate-1", "rollout": "rollout-1"},
                                 pruned={1: "optimizer state"}), OLD, NOW)


def test_a_record_without_versions_checks_no_code(tmp_path: Path) -> None:
    # Written before versions were recorded: the stage itself fails on the pruned checkpoint, with advice.
    check_run_folder(_pruned_run(tmp_path, None, pruned={1: "weights"}), OLD, NOW)


def test_other_evaluation_code_is_refused_only_for_an_evaluated_checkpoint_without_weights(tmp_path: Path) -> None:
    old = {"evaluate": "evaluate-1", "rollout": "rollout-2"}
    check_run_folder(_pruned_run(tmp_path / "a", old, pruned={1: "weights"}, evaluated=(0, 2)), OLD, NOW)
    with pytest.raises(RunFolderError, match=r"code of the evaluate stage changed.*weights of 1 of them .*step-0002\)"):
        check_run_folder(_pruned_run(tmp_path / "b", old, pruned={1: "weights", 2: "weights"}, evaluated=(0, 2)), OLD, NOW)


def test_the_run_record_holds_the_versions_a_resume_is_checked_against(tmp_path: Path) -> None:
    from storage.run_layout import RunLayout
    from tasks.evaluate import evaluate
    from tasks.rollout import rollout
    from workflows.config import load_config
    from workflows.driver import start_run_folder

    layout = RunLayout(tmp_path / "r")
    start_run_folder(load_config(REPO / "configs" / "tiny-cpu.yaml"), layout)
    record = json.loads(Path(layout.run_record).read_text())
    assert record["run_dir"] == str(layout.root)
    recorded = record["stage_versions"]
    assert recorded == {"evaluate": evaluate.cache.version_override, "rollout": rollout.cache.version_override}
