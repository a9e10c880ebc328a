"""A bad ``DAPO_ENGINES_*`` value (settings/rollout.py: EngineHosting) is the user's: every command that
starts engines refuses it in one line naming the variable, exit 2, before any work (``dapo run`` said 1
with a traceback from inside its Flyte task, after making the run folder)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.main import main
from settings.rollout import ENGINES_NAMESPACE_ENV, ENGINES_RAY_ADDRESS_ENV
from workflows.exit_codes import BAD_INPUT

REPO = Path(__file__).resolve().parents[2]
POLICY = REPO / "assets" / "policies" / "tiny-addsub30"

COMMANDS = {
    "run": ["run", "--run-root", "{root}", "--set", "run.steps=1"],
    "ablate": ["ablate", "--run-root", "{root}", "--seeds", "1"],
    "rollout": ["rollout", str(POLICY), "{root}/problems", "--out", "{root}/r.parquet"],
    "eval": ["eval", str(POLICY), "{root}/problems", "--out", "{root}/e.parquet"],
    "ask": ["ask", str(POLICY), "1+2"],
    # Its warm group lives in the train host with the address set (engines/train/ray_host.py).
    "train": ["train", str(POLICY), "{root}/scored.parquet", "--out", "{root}/ckpt", "--step", "1"],
}
BAD = {ENGINES_RAY_ADDRESS_ENV: "head", ENGINES_NAMESPACE_ENV: "two words"}


@pytest.mark.parametrize("variable", sorted(BAD))
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_bad_engines_variable_exits_2_naming_it_before_any_work(
    command: str, variable: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(ENGINES_RAY_ADDRESS_ENV, "auto")  # a good address, so the namespace alone can be bad
    monkeypatch.setenv(variable, BAD[variable])
    root = tmp_path / "root"
    argv = [arg.format(root=root) for arg in COMMANDS[command]]

    code = main(argv)

    err = capsys.readouterr().err.strip()
    assert code == BAD_INPUT, err[-2000:]
    assert len(err.splitlines()) == 1 and err.startswith(f"dapo {command}: ") and f"{variable}={BAD[variable]!r}" in err
    assert not root.exists()  # nothing made: no run folder, no ladder, no output
