"""The README's `dapo ask` example, run as written on the main job's run folder, is answered right
(issue 48: an earlier example, a three-term chain outside the task, got 0/4).

tests/unit/test_readme_examples.py checks cheaply that the example asks the run a problem of its
task; this runs it (about 30 s: one vLLM engine on the final checkpoint). It needs the finished
main job (`make run` writes runs/tiny-cpu) and is skipped without it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.test_readme_examples import README, dapo_examples

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def test_the_readme_ask_example_is_answered_right_by_the_main_job() -> None:
    [example] = [e for e in dapo_examples(README) if e.argv[0] == "ask"]
    summary = REPO / example.argv[1] / "summary.json"
    if not summary.is_file() or json.loads(summary.read_text()).get("status") != "finished":
        pytest.skip(f"{summary.parent} holds no finished main job (make run makes it)")
    result = subprocess.run([sys.executable, "-m", "cli.main", *example.argv], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO), "DO_NOT_TRACK": "1"},
                            capture_output=True, text=True, timeout=900, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    tally = re.fullmatch(r"(\d+)/(\d+) correct against gold \S+", result.stdout.splitlines()[-1])
    assert tally, result.stdout
    right, samples = int(tally[1]), int(tally[2])
    assert right * 2 > samples, f"{example.where}: {right}/{samples} correct\n{result.stdout}"
