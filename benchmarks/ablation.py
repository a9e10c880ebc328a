"""Run the paper's ablation ladder on the tiny task and commit its outputs under benchmarks/.

    .venv/bin/python benchmarks/ablation.py [--config FILE] [--seeds 0 1 2] [--rungs ...] [--set k=v ...]
                                            [--run-root DIR] [--tag NAME]

Runs `dapo ablate` (workflows/ablation.py: naive GRPO -> + overlong filtering -> + clip-higher ->
+ soft overlong punishment -> + token-level loss -> + dynamic sampling) and copies the ladder's
table and curves to benchmarks/ablation.json, benchmarks/ablation.md and
benchmarks/ablation_curves.png (``ablation-<tag>.*`` with ``--tag``, for variants), with the
command that made them. Prints the table.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/ablation-addsub.yaml")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rungs", type=int, nargs="+", help="only these rungs (indices 0-5; default: all)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    parser.add_argument("--tag", default="", help="name variant outputs ablation-<tag>.json etc.")
    parser.add_argument("--report-only", action="store_true", help="rebuild the outputs from finished runs (runs nothing)")
    parser.add_argument("--run-root", default="runs", help="where the ladder folder goes (default: %(default)s)")
    parser.add_argument("--out", default=str(REPO / "benchmarks"), help="where the outputs are copied")
    args = parser.parse_args()

    command = [str(REPO / ".venv" / "bin" / "dapo"), "ablate", "--config", args.config, "--run-root", args.run_root,
               "--seeds", *map(str, args.seeds)]
    if args.rungs:
        command += ["--rungs", *map(str, args.rungs)]
    if args.report_only:
        command.append("--report-only")
    for item in args.set:
        command += ["--set", item]
    started = time.perf_counter()
    proc = subprocess.run(command, cwd=REPO)
    if proc.returncode != 0:
        return proc.returncode
    seconds = time.perf_counter() - started

    sys.path.insert(0, str(REPO))
    from workflows.config import load_config

    name = load_config(REPO / args.config, args.set).run.name
    ladder = (REPO / args.run_root / f"{name}-ladder").resolve()
    out = Path(args.out)
    table = json.loads((ladder / "ablation.json").read_text())
    stem = f"ablation-{args.tag}" if args.tag else "ablation"
    shutil.copyfile(ladder / "ablation.json", out / f"{stem}.json")
    shutil.copyfile(ladder / "curves.png", out / f"{stem}_curves.png")
    shown = ["benchmarks/ablation.py", "--config", args.config, "--seeds", *map(str, args.seeds)]
    if args.rungs:
        shown += ["--rungs", *map(str, args.rungs)]
    for item in args.set:
        shown += ["--set", item]
    if args.tag:
        shown += ["--tag", args.tag]
    if args.report_only:
        shown.append("--report-only")
    text = (ladder / "ablation.md").read_text()
    (out / f"{stem}.md").write_text(
        f"{text}\n{'Rebuilt from the finished runs' if args.report_only else 'Made'} by "
        f"`.venv/bin/python {shlex.join(shown)}`" + ("" if args.report_only else f" in {seconds / 60:.1f} min")
        + f" (ladder folder {ladder}). Curves: {stem}_curves.png.\n"
    )
    print(f"wrote {out / stem}.json, .md, _curves.png ({len(table)} rungs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
