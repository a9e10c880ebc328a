"""Every command that takes a run (`dapo verify|report|audit|lineage RUN`, `dapo engines release --run
RUN`) finds it the same way (storage/run_lookup.py): a path, a URI or a name under --run-root give
the folder as the driver named it (its absolute path, or its URI), and a run that is not there is
the same one line, exit 2, for every command.

The folder each command resolved is read from a spy on storage.run_lookup.run_folder; what a command
does after that (a report with no summary.json, a lineage step with no batch) does not matter here.
The object store is fsspec's in-memory one.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from cli.main import main
from storage import run_lookup, run_store

COMMANDS = {
    "verify": ["verify", "{run}"],
    "report": ["report", "{run}"],
    "audit": ["audit", "{run}", "--views"],
    "lineage": ["lineage", "{run}", "--step", "1"],
    "engines": ["engines", "release", "--run", "{run}", "--ray-address", "ray://nowhere:10001"],
}


@pytest.fixture
def runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """One run ``tiny`` under ``<tmp>/runs`` and one in the store under ``memory://.../runs``; the
    working directory is ``<tmp>``; releasing engines records the namespace instead of asking Ray."""
    from engines.rollout import ray_engines

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(run_store.MIRROR_ENV, str(tmp_path / "mirror"))
    (tmp_path / "runs" / "tiny").mkdir(parents=True)
    (tmp_path / "runs" / "tiny" / "run.json").write_text("{}")
    store = f"memory://dapo-test/lookup-{uuid.uuid4().hex[:8]}/runs"
    run_store.upload_file(tmp_path / "runs" / "tiny" / "run.json", f"{store}/tiny/run.json")
    monkeypatch.setattr(ray_engines, "release", lambda hosting: [])
    return {"local": str(tmp_path / "runs" / "tiny"), "store": store}


def _forms(runs: dict[str, str]) -> dict[str, tuple[list[str], str]]:
    """Ways to name each run: ``{form: (the RUN argument and any --run-root, the folder meant)}``."""
    local, store = runs["local"], runs["store"]
    return {
        "relative path": (["runs/tiny"], local),
        "absolute path": ([local], local),
        "trailing slash": ([local + "/"], local),
        "file URI": ([f"file://{local}"], local),
        "name under the default --run-root": (["tiny"], local),
        "name under an absolute --run-root": (["tiny", "--run-root", str(Path(local).parent)], local),
        "URI": ([f"{store}/tiny"], f"{store}/tiny"),
        "URI with a trailing slash": ([f"{store}/tiny/"], f"{store}/tiny"),
        "name under a URI --run-root": (["tiny", "--run-root", store], f"{store}/tiny"),
    }


def _argv(command: str, named: list[str]) -> list[str]:
    return [a.format(run=named[0]) for a in COMMANDS[command]] + named[1:]


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_finds_a_run_the_same_way(command: str, runs: dict[str, str], monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    found: list[str] = []
    real = run_lookup.run_folder

    def spy(run: str, run_root: str) -> str:
        found.append(real(run, run_root))
        return found[-1]

    monkeypatch.setattr(run_lookup, "run_folder", spy)
    for form, (named, meant) in _forms(runs).items():
        found.clear()
        main(_argv(command, named))
        err = capsys.readouterr().err
        assert found == [meant], (form, err)
        assert "not a run folder" not in err, (form, err)


def test_engines_of_a_run_named_by_a_relative_path_are_the_drivers(runs: dict[str, str],
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    # The driver names its namespace after the absolute run folder (workflows/local_run.py: run_layout);
    # `dapo engines release --run runs/tiny` (the example in cli/engines.py) must name the same one.
    from engines.rollout import ray_engines

    assert main(_argv("engines", ["runs/tiny"])) == 0
    assert ray_engines.run_namespace(runs["local"]) in capsys.readouterr().out


@pytest.mark.parametrize("missing", ["nowhere", "runs/nowhere", "memory://dapo-test/no-such-bucket/runs/nowhere"])
def test_a_missing_run_is_the_same_one_line_and_exit_2_for_every_command(
        missing: str, runs: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    lines = {}
    for command in COMMANDS:
        assert main(_argv(command, [missing])) == 2, command
        out, err = capsys.readouterr()
        assert out == "" and len(err.strip().splitlines()) == 1, (command, err)
        prefix = f"dapo {command}: error: "
        assert err.startswith(prefix), (command, err)
        lines[command] = err.strip().removeprefix(prefix)
    assert len(set(lines.values())) == 1, lines
    assert lines["verify"].startswith(f"{missing!r}: not a run folder"), lines["verify"]
    assert not Path(runs["local"]).parent.joinpath("nowhere").exists()  # nothing left behind
