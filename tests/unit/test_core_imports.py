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
