"""dapo_core must stay pure: importing all of it pulls in none of the heavy orchestration stacks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_SCRIPT = """
import importlib, pkgutil, sys
import dapo_core
names = [m.name for m in pkgutil.iter_modules(dapo_core.__path__, "dapo_core.")]
assert {"dapo_core.advantages", "dapo_core.losses", "dapo_core.overlong", "dapo_core.sampling",
        "dapo_core.metrics"} <= set(names), names
for name in names:
    importlib.import_module(name)
forbidden = [m for m in ("flyte", "vllm", "deepspeed", "ray", "pyarrow") if m in sys.modules]
print("imported", len(names), "modules; forbidden loaded:", forbidden)
assert not forbidden, forbidden
"""


def test_dapo_core_imports_no_orchestration_stack() -> None:
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"


def test_bare_package_import_is_light() -> None:
    # `import dapo_core` alone must not pull math-verify (rewards) or torch-heavy modules eagerly.
    script = ("import sys, dapo_core; "
              "print(sorted(m for m in sys.modules if m.split('.')[0] in ('dapo_core', 'math_verify')))")
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['dapo_core']"


# Processes, sockets, shared memory and files belong to engines/ and storage/ (docs/ARCHITECTURE.md);
# the verifier's process pool, for one, is engines/score/verifier_pool.py.
_NO_PROCESSES_OR_FILES = ("subprocess", "multiprocessing", "socket", "mmap", "tempfile", "shutil", "os", "pathlib", "io")


def test_dapo_core_starts_no_process_and_touches_no_file() -> None:
    import ast

    found = []
    for path in sorted((REPO / "dapo_core").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            found += [f"{path.name}:{node.lineno} imports {n}" for n in names if n.split(".")[0] in _NO_PROCESSES_OR_FILES]
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "open":
                found.append(f"{path.name}:{node.lineno} calls open()")
    assert not found, found
