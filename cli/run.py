"""`dapo run`: the whole pipeline from a config, locally (workflows/local_run.py) or on a cluster
(``--remote``: cli/launch.py); its arguments, the memory plan it prints with ``--plan``, and the
one-screen summary at the end.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import Any, NoReturn

from workflows import local_run
from workflows.config import SHIPPED_CONFIGS, RunConfig, load_config
from workflows.exit_codes import BAD_INPUT
from workflows.run_binding import RunFolderError, check_can_hold
from workflows.run_output import log_file, run_output

DEFAULT_RUN_ROOT = "runs"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=str(SHIPPED_CONFIGS / "tiny-cpu.yaml"),
                        help="run config YAML (default: the main job's, configs/tiny-cpu.yaml of this checkout)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                        help="override one config field, e.g. --set run.steps=2 (repeatable)")
    parser.add_argument("--run-root", default=DEFAULT_RUN_ROOT,
                        help="folder or object-store URI (s3://bucket/runs) holding run folders (default: %(default)s)")
    add_verbose_argument(parser)
    parser.add_argument("--plan", action="store_true",
                        help="print the memory plan of the GPU the vLLM engine and training share, run nothing")
    parser.add_argument("--gpu-memory-gb", type=float, default=0.0,
                        help="with --plan: memory of that GPU in GB (default: this machine's CUDA GPU)")
    from cli import launch

    launch.add_arguments(parser)  # --remote: the same config and overrides, run on a Flyte cluster


def add_verbose_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--verbose", action="store_true",
                        help="print everything (vLLM, DeepSpeed, Flyte logs, warnings) on the terminal instead of "
                             "logs/dapo.log in the run folder, and progress as plain lines")


def format_summary(summary: dict[str, Any]) -> str:
    """The one-screen summary printed at the end of ``dapo run``."""
    before, after = summary["accuracy_before"], summary["accuracy_after"]
    change = summary.get("accuracy_change_ci95")
    lines = [
        "",
        f"DAPO run {Path(summary['run_dir']).name}  ({summary['config']}, digest {summary['config_digest']})",
        f"  held-out avg@{summary['eval_k']} on {summary['eval_problems']} problems (95% intervals): "
        f"{before:.1%}{_interval_text(summary.get('accuracy_before_ci95'))} -> "
        f"{after:.1%}{_interval_text(summary.get('accuracy_after_ci95'))}",
        f"  change: {(after - before) * 100:+.1f} points"
        + (f" (paired over problems: {change[0] * 100:+.1f} to {change[1] * 100:+.1f})" if change else ""),
    ]
    if "accuracy_best" in summary and summary["accuracy_best_step"] != summary["steps_done"]:
        lines.append(f"  best evaluation: {summary['accuracy_best']:.1%} at step {summary['accuracy_best_step']}")
    lines += [
        f"  pass@{summary['eval_k']}: {summary['pass_at_k_before']:.1%} -> {summary['pass_at_k_after']:.1%}",
        f"  steps: {summary['steps']}   wall time: {summary['wall_seconds']:.1f} s"
        + (f"   (step mean {sum(summary['step_seconds']) / len(summary['step_seconds']):.1f} s)" if summary["step_seconds"] else ""),
        f"  final checkpoint: {summary['final_checkpoint']}",
        f"  run folder: {summary['run_dir']}  (summary.json, report/index.html, logs/dapo.log)",
        f"  lineage: dapo lineage {summary['run_dir']} --step {summary['steps']} | head -12",
    ]
    return "\n".join(lines)


def _interval_text(interval: list[float] | None) -> str:
    """`` [26.1%, 31.9%]`` for a [low, high] fraction interval; empty when there is none."""
    return "" if not interval else f" [{interval[0]:.1%}, {interval[1]:.1%}]"


def print_plan(config: RunConfig, gpu_memory_gb: float) -> int:
    """``dapo run --plan``: the shared GPU's plan on stdout, exit 0; nothing runs or is written."""
    from infra.sizing import GB, format_shared_plan

    memory = int(gpu_memory_gb * GB) or local_run.local_cuda()[1]
    if not memory:
        print("dapo run: --plan: no CUDA GPU here; give its memory with --gpu-memory-gb", file=sys.stderr)
        return BAD_INPUT
    plan = local_run.shared_gpu_plan(config, memory)
    print(format_shared_plan(plan) if plan else
          f"{config.bootstrap.source}: a tiny policy, no GPU memory plan needed (it fits any GPU, or the CPU)")
    return 0


def exit_interrupted(command: str, err: local_run.RunInterrupted) -> NoReturn:
    """Print the interrupt's one line and exit at once: 130 after Ctrl-C, 143 after SIGTERM (what a
    shell reports for either).

    Skips interpreter shutdown: task threads and library atexit hooks would print pages of
    tracebacks about the workers just killed. Outputs are published atomically.
    """
    print(f"\ndapo {command}: {'stopped by SIGTERM: ' if err.terminated else ''}{err}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(128 + (signal.SIGTERM if err.terminated else signal.SIGINT))


def run_cli(args: argparse.Namespace) -> int:
    from infra.sizing import PlanDoesNotFit

    config = load_config(args.config, args.set)
    if getattr(args, "remote", False):  # a Namespace built by hand (tests) has no cluster options
        from cli import launch

        return launch.run_cli(config, args)
    try:
        if args.plan:
            return print_plan(config, args.gpu_memory_gb)
        local_run.check_input_paths(config)
        local_run.check_local_gpu_plan(config)
    except PlanDoesNotFit as err:
        print(f"dapo run: {err}", file=sys.stderr)
        return BAD_INPUT
    layout = local_run.run_layout(config, args.run_root)
    try:
        check_can_hold(layout.root)
        with run_output(log_file(layout), command="run", verbose=args.verbose), local_run.stop_on_sigterm():
            summary = local_run.run_pipeline(config, args.run_root)
    except RunFolderError as err:
        print(f"dapo run: {err}", file=sys.stderr)
        return BAD_INPUT
    except local_run.RunInterrupted as err:
        exit_interrupted("run", err)
    print(format_summary(summary))
    return 0

