"""A stage command's stdout holds its result alone (cli/result_stdout.py)."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli.result_stdout import result_stdout

REPO = Path(__file__).resolve().parents[2]

# A command as the `dapo` process runs it: stdout is descriptor 1, and a library configured its log
# handler on sys.stdout before the command began (vLLM's default stream).
_COMMAND = """
import logging, os, subprocess, sys
from cli.result_stdout import result_stdout
logger = logging.getLogger("library")
logger.addHandler(logging.StreamHandler(sys.stdout))
with result_stdout():
    logger.warning("a library's warning")
    os.write(1, b"from C code\\n")
    subprocess.run([sys.executable, "-c", "print('from a worker')"], check=True)
    print('{"result": 1}')
os.write(1, b"after the block\\n")
"""


def test_what_libraries_and_children_write_to_stdout_goes_to_stderr() -> None:
    proc = subprocess.run([sys.executable, "-c", _COMMAND], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=60, check=True)
    assert proc.stdout == '{"result": 1}\nafter the block\n'
    for line in ("a library's warning", "from C code", "from a worker"):
        assert line in proc.stderr


def test_a_result_printed_into_a_buffer_stays_there(capfd: pytest.CaptureFixture[str]) -> None:
    # In-process callers (tests) capture the result with redirect_stdout; it must still land there.
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), result_stdout():
        print("the result")
        os.write(1, b"noise\n")
    out, err = capfd.readouterr()
    assert printed.getvalue() == "the result\n" and out == "" and "noise" in err
