"""The `dapo` command: one subcommand per stage and one for the whole pipeline.

Each subcommand lives in the module that owns the stage; that module exposes
``add_arguments(parser)`` and ``run_cli(args) -> int``. Modules are imported only when their
subcommand runs, so ``dapo --help`` stays fast and does not import vLLM or DeepSpeed.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
import traceback
from collections.abc import Sequence

from workflows.exit_codes import BAD_INPUT, FAILED, INTERRUPTED, OK, TERMINATED

# subcommand -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "run": ("cli.run", "run the whole pipeline from a config (curate -> steps -> evaluate)"),
    "curate": ("cli.curate", "turn raw problem files into Problem / RejectedProblem shards"),
    "bootstrap": ("cli.bootstrap", "build the tiny offline policy, or register a local HF model folder"),
    "rollout": ("cli.rollout", "generate G responses per prompt with vLLM into Rollout shards"),
    "score": ("cli.score", "reward, overlong handling, advantages and dynamic sampling -> ScoredRollout"),
    "train": ("cli.train", "one DeepSpeed DAPO step from a checkpoint and ScoredRollout shards"),
    "eval": ("cli.evaluate", "avg@k / pass@k / maj@k of a checkpoint on a problem set"),
    "serve": ("cli.serve", "an OpenAI-compatible HTTP endpoint (vLLM) on a checkpoint or a run's final one"),
    "ask": ("cli.ask", "sample answers to one problem from a checkpoint, with the reward's verdict"),
    "ablate": ("cli.ablate", "the paper's ablation ladder (naive GRPO ... DAPO) over several seeds"),
    "lineage": ("cli.lineage", "trace a training sample or checkpoint back to its origins"),
    "audit": ("cli.audit", "SQL over a run folder's shards (DuckDB views: samples, batches, checkpoints, ...)"),
    "verify": ("cli.verify", "check every output of a run folder against its recorded digests"),
    "report": ("cli.report", "draw a run folder's page (report/index.html) again from its records"),
    "deploy": ("cli.deploy", "serialise every Flyte environment and task for a cluster (--dry-run)"),
    "engines": ("cli.engines", "remove the long-lived Ray engine actors a run left (rollout.EngineHosting)"),
}


def _module_for(name: str):
    module_name, _ = SUBCOMMANDS[name]
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name == module_name:
            return None
        raise


def build_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dapo", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    wanted = next((a for a in argv if not a.startswith("-")), None)
    for name, (_, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        # Only the chosen subcommand's module is imported (keeps `dapo --help` light).
        if name == wanted:
            module = _module_for(name)
            if module is not None:
                module.add_arguments(p)
    return parser


# Subcommands whose stdout is their result (a manifest, metrics as JSON, answers, a report, serve's
# ready line): what libraries and child processes print goes to stderr instead (cli/result_stdout.py).
RESULT_ON_STDOUT = frozenset({"curate", "bootstrap", "rollout", "score", "train", "eval", "ask", "serve"})

# Errors that mean "fix your config or input", raised before any long work; their messages name
# the field, file or row. Names, because a Flyte task's failure arrives as flyte's own error type.
USER_ERRORS = frozenset({"PoolTooSmallError", "PromptTooLongError", "PromptTextError", "CurationError", "RunFolderError", "HeldOutSeenError",
                         "BootstrapError", "PrunedWeightsError"})


# Commands that start rollout engines, which read where the engines live from the environment
# (settings/rollout.py: EngineHosting, DAPO_ENGINES_*): a bad value is refused before any work.
ENGINE_COMMANDS = frozenset({"run", "ablate", "rollout", "eval", "ask"})


def engine_hosting_error(command: str) -> str | None:
    """The one line refusing a bad ``DAPO_ENGINES_*`` value for ``command`` (one that starts engines);
    None when the variables are usable or the command starts none. Read here, once, so the refusal
    comes before the run folder, the inputs or a Flyte task (which would wrap it in a traceback)."""
    if command not in ENGINE_COMMANDS:
        return None
    import os

    from settings.checks import FieldError
    from settings.rollout import EngineHosting

    try:
        EngineHosting.from_environ(os.environ)
    except FieldError as err:
        return f"dapo {command}: environment: {err}"
    return None


def disk_full_line(err: BaseException) -> str | None:
    """The "no space left on device ..." line inside ``err`` or its causes; None if it is not one."""
    from schemas.disk_space import MARKER, error_chain

    for link in error_chain(err):
        for line in str(link).splitlines():
            at = line.lower().find(MARKER)
            if at >= 0:
                return line[at:].strip()
    return None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return _run_command(argv)
    except KeyboardInterrupt as stop:
        # By name, as USER_ERRORS: workflows.local_run (which defines it) imports Flyte.
        return ctrl_c_exit_code(argv, terminated=type(stop).__name__ == "Terminated")


def ctrl_c_exit_code(argv: Sequence[str], *, terminated: bool = False) -> int:
    """A Ctrl-C (or a SIGTERM that `dapo run` turned into one: ``terminated``) that no subcommand
    turned into its own line (e.g. one while the subcommand's modules import, before it began): one
    line on stderr instead of a page of import-machinery traceback, and 130 (143 for SIGTERM), the
    code a shell reports. The interpreter then exits normally, so any worker a subcommand started is
    stopped by its atexit hook."""
    command = next((a for a in argv if a in SUBCOMMANDS), None)
    print(f"\ndapo{f' {command}' if command else ''}: {'stopped (SIGTERM)' if terminated else 'interrupted (Ctrl-C)'}",
          file=sys.stderr)
    return TERMINATED if terminated else INTERRUPTED


def _config_errors() -> tuple[type[Exception], ...]:
    """workflows.config's ConfigError, once a command imported that module (only such a command can
    raise it). Not imported here: it imports torch (~2 s), which `dapo audit` and `dapo lineage` never need."""
    config = sys.modules.get("workflows.config")
    return (config.ConfigError,) if config is not None else ()


def _run_command(argv: list[str]) -> int:
    """Parse ``argv`` and run its subcommand; returns the exit code (user errors: one line, 2)."""
    args = build_parser(argv).parse_args(argv)
    module = _module_for(args.command)
    if module is None:
        print(f"dapo {args.command}: this stage is not built yet ({SUBCOMMANDS[args.command][0]})", file=sys.stderr)
        return BAD_INPUT
    refusal = engine_hosting_error(args.command)
    if refusal is not None:
        print(refusal, file=sys.stderr)
        return BAD_INPUT
    from settings.checks import FieldError

    from cli.result_stdout import result_stdout

    try:
        with result_stdout() if args.command in RESULT_ON_STDOUT else contextlib.nullcontext():
            return int(module.run_cli(args) or OK)
    except (*_config_errors(), FieldError) as err:  # FieldError: a stage setting given as a command-line option
        # A config mistake is the user's, not the code's: one line naming the file or --set
        # and the field, no traceback, exit code 2 (as argparse does for bad arguments).
        print(f"dapo {args.command}: config error: {err}", file=sys.stderr)
        return BAD_INPUT
    except BrokenPipeError:
        # Output piped into `head` and the like: stop quietly, as Unix tools do.
        sys.stderr.close()
        return OK
    except Exception as err:
        if type(err).__name__ in USER_ERRORS or getattr(err, "code", None) in USER_ERRORS:
            # The user's input or config (raised directly, or inside a Flyte task, which re-raises
            # it as its own error type with the class name as `code`): one line, exit 2.
            print(f"dapo {args.command}: {str(err).strip().splitlines()[-1]}", file=sys.stderr)
            return BAD_INPUT
        # A full disk reaches here wrapped by Flyte, DeepSpeed or a worker's error file; say it
        # in one line with the path (schemas/disk_space.py words it), not as a page of traceback.
        line = disk_full_line(err)
        if line is not None:
            print(f"dapo {args.command}: {line}", file=sys.stderr)
            return FAILED
        # Any other failure: its whole traceback on stderr, with its notes (`dapo run` adds the
        # failing Flyte task's own traceback and the run's log file: workflows/run_output.py).
        # Printed here, not by sys.excepthook: Flyte's replacement drops the notes and prints to stdout.
        traceback.print_exception(err, file=sys.stderr)
        return FAILED


if __name__ == "__main__":
    raise SystemExit(main())
