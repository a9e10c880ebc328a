"""Named SQL views (DuckDB) over one run folder's shards: lineage as queries.

`dapo audit` and `dapo lineage` ask their questions in SQL against these views. Each view reads the
Parquet shards (and checkpoint records) where the stages wrote them (storage/run_layout.py), at
query time: nothing is copied or indexed, and a query reads only the columns it names. The files a
view covers are listed when the run is opened; temp files and staging folders have hidden names and
are never matched. The bytes are not verified here (`dapo verify` does that), and the pandera
models are not imported unless a kind of shard is absent (an empty view still has its columns).

Paths in the views (``shard``, ``source_shard``, ``folder``) are relative to the run folder, so a
query's answer is the same in a copy of the run. docs/LINEAGE.md has recipes.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from pathlib import Path

import duckdb


@dataclass(frozen=True)
class ShardKind:
    """One kind of Parquet shard in a run folder: where its files are (a glob relative to the run
    folder, matching what storage/run_layout.py names) and the schemas model they hold."""

    pattern: str
    model: str  # a model of schemas/models.py; only read when no file of this kind exists
    # The model has columns added since runs were first written (schemas/models.py: ADDED_COLUMNS): an
    # older shard lacks them, so files are matched by column name (nulls where missing), at the cost
    # of reading every file's schema when a view is made. Others take the first file's schema.
    columns_vary: bool = False


SCORED = ShardKind("steps/step-*/scored/round-*.parquet", "ScoredRollout")
BATCH = ShardKind("steps/step-*/batch.parquet", "ScoredRollout")
SURPLUS = ShardKind("steps/step-*/surplus.parquet", "ScoredRollout")
METRICS = ShardKind("steps/step-*/metrics.parquet", "StepMetrics", columns_vary=True)
EVAL = ShardKind("eval/step-*.parquet", "EvalResult")
PROBLEMS = ShardKind("curate/problems/*.parquet", "Problem")
REJECTED = ShardKind("curate/rejected/*.parquet", "RejectedProblem")
CHECKPOINT_RECORDS = "checkpoints/step-*/dapo_checkpoint.json"  # written last: a complete checkpoint
PRUNED_RECORDS = "checkpoints/step-*.pruned.json"  # storage/pruning.py: what retention deleted
SHARD_KINDS: dict[str, ShardKind] = {"scored": SCORED, "batch": BATCH, "surplus": SURPLUS, "metrics": METRICS,
                                     "eval": EVAL, "problems": PROBLEMS, "rejected": REJECTED}

# The step a file under steps/step-NNNN/ belongs to, from its path relative to the run folder.
_STEP_OF_PATH = r"CAST(regexp_extract({path}, '^steps/step-(\d+)/', 1) AS INTEGER)"


@dataclass(frozen=True)
class View:
    """A named view: what one row is, and its SELECT over the shard kinds (``{scored}``, ...)."""

    name: str
    row: str
    sql: str


VIEWS: tuple[View, ...] = (
    View("samples", "one scored sample (every round of every step): step, round, problem, reward, and its shard",
         f"""SELECT {_STEP_OF_PATH.format(path='shard_path(filename)')} AS step, generation_round AS round,
                    problem_id, rollout_id, sample_index, reward, correct,
                    * EXCLUDE (filename, generation_round, problem_id, rollout_id, sample_index, reward, correct),
                    shard_path(filename) AS shard
             FROM {{scored}}"""),
    View("batches", "one sample a step trained on, carried ones included: the training step, the step, round and "
                    "scored shard that generated it (source_*), and whether it was carried in as surplus",
         f"""SELECT b.step, s.step AS source_step, s.round AS source_round, b.problem_id, b.rollout_id, b.reward,
                    b.correct, b.advantage, b.loss_masked, b.checkpoint_id, b.policy_version,
                    s.step < b.step AS carried, s.shard AS source_shard, b.batch_shard
             FROM (SELECT {_STEP_OF_PATH.format(path='shard_path(filename)')} AS step, *,
                          shard_path(filename) AS batch_shard FROM {{batch}}) b
             LEFT JOIN samples s USING (rollout_id)"""),
    View("surplus", "one sample of an informative group step `step` did not need, carried into step + 1 (dynamic sampling)",
         f"""SELECT {_STEP_OF_PATH.format(path='shard_path(filename)')} AS step, problem_id, rollout_id, reward,
                    * EXCLUDE (filename, problem_id, rollout_id, reward), shard_path(filename) AS shard
             FROM {{surplus}}"""),
    View("problems", "one curated problem (train and test splits) and its shard",
         "SELECT * EXCLUDE (filename), shard_path(filename) AS shard FROM {problems}"),
    View("rejected", "one source row curation did not keep, and why",
         "SELECT * EXCLUDE (filename), shard_path(filename) AS shard FROM {rejected}"),
    View("steps", "one training step's StepMetrics row (loss, accuracy, trained and carried groups, times, ...)",
         "SELECT * EXCLUDE (filename), shard_path(filename) AS shard FROM {metrics}"),
    View("checkpoints", "one published checkpoint: id, step, parent, the stage that made it, its folder, whether "
                        "retention pruned it, and the StepMetrics of the step that produced it (null for step 0)",
         """SELECT c.step, c.checkpoint_id, c.parent_checkpoint_id, c.produced_by,
                   regexp_replace(shard_path(c.filename), '/dapo_checkpoint\\.json$', '') AS folder,
                   folder IN (SELECT regexp_replace(shard_path(file), '\\.pruned\\.json$', '') FROM {pruned}) AS pruned,
                   m.* EXCLUDE (step, checkpoint_id, parent_checkpoint_id, shard)
            FROM {checkpoints} c LEFT JOIN steps m ON m.step = c.step AND m.checkpoint_id = c.checkpoint_id"""),
    View("eval", "one held-out evaluation row: eval set, problem, checkpoint, step, k, num_correct, avg@k, ...",
         "SELECT * EXCLUDE (filename), shard_path(filename) AS shard FROM {eval}"),
)


@dataclass(frozen=True)
class Column:
    name: str
    type: str


@dataclass(frozen=True)
class ViewColumns:
    """A view as `dapo audit --views` lists it."""

    name: str
    row: str
    columns: tuple[Column, ...]


@dataclass(frozen=True)
class BatchSource:
    """Samples of one step's batch that one scored shard holds."""

    shard: str | None  # the scored shard that generated them (relative); None: no scored shard holds them
    samples: int
    carried: bool  # generated by an earlier step and carried in as surplus (dynamic sampling, sec. 3.2)


@dataclass(frozen=True)
class StepBatch:
    """What one training step trained on: its batch shard and every scored shard the samples came from."""

    step: int
    shard: str
    samples: int
    problems: int
    sources: tuple[BatchSource, ...]  # its own rounds first, then the carried ones

    @property
    def carried_samples(self) -> int:
        return sum(s.samples for s in self.sources if s.carried)


@dataclass(frozen=True)
class CheckpointRow:
    """One published checkpoint and a few of its step's metrics (None for the step-0 policy)."""

    step: int
    checkpoint_id: str
    parent_checkpoint_id: str | None
    produced_by: str
    folder: str
    loss: float | None
    entropy: float | None
    accuracy: float | None
    reward_mean: float | None


@dataclass(frozen=True)
class ProblemRow:
    problem_id: str
    problem: str
    answer: int
    split: str
    shard: str


@dataclass(frozen=True)
class ProblemSample:
    """One generated sample of a problem and what became of it."""

    step: int  # the step that generated it
    round: int
    sample_index: int
    reward: float
    correct: bool
    filter_reason: str  # the group's dynamic-sampling decision in its scored shard
    trained_step: int | None  # the step that trained on it; None: never trained on
    rollout_id: str
    shard: str


@dataclass(frozen=True)
class StepSample:
    """One sample a training step trained on: what it is and where it came from."""

    rollout_id: str
    problem_id: str
    source_step: int | None  # the step whose rollout generated it (None: no scored shard of the run holds it)
    source_round: int | None  # its generation round in that step
    carried: bool | None  # generated by an earlier step, carried in as surplus (dynamic sampling, sec. 3.2)
    reward: float
    advantage: float
    correct: bool
    generated_by: str  # the checkpoint_id of the policy that generated it
    policy_version: int
    source_shard: str | None  # the scored shard that holds it (relative to the run folder)


def step_batches(con: duckdb.DuckDBPyConnection) -> dict[int, StepBatch]:
    """Every training step's batch, by step."""
    sources: dict[int, list[BatchSource]] = {}
    for step, shard, samples, carried in con.execute(
            """SELECT step, source_shard, count(*), bool_or(carried) FROM batches GROUP BY ALL
               ORDER BY step, bool_or(carried), source_shard""").fetchall():
        sources.setdefault(step, []).append(BatchSource(shard, samples, bool(carried)))
    rows = con.execute("""SELECT step, any_value(batch_shard), count(*), count(DISTINCT problem_id) FROM batches
                          GROUP BY step ORDER BY step""").fetchall()
    return {step: StepBatch(step, shard, samples, problems, tuple(sources[step])) for step, shard, samples, problems in rows}


def checkpoint_rows(con: duckdb.DuckDBPyConnection) -> tuple[CheckpointRow, ...]:
    """Every published checkpoint, by step."""
    rows = con.execute("""SELECT step, checkpoint_id, parent_checkpoint_id, produced_by, folder, loss, entropy,
                                 accuracy, reward_mean FROM checkpoints ORDER BY step""").fetchall()
    return tuple(CheckpointRow(*row) for row in rows)


def step_samples(con: duckdb.DuckDBPyConnection, step: int) -> tuple[StepSample, ...]:
    """Every sample step ``step`` trained on, in batch order (source step, round, problem, sample)."""
    rows = con.execute("""SELECT b.rollout_id, b.problem_id, b.source_step, b.source_round, b.carried, b.reward,
                                 b.advantage, b.correct, b.checkpoint_id, b.policy_version, b.source_shard
                          FROM batches b LEFT JOIN samples s USING (rollout_id) WHERE b.step = $1
                          ORDER BY b.source_step, b.source_round, b.problem_id, s.sample_index, b.rollout_id""",
                       [step]).fetchall()
    return tuple(StepSample(*row) for row in rows)


def find_problem(con: duckdb.DuckDBPyConnection, problem_id: str) -> ProblemRow | None:
    row = con.execute("SELECT problem_id, problem, answer, split, shard FROM problems WHERE problem_id = $1",
                      [problem_id]).fetchone()
    return ProblemRow(*row) if row else None


def problem_samples(con: duckdb.DuckDBPyConnection, problem_id: str) -> tuple[ProblemSample, ...]:
    """Every sample generated for ``problem_id``, in step, round and sample order."""
    rows = con.execute("""SELECT s.step, s.round, s.sample_index, s.reward, s.correct, s.filter_reason, b.step,
                                 s.rollout_id, s.shard
                          FROM samples s LEFT JOIN batches b USING (rollout_id)
                          WHERE s.problem_id = $1 ORDER BY s.step, s.round, s.sample_index""", [problem_id]).fetchall()
    return tuple(ProblemSample(*row) for row in rows)


def files_of(root: Path, pattern: str) -> list[Path]:
    """The files of ``pattern`` under the run folder ``root``, sorted (hidden names never match)."""
    return sorted(Path(p) for p in glob.glob(os.path.join(glob.escape(str(root)), pattern)))


def open_run(root: str | Path) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with every view of ``VIEWS`` over the run folder ``root``.

    Relative paths in a query (``read_parquet('steps/step-0001/batch.parquet')``) resolve against
    the run folder too."""
    root = Path(root).resolve()
    con = duckdb.connect(":memory:")
    con.execute(f"SET file_search_path = {_literal(str(root))}")
    con.execute(f"CREATE MACRO shard_path(p) AS substr(p, {len(str(root)) + 2})")  # path relative to the run folder
    sources = {name: _parquet_source(con, root, name, kind) for name, kind in SHARD_KINDS.items()}
    sources["checkpoints"] = _checkpoint_source(root)
    sources["pruned"] = f"glob({_literal(os.path.join(glob.escape(str(root)), PRUNED_RECORDS))})"
    for view in VIEWS:
        con.execute(f"CREATE VIEW {view.name} AS {view.sql.format(**sources)}")
    return con


def describe(con: duckdb.DuckDBPyConnection) -> tuple[ViewColumns, ...]:
    """Every view with its columns and types, in ``VIEWS`` order."""
    return tuple(ViewColumns(view.name, view.row, tuple(Column(name, str(kind)) for name, kind, *_ in
                                                         con.execute(f"DESCRIBE {view.name}").fetchall()))
                 for view in VIEWS)


def _parquet_source(con: duckdb.DuckDBPyConnection, root: Path, name: str, kind: ShardKind) -> str:
    files = files_of(root, kind.pattern)
    if files:
        return (f"read_parquet([{', '.join(_literal(str(f)) for f in files)}], filename = true, "
                f"union_by_name = {str(kind.columns_vary).lower()})")
    # No shard of this kind yet (a run still curating, no eval yet): an empty relation of the model's columns.
    import schemas

    con.register(f"empty_{name}", schemas.arrow_schema(getattr(schemas, kind.model)).empty_table())
    return f"(SELECT *, NULL::VARCHAR AS filename FROM empty_{name})"


_CHECKPOINT_COLUMNS = {"checkpoint_id": "VARCHAR", "step": "INTEGER", "parent_checkpoint_id": "VARCHAR",
                       "produced_by": "VARCHAR"}  # storage/checkpoints.py: CheckpointInfo, the fields a view shows


def _checkpoint_source(root: Path) -> str:
    files = files_of(root, CHECKPOINT_RECORDS)
    if not files:
        columns = ", ".join(f"NULL::{kind} AS {name}" for name, kind in _CHECKPOINT_COLUMNS.items())
        return f"(SELECT {columns}, NULL::VARCHAR AS filename WHERE false)"
    columns = ", ".join(f"{_literal(name)}: {_literal(kind)}" for name, kind in _CHECKPOINT_COLUMNS.items())
    return (f"read_json([{', '.join(_literal(str(f)) for f in files)}], columns = {{{columns}}}, "
            f"format = 'auto', filename = true)")


def _literal(text: str) -> str:
    """``text`` as a SQL string literal."""
    return "'" + text.replace("'", "''") + "'"
