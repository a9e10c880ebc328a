"""Every command of docs/CLUSTER.md's "From the command line: launch, find one step's stage, re-run it"
section: each ``dapo`` command parses with the real ``dapo`` parser, the ``dapo run --remote`` line is run
against the recorded backend of test_launch.py (and sends the run folder the section's ``dapo lineage``
line then reads), and each ``flyte`` command's options exist in the installed Flyte CLI.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.test_launch import FakeBackend, backend, decoded, flyte_config_file  # noqa: F401 (fixture)
from cli import main as cli
from workflows.config import load_config

REPO = Path(__file__).resolve().parents[2]
HEADING = "## From the command line: launch, find one step's stage, re-run it"
FLYTE = Path(sys.executable).parent / "flyte"


def section_commands() -> list[list[str]]:
    """The section's commands (lines of its ```bash blocks), split as a shell would."""
    text = (REPO / "docs" / "CLUSTER.md").read_text()
    section = text[text.index(HEADING):]
    section = section[:section.index("\n## ", len(HEADING))]
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    return [shlex.split(line) for block in blocks for line in block.splitlines() if line.strip()]


def test_the_section_has_the_commands_this_file_checks() -> None:
    heads = [" ".join(command[:3]) for command in section_commands()]
    assert heads == ["dapo deploy --flyte-config", "dapo run --remote", "flyte get action",
                     "dapo lineage /runs/qwen2.5-32b-dapo", "flyte rerun RUN_NAME"]


@pytest.mark.parametrize("command", [c for c in section_commands() if c[0] == "dapo"], ids=lambda c: " ".join(c[:2]))
def test_each_dapo_command_parses(command: list[str]) -> None:
    argv = command[1:]
    args = cli.build_parser(argv).parse_args(argv)  # an unknown option or a bad value exits here
    assert args.command == argv[0]


def test_the_remote_run_line_starts_the_run_the_lineage_line_reads(
        backend: FakeBackend, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    commands = section_commands()
    (run,) = [c for c in commands if c[:3] == ["dapo", "run", "--remote"]]
    (lineage,) = [c for c in commands if c[:2] == ["dapo", "lineage"]]
    argv = [flyte_config_file(tmp_path) if arg == "~/.flyte/config.yaml" else arg for arg in run[1:]]
    assert cli.main(argv) == 0, capsys.readouterr().err
    (sent,) = backend.submitted
    config_path = argv[argv.index("--config") + 1]
    sets = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--set"]
    inputs = decoded(sent["proto_inputs"])
    assert inputs["run_config"] == load_config(config_path, sets)
    assert inputs["run_dir"] == lineage[2]


@pytest.mark.parametrize("command", [c for c in section_commands() if c[0] == "flyte"], ids=lambda c: " ".join(c[:2]))
def test_each_flyte_command_and_option_exists(command: list[str]) -> None:
    words = [w for w in command[1:] if not w.startswith("-") and not w.isupper()]  # subcommands, not RUN_NAME
    env = {**os.environ, "DO_NOT_TRACK": "1", "COLUMNS": "200"}
    result = subprocess.run([str(FLYTE), *words, "--help"], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    for option in (w for w in command if w.startswith("--")):
        assert option in result.stdout, f"flyte {' '.join(words)}: no {option}"
