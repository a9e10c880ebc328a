"""Every stage command's stdout is one JSON document (docs/COMMANDS.md, "Output"), so `| jq` works;
its human text goes to stderr (issue 48: `dapo curate` printed counts as text on stdout).

`dapo curate` runs for real in a subprocess (seconds). The other stages start vLLM or DeepSpeed
(minutes together; their own integration tests parse their stdout as JSON), so for all of them a
cheap check reads each command's ``run_cli``: what it prints to stdout is one document, made by
``json_output.dumps`` or a JSON manifest's text, printed once.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

from cli.main import RESULT_ON_STDOUT

REPO = Path(__file__).resolve().parents[2]
# The stage commands (README's table: one per pipeline stage); their module under cli/.
STAGE_MODULES = {"curate": "curate", "bootstrap": "bootstrap", "rollout": "rollout", "score": "score",
                 "train": "train", "eval": "evaluate"}


def test_curate_prints_its_report_as_one_json_document_and_its_counts_on_stderr(tmp_path: Path) -> None:
    out = tmp_path / "curated"
    result = subprocess.run(
        [sys.executable, "-m", "cli.main", "curate", "synthetic:n=40,seed=5", "--template", "tiny",
         "--test-fraction", "0.25", "--out", str(out)],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), "DO_NOT_TRACK": "1"}, capture_output=True, text=True,
        timeout=600, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)  # the whole of stdout: one document
    assert report["input_rows"] == 40 and report["kept"] + report["rejected"] == 40
    assert sum(report["kept_by_split"].values()) == report["kept"] and set(report["kept_by_split"]) == {"train", "test"}
    assert report["problem_shards"] and all((out / shard).is_file() for shard in report["problem_shards"])  # under --out
    assert "input rows: 40" in result.stderr and "kept   train" in result.stderr  # the human summary


def _stdout_prints(function: ast.FunctionDef) -> list[ast.Call]:
    """The ``print(...)`` calls in ``function`` that write to stdout (no ``file=`` argument)."""
    return [node for node in ast.walk(function)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print"
            and not any(k.arg == "file" for k in node.keywords)]


def _is_json_document(call: ast.Call) -> bool:
    """``print(json_output.dumps(...))`` or ``print(<a manifest path>.read_text())`` (a JSON manifest)."""
    [arg] = call.args
    return isinstance(arg, ast.Call) and isinstance(arg.func, ast.Attribute) and (
        (arg.func.attr == "dumps" and ast.unparse(arg.func.value) == "json_output")
        or (arg.func.attr == "read_text" and "manifest" in ast.unparse(arg.func.value)))


def test_every_stage_command_prints_one_json_document_to_stdout() -> None:
    assert set(STAGE_MODULES) <= RESULT_ON_STDOUT  # libraries' and children's output goes to stderr
    for command, module in STAGE_MODULES.items():
        tree = ast.parse((REPO / "cli" / f"{module}.py").read_text())
        [run_cli] = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run_cli"]
        prints = _stdout_prints(run_cli)
        assert len(prints) == 1 and _is_json_document(prints[0]), (
            f"dapo {command}: stdout gets {[ast.unparse(p) for p in prints]}; expected one JSON document")
