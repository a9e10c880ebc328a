"""What may live in cli/ and in workflows/ (docs/ARCHITECTURE.md): the command's faces parse
arguments and print; the pipeline runs and parses nothing. test_layers.py checks which way the
imports run; this checks what the two top rooms hold.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _modules(root: Path, package: str) -> list[tuple[str, ast.Module]]:
    return [(path.relative_to(root).as_posix(), ast.parse(path.read_text(), str(path)))
            for path in sorted((root / package).rglob("*.py"))]


def argument_parsers(root: Path) -> list[str]:
    """Every module of workflows/ that imports argparse (a `dapo` face belongs in cli/)."""
    found = []
    for name, tree in _modules(root, "workflows"):
        for node in ast.walk(tree):
            imported = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                        else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(module.split(".")[0] == "argparse" for module in imported):
                found.append(f"{name}:{node.lineno}")
    return found


def flyte_tasks(root: Path) -> list[str]:
    """Every function of cli/ decorated as a Flyte task (``@env.task``, ``@env.task(...)``): pipeline
    logic, which belongs in workflows/ (a driver task) or tasks/."""
    found = []
    for name, tree in _modules(root, "cli"):
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for decorator in node.decorator_list:
                target = decorator.func if isinstance(decorator, ast.Call) else decorator
                if isinstance(target, ast.Attribute) and target.attr == "task":
                    found.append(f"{name}:{node.lineno}: {node.name}")
    return found


def test_no_workflows_module_parses_arguments() -> None:
    assert argument_parsers(REPO) == []


def test_no_cli_module_defines_a_flyte_task() -> None:
    assert flyte_tasks(REPO) == []


def test_the_checks_find_what_they_look_for(tmp_path: Path) -> None:
    for package in ("cli", "workflows"):
        (tmp_path / package).mkdir()
    (tmp_path / "workflows" / "launcher.py").write_text("def f():\n    import argparse\n")
    (tmp_path / "workflows" / "fine.py").write_text("import sys\nprint(sys.argv)\n")
    (tmp_path / "cli" / "ladder.py").write_text(
        "from infra.environments import cpu_env\n\n@cpu_env.task(report=True)\nasync def ladder() -> str:\n    return ''\n")
    (tmp_path / "cli" / "plain.py").write_text("import functools\n\n@functools.cache\ndef f() -> int:\n    return 1\n")
    assert argument_parsers(tmp_path) == ["workflows/launcher.py:2"]
    assert flyte_tasks(tmp_path) == ["cli/ladder.py:4: ladder"]
