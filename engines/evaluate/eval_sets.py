"""Evaluation sets: our Problem shards, or raw files such as DAPO's AIME 2024 repeated 32 times.

DAPO publishes its evaluation set in verl's layout with every AIME problem copied 32 times, so
that one sample per row gives avg@32. Counting those rows as problems would report 960 problems
where there are 30, and weight each problem by how often it was copied. Here copies of a problem
(same normalised text, hence same ``problem_id``) collapse into one problem that remembers how
many copies it had; the evaluation then draws k samples of it, and k defaults to that count
(``EvalConfig.samples_per_problem = 0``).

Raw files go through the curation code (engines/curate/stage.py: integer-answer conversion, the same
``problem_id``), so an evaluation problem and a curated training problem with the same text have
the same id. A raw row whose answer cannot be converted cannot be scored: it is dropped and
counted, with its reason, in ``EvalSet.rejected`` (raw evaluation rows are never rewritten).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq

import schemas
from dapo_core.answers import DAPO_PROMPT_TEMPLATE, problem_id
from engines.curate.stage import curate_records
from readers.problem_files import read_input
from settings.curate import CurateConfig


@dataclass(frozen=True)
class EvalProblem:
    """One distinct evaluation problem."""

    problem_id: str
    prompt: str  # what the policy sees (the prompt template already applied)
    answer: int  # gold integer answer
    copies: int = 1  # rows of the input that held this problem (32 for DAPO's AIME x32 file)


@dataclass(frozen=True)
class EvalSet:
    """The distinct problems of one or more inputs, in first-seen order."""

    problems: list[EvalProblem]
    input_rows: int  # rows read, copies and rejected rows included
    rejected: dict[str, int] = field(default_factory=dict)  # reason code -> rows that cannot be scored


def _is_problem_shard(path: Path) -> bool:
    if path.suffix != ".parquet":
        return False
    names = set(pq.read_schema(path).names)
    return set(schemas.arrow_schema(schemas.Problem).names) <= names


@dataclass
class _Collected:
    """Distinct problems in first-seen order while the inputs are read, with their copies and the
    rows that cannot be scored."""

    order: list[str] = field(default_factory=list)
    prompts: dict[str, str] = field(default_factory=dict)
    answers: dict[str, int] = field(default_factory=dict)
    copies: dict[str, int] = field(default_factory=dict)
    rejected: dict[str, int] = field(default_factory=dict)
    input_rows: int = 0

    def add(self, pid: str, prompt: str, answer: int, where: str, count: int = 1) -> None:
        """Count ``count`` copies of problem ``pid``; its first prompt and answer stand."""
        if pid in self.answers and self.answers[pid] != answer:
            raise ValueError(
                f"{where}: problem {pid} has gold answer {answer} here and {self.answers[pid]} in an earlier row"
            )
        if pid not in self.prompts:
            self.order.append(pid)
            self.prompts[pid], self.answers[pid] = prompt, answer
        self.copies[pid] = self.copies.get(pid, 0) + count

    def reject(self, code: str, rows: int = 1) -> None:
        """Count ``rows`` input rows that cannot be scored, by reason code."""
        self.rejected[code] = self.rejected.get(code, 0) + rows


def _read_folder(found: _Collected, path: Path, prompt_template: str) -> None:
    """Every shard of a folder, as one nested evaluation set."""
    try:
        nested = [str(p) for p in schemas.shard_paths(path)]
    except FileNotFoundError as err:
        raise ValueError(str(err)) from None
    sub = load_eval_set(nested, prompt_template=prompt_template)
    for p in sub.problems:
        found.add(p.problem_id, p.prompt, p.answer, str(path), count=p.copies)
    found.input_rows += sub.input_rows
    for code, n in sub.rejected.items():
        found.reject(code, n)


def _read_problem_shard(found: _Collected, path: Path) -> None:
    """A Problem shard: its rows carry their own prompt and integer answer."""
    table = schemas.read_shard(path, schemas.Problem)
    found.input_rows += table.num_rows
    for pid, prompt, answer in zip(*(table.column(c).to_pylist() for c in ("problem_id", "prompt", "answer"))):
        found.add(pid, prompt, answer, str(path))


def _read_raw_file(found: _Collected, path: Path, prompt_template: str) -> None:
    """A raw problem file, converted by the curation code (no answer rewriting)."""
    sources = read_input(f"{path}@test")
    found.input_rows += sum(len(s.records) for s in sources)
    # No answer rewriting: an evaluation set is scored on its problems as published (a rewritten
    # MATH-500 would not compare with reported numbers); curate it with rewriting to train on it.
    config = CurateConfig(prompt_template=prompt_template, dedup=True, rewrite_answers=False)
    kept, dropped = curate_records(sources, config)
    for row in kept:
        found.add(row["problem_id"], row["prompt"], row["answer"], f"{path} row {row['source_row']}")
    for row in dropped:
        if row["reason_code"] == "duplicate":
            # A copy of a kept problem: one more sample slot of it, not another problem.
            found.copies[problem_id(row["problem"])] += 1
        else:
            found.reject(row["reason_code"])


def load_eval_set(paths: list[str], *, prompt_template: str = DAPO_PROMPT_TEMPLATE) -> EvalSet:
    """Read Problem shards and/or raw problem files into distinct problems.

    ``prompt_template`` renders raw rows (``{problem}`` marks the problem; Problem shards carry
    their own prompt). Raises ValueError naming the file when nothing can be evaluated.
    """
    found = _Collected()
    for raw_path in paths:
        path = Path(raw_path)
        if path.is_dir():
            _read_folder(found, path, prompt_template)
        elif not path.is_file():
            raise ValueError(f"{path}: no such evaluation file")
        elif _is_problem_shard(path):
            _read_problem_shard(found, path)
        else:
            _read_raw_file(found, path, prompt_template)
    if not found.order:
        raise ValueError(f"{paths}: no problem with an integer answer to evaluate (rejected: {found.rejected})")
    problems = [EvalProblem(pid, found.prompts[pid], found.answers[pid], found.copies[pid]) for pid in found.order]
    return EvalSet(problems=problems, input_rows=found.input_rows, rejected=found.rejected)
