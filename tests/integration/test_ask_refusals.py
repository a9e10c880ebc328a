"""`dapo ask` refuses a problem whose text the policy's tokenizer cannot represent (issue 48: "What is
17 + 25?" lost its letters and "?" and was answered "2"), in one line naming the characters, with
exit code 2 and nothing on stdout, before any engine starts. A real subprocess on a tiny checkpoint."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from engines.bootstrap import tiny_policy

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_policy.build_random_checkpoint(tmp_path_factory.mktemp("ask") / "ckpt", seed=0)


def test_ask_refuses_text_the_tokenizer_cannot_represent(checkpoint: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "cli.main", "ask", str(checkpoint), "What is 17 + 25?", "--gold", "42"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), "DO_NOT_TRACK": "1"}, capture_output=True, text=True,
        timeout=600, check=False)
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stdout == ""  # no header of a sampling that does not happen
    [line] = [line for line in result.stderr.splitlines() if line.startswith("dapo ask:")]
    assert "unrepresentable_text" in line and "'?Wahit'" in line, line  # the characters the tokenizer lacks
    assert "vLLM" not in result.stderr and "INFO" not in result.stderr  # refused before any engine started
