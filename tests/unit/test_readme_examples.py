"""Every command the README and docs/ give still works as written (issue 47), checked cheaply.

What is checked, in seconds (nothing is run): the README opens with the two commands and `.ci/run`
calls the test one; the README's command table lists every `dapo` subcommand with options it has;
every `dapo ...` line of a fenced ```bash block in README.md or docs/*.md parses with the real
`dapo` parser, its config files exist and load with its `--set` overrides, its run folders are
ones a shipped config (or another example) makes, a checkpoint it names keeps its weights under that
config's retention, and a problem it asks a run folder is one that run was trained on.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from readers.problem_files import parse_input_spec
from readers.synthetic import parse_terms
from cli.main import SUBCOMMANDS, build_parser
from workflows.config import ConfigError, RunConfig, load_config

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
DEFAULT_CONFIG = REPO / "configs" / "tiny-cpu.yaml"
RUN_ROOT = "runs"  # cli/run.py: DEFAULT_RUN_ROOT


@dataclass(frozen=True)
class Example:
    """One `dapo` command line of a document's ```bash block."""

    where: str  # file:line
    argv: tuple[str, ...]  # after `dapo`


def bash_commands(text: str) -> list[tuple[int, str]]:
    """(line number, command) of every line in the ```bash blocks of ``text``; comments and pipes cut off,
    backslash continuations joined."""
    commands, inside, pending = [], False, ""
    for number, line in enumerate(text.splitlines(), start=1):
        if line.startswith("```"):
            inside = line.strip() == "```bash" and not inside
            continue
        if not inside:
            continue
        pending += line.rstrip("\\").strip() + " "
        if line.endswith("\\"):
            continue
        command = shlex.split(pending, comments=True)
        pending = ""
        if command:
            commands.append((number, shlex.join(command[:command.index("|")] if "|" in command else command)))
    return commands


def dapo_examples(path: Path, text: str | None = None) -> list[Example]:
    text = path.read_text() if text is None else text
    found = []
    for number, command in bash_commands(text):
        argv = shlex.split(command)
        if argv and Path(argv[0]).name == "dapo":
            found.append(Example(f"{path.name}:{number}", tuple(argv[1:])))
    return found


def parse(argv: tuple[str, ...]) -> tuple[object | None, str]:
    """(parsed arguments, None) or (None, argparse's complaint)."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            return build_parser(list(argv)).parse_args(list(argv)), ""
    except SystemExit:
        return None, stderr.getvalue().strip().splitlines()[-1] if stderr.getvalue().strip() else "no subcommand"


def shipped_runs() -> dict[str, RunConfig]:
    """run.name -> config of every shipped config (the run folders `dapo run --config` makes)."""
    return {config.run.name: config for config in map(load_config, sorted((REPO / "configs").glob("*.yaml")))}


def trained_on(problem: str, config: RunConfig) -> bool:
    """Whether ``problem`` is one the synthetic problems of ``config``'s `run.data` can be."""
    try:
        terms = parse_terms(problem)
    except ValueError:
        return False
    for spec in map(parse_input_spec, config.run.data):
        if spec.kind != "synthetic":
            return True  # a real data set: any text may be in it
        low, high = int(spec.options.get("min_terms", 2)), int(spec.options.get("max_terms", 5))
        biggest = int(spec.options.get("max_operand", 50))
        if low <= len(terms) <= high and terms[0] > 0 and all(1 <= abs(term) <= biggest for term in terms):
            return True
    return False


def keeps_weights(step: int, config: RunConfig) -> bool:
    """Whether step ``step``'s checkpoint keeps its weights under ``config``'s retention (docs/RETENTION.md)."""
    every = config.run.keep_weights_every_steps
    return step in (0, config.run.steps) or every == 0 or step % every == 0


def example_problems(examples: list[Example]) -> list[str]:
    """What is wrong with each example: it does not parse, names a missing config, a field `--set` cannot
    set, a run folder no config makes, a checkpoint pruned by its retention, or a problem outside its task."""
    runs = shipped_runs()
    for example in examples:  # run folders other examples make with --set run.name=...
        for override in example.argv:
            if override.startswith("run.name="):
                runs[override.partition("=")[2]] = load_config(DEFAULT_CONFIG)
    problems = []
    for example in examples:
        args, complaint = parse(example.argv)
        if args is None:
            problems.append(f"{example.where}: dapo {shlex.join(example.argv)}: {complaint}")
            continue
        problems += [f"{example.where}: {problem}" for problem in argument_problems(args, runs)]
    return problems


def argument_problems(args: object, runs: dict[str, RunConfig]) -> list[str]:
    config_path = getattr(args, "config", None)
    sets = [value for value in (getattr(args, "set", None) or []) if "." in value.partition("=")[0]]
    problems = []
    if config_path or sets:
        try:
            load_config(config_path or DEFAULT_CONFIG, sets)
        except ConfigError as err:
            problems.append(str(err))
    for value in vars(args).values():
        for path in value if isinstance(value, list) else [value]:
            if isinstance(path, str) and path.startswith(f"{RUN_ROOT}/"):
                problems += run_path_problems(path, runs, problem=getattr(args, "problem", None))
    return problems


def run_path_problems(path: str, runs: dict[str, RunConfig], problem: str | None) -> list[str]:
    name = path.split("/")[1]
    if name not in runs:
        return [f"{path}: no shipped config or example makes a run folder {name!r} (known: {sorted(runs)})"]
    config = runs[name]
    step = re.search(r"/checkpoints/step-(\d+)$", path)
    if step and not keeps_weights(int(step.group(1)), config):
        return [f"{path}: run {name!r} keeps no weights at step {int(step.group(1))} (its retention: "
                f"run.keep_weights_every_steps={config.run.keep_weights_every_steps})"]
    if problem is not None and not trained_on(problem, config):
        return [f"{problem!r}: not a problem run {name!r} trains on (run.data: {list(config.run.data)})"]
    return []


def test_the_readme_opens_with_the_two_commands_and_ci_runs_the_test_one() -> None:
    first_block = [command for _, command in bash_commands(README.read_text())[:2]]
    assert first_block == ["make run", "make test"]
    assert "\nmake test\n" in (REPO / ".ci" / "run").read_text()
    dry = subprocess.run(["make", "-n", "run", "test"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert ".venv/bin/dapo run" in dry and ".venv/bin/python -m pytest" in dry


def test_the_command_table_lists_every_subcommand_with_options_it_has() -> None:
    rows = re.findall(r"^\| `dapo (\w+)([^`]*)` \|", README.read_text(), flags=re.MULTILINE)
    assert [name for name, _ in rows] == list(SUBCOMMANDS)
    for name, synopsis in rows:
        parser = build_parser([name])
        options = set(parser._subparsers._group_actions[0].choices[name]._option_string_actions)  # noqa: SLF001
        unknown = set(re.findall(r"--[\w-]+", synopsis)) - options
        assert not unknown, f"README table: dapo {name} has no option {sorted(unknown)}"


@pytest.mark.parametrize("document", [README, *DOCS], ids=lambda path: path.name)
def test_every_dapo_example_works_as_written(document: Path) -> None:
    assert example_problems(dapo_examples(document)) == []


def test_the_readme_has_examples_and_its_links_exist() -> None:
    assert len(dapo_examples(README)) >= 4
    for document in (README, *DOCS):
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", document.read_text()):
            assert (document.parent / target).exists(), f"{document.name}: link to missing {target}"


def test_the_check_catches_an_example_that_no_longer_matches() -> None:
    text = "\n".join([
        "```bash",
        'dapo ask runs/tiny-cpu "37+5-18" --gold 24 --samples 4   # three terms: the main job trains on two',
        "dapo run --steps 10                                     # no such option",
        "dapo run --config configs/missing.yaml",
        "dapo run --set train.no_such_field=1",
        "dapo serve runs/tiny-cpu/checkpoints/step-0010          # pruned by the main job's retention",
        "dapo lineage runs/elsewhere --step 1",
        'dapo ask runs/tiny-cpu "23-8" --gold 15                 # fine',
        "```",
    ])
    problems = example_problems(dapo_examples(Path("EXAMPLE.md"), text))
    assert [problem.split(":")[1] for problem in problems] == ["2", "3", "4", "5", "6", "7"], problems
    assert "'37+5-18': not a problem run 'tiny-cpu' trains on" in problems[0]
    assert "unrecognized arguments: --steps 10" in problems[1]
    assert "configs/missing.yaml: config file not found" in problems[2]
    assert "no_such_field" in problems[3]
    assert "keeps no weights at step 10" in problems[4]
    assert "'elsewhere'" in problems[5]
