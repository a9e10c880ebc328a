"""Every recipe of docs/LINEAGE.md runs, as written, against a small finished run (tests/lineage_run.py),
and answers its question: the doc cannot drift from the views or the commands.

A recipe is a ``### question`` heading of the "## Recipes" section and the ``dapo`` commands of its
```bash block. The doc's run folder (``runs/tiny-cpu``), ``PROBLEM_ID`` and checkpoint number
(``DOC_CHECKPOINT``) are replaced by the test run's; each command must exit 0 with an answer (an
audit query: at least one row), and the questions below must get the answer worked out by hand from
the test run's groups."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from pathlib import Path

import pytest

from cli.main import main
from tests import lineage_run
from tests.unit.test_readme_examples import bash_commands

DOC = Path(__file__).resolve().parents[2] / "docs" / "LINEAGE.md"
DOC_RUN = "runs/tiny-cpu"
DOC_CHECKPOINT = "75"  # the main job's final step, named in the doc's checkpoint recipes
TEST_CHECKPOINT = "2"  # the test run's step whose batch carries a group from step 1
PROBLEM = lineage_run.problem_id("A")


def recipes() -> dict[str, list[list[str]]]:
    """question -> the argv (after `dapo`) of each command of its recipe."""
    section = DOC.read_text().split("\n## Recipes\n", 1)[1].split("\n## ", 1)[0]
    found = {}
    for block in section.split("\n### ")[1:]:
        question, _, body = block.partition("\n")
        found[question.strip()] = [shlex.split(command)[1:] for _, command in bash_commands(body)]
    return found


def for_test_run(argv: list[str], run: Path) -> list[str]:
    """``argv`` with the doc's run folder, problem and checkpoint number replaced by the test run's."""
    argv = [str(run) if a == DOC_RUN else a.replace("PROBLEM_ID", PROBLEM) for a in argv]
    return [re.sub(rf"\b{DOC_CHECKPOINT}\b", TEST_CHECKPOINT, a) for a in argv]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(lineage_run.build(tmp_path_factory.mktemp("recipes") / "run").root)


def _dapo(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 0, f"dapo {shlex.join(argv)}: exit {code}: {err}"
    assert out.strip(), f"dapo {shlex.join(argv)}: no answer"
    return out


def _rows(capsys: pytest.CaptureFixture[str], argv: list[str]) -> list[dict]:
    return json.loads(_dapo(capsys, [*argv, "--json"]))["rows"]


# question -> a check of its first command's answer (audit recipes: the rows of its --json answer)
ANSWERS: dict[str, Callable[[list[dict] | str], None]] = {}


def answer(question: str):
    def register(check: Callable) -> Callable:
        ANSWERS[question] = check
        return check
    return register


@answer("Which problems did the final policy train on most?")
def _most_trained(rows: list[dict]) -> None:
    # A and B were trained at steps 1 and 3 (8 samples each), D and E once (4 each); 3 of 4 correct in each group
    assert [r["samples"] for r in rows] == [8, 8, 4, 4]  # most first (ties in problem_id order)
    assert {(r["problem"], r["samples"], r["steps"], r["accuracy"]) for r in rows} == {
        ("A?", 8, 2, 0.75), ("B?", 8, 2, 0.75), ("D?", 4, 1, 0.75), ("E?", 4, 1, 0.75)}


@answer("Every +1 sample of problem X")
def _plus_one(rows: list[dict]) -> None:
    # A: indices 0-2 at step 1 and step 3 (3 of 4 correct), all 4 of step 2's round 1 (all correct)
    assert [(r["step"], r["round"], r["sample_index"]) for r in rows] == \
        [(1, 0, 0), (1, 0, 1), (1, 0, 2), (2, 1, 0), (2, 1, 1), (2, 1, 2), (2, 1, 3), (3, 0, 0), (3, 0, 1), (3, 0, 2)]
    assert {r["reward"] for r in rows} == {1.0}


@answer("Every sample of problem X, and whether it was trained on")
def _problem(text: str) -> None:
    assert "samples  12 in 3 steps, 8 trained on" in text


@answer(f"Which scored shards did checkpoint {DOC_CHECKPOINT}'s batch come from?")
def _checkpoint(text: str) -> None:
    assert "4 of 8 samples carried from steps/step-0001/scored/round-00.parquet" in text


@answer("Which steps trained on half or more samples carried from an earlier step?")
def _carried(rows: list[dict]) -> None:
    assert rows == [{"step": 2, "carried": 4, "samples": 8}]


@answer("What became of the samples no step trained on?")
def _untrained(rows: list[dict]) -> None:
    assert {r["filter_reason"]: r["samples"] for r in rows} == {"all_correct": 8, "all_wrong": 4}  # C, A (step 2); F


@answer("How did held-out accuracy move from checkpoint to checkpoint?")
def _eval(rows: list[dict]) -> None:
    assert [(r["step"], r["avg_at_k"], r["problems"]) for r in rows] == [(0, 0.0, 2), (3, 0.75, 2)]


@answer("What views and columns are there?")
def _views(text: str) -> None:
    assert all(f"{view}: " in text for view in ("samples", "batches", "problems", "checkpoints", "steps", "eval"))


def test_the_doc_has_the_recipes_users_asked_for() -> None:
    found = recipes()
    assert len(found) >= 5
    assert "Which problems did the final policy train on most?" in found and "Every +1 sample of problem X" in found
    assert set(found) == set(ANSWERS), "a recipe without a check here, or a check without a recipe"
    assert all(found.values()), "a recipe without a command"


@pytest.mark.parametrize("question", sorted(recipes()))
def test_every_recipe_runs_and_answers_its_question(question: str, run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    commands = [for_test_run(argv, run) for argv in recipes()[question]]
    for argv in commands:
        out = _dapo(capsys, argv)
        if "--sql" in argv and "--json" not in argv:
            rows = re.fullmatch(r"\((\d+) rows?\)", out.splitlines()[-1])
            assert rows and int(rows.group(1)) > 0, f"{question}: no rows\n{out}"
    first = commands[0]
    ANSWERS[question](_rows(capsys, first) if "--sql" in first else _dapo(capsys, first))
