"""Lineage: where a training sample or a checkpoint came from, read from a run folder.

For a sample (a ``rollout_id``): its problem and source row, the checkpoint and seed that
generated it, the reward verdict and the reward code's version, the dynamic-sampling decision,
and the step that trained on it (and the checkpoint that step produced). For a checkpoint:
its ancestors back to step 0, and for each training step the batch, the rounds and the
metrics that produced it, with every scored shard its batch came from (carried surplus included).
For a problem: every sample generated for it, with its step, round, reward and the step that
trained on it. Everything is read from the shards the stages wrote; nothing is inferred from names
alone. The problem and checkpoint questions are SQL over the run's views (storage/run_views.py,
the views `dapo audit` queries); ``--checkpoint`` prints a short chain, and with ``--json`` the
full record (``--sample`` always prints its record).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.compute as pc

import schemas
from cli.audit import LineageError, QueryResult, as_table, display_names
from storage import checkpoints, run_lookup, run_views
from storage.run_layout import RunLayout
from workflows import json_output
from workflows.exit_codes import BAD_INPUT

ANCESTORS_SHOWN = 3  # the chain's text lists this many ancestors, then the step-0 policy (--json: all)


def _find_row(paths: list[Path], model: type, column: str, value: str) -> tuple[Path, dict[str, Any]] | None:
    for path in paths:
        table = schemas.read_shard(path, model)
        hits = pc.equal(table.column(column), value)
        if pc.any(hits).as_py():
            return path, table.filter(hits).slice(0, 1).to_pylist()[0]
    return None


def _step_of(path: Path) -> int:
    for part in path.parts:
        if part.startswith("step-"):
            return int(part.removeprefix("step-"))
    raise LineageError(f"{path}: not inside a steps/step-NNNN folder")


def _checkpoint_dirs(layout: RunLayout) -> list[Path]:
    return sorted(p for p in Path(layout.checkpoints_dir).glob("step-*") if checkpoints.is_complete(p))


def checkpoint_by_id(layout: RunLayout, checkpoint_id: str) -> Path:
    """The folder of checkpoint ``checkpoint_id`` (or of ``step-N`` / an int step: ``step-3``,
    ``step-0003`` and ``3`` name the same one) in the run."""
    step_text = checkpoint_id.removeprefix("step-")
    step = int(step_text) if step_text.isdigit() else None
    for folder in _checkpoint_dirs(layout):
        info = checkpoints.read_info(folder)
        if checkpoint_id in (info.checkpoint_id, folder.name) or info.step == step:
            return folder
    known = [checkpoints.read_info(f).checkpoint_id for f in _checkpoint_dirs(layout)]
    raise LineageError(f"{layout.checkpoints_dir}: no checkpoint {checkpoint_id!r}; known: {known}")


def sample_lineage(layout: RunLayout, rollout_id: str) -> dict[str, Any]:
    """Everything recorded about one sample; raises LineageError when it is not in the run."""
    scored_paths = sorted(Path(layout.root).glob("steps/step-*/scored/*.parquet"))
    hit = _find_row(scored_paths, schemas.ScoredRollout, "rollout_id", rollout_id)
    if hit is None:
        raise LineageError(f"{layout.root}: no sample with rollout_id {rollout_id!r} in {len(scored_paths)} scored shards")
    scored_path, row = hit
    problem_hit = _find_row(sorted(Path(layout.problems_dir).glob("*.parquet")), schemas.Problem, "problem_id", row["problem_id"])
    if problem_hit is None:
        raise LineageError(f"{layout.problems_dir}: problem {row['problem_id']} of sample {rollout_id} not found")
    problem_path, problem = problem_hit

    trained_step = None
    surplus_at = []
    for batch in sorted(Path(layout.root).glob("steps/step-*/batch.parquet")):
        if _find_row([batch], schemas.ScoredRollout, "rollout_id", rollout_id):
            trained_step = _step_of(batch)
    for surplus in sorted(Path(layout.root).glob("steps/step-*/surplus.parquet")):
        if _find_row([surplus], schemas.ScoredRollout, "rollout_id", rollout_id):
            surplus_at.append(_step_of(surplus))
    if trained_step is not None:
        decision = f"trained at step {trained_step}" + (f" (carried as surplus from step {surplus_at[0]})" if surplus_at else "")
    elif surplus_at:
        decision = f"surplus at step {surplus_at[-1]}, not yet trained on"
    else:
        decision = f"filtered out: {row['filter_reason']}"
    produced = None
    if trained_step is not None:
        folder = layout.checkpoint(trained_step)
        if checkpoints.is_complete(folder):
            produced = checkpoints.read_info(folder).checkpoint_id
    generated_by = None
    for folder in _checkpoint_dirs(layout):
        if checkpoints.read_info(folder).checkpoint_id == row["checkpoint_id"]:
            generated_by = str(folder)
    return {
        "sample": {
            "rollout_id": rollout_id,
            "sample_index": row["sample_index"],
            "response_text": row["response_text"],
            "response_length": row["response_length"],
            "finish_reason": row["finish_reason"],
        },
        "problem": {
            "problem_id": problem["problem_id"],
            "source": problem["source"],
            "source_row": problem["source_row"],
            "split": problem["split"],
            "problem": problem["problem"],
            "answer": problem["answer"],
            "original_answer": problem["original_answer"],
            "answer_rule": problem["answer_rule"],
            "shard": str(problem_path),
        },
        "generation": {
            "checkpoint_id": row["checkpoint_id"],
            "checkpoint_dir": generated_by,
            "policy_version": row["policy_version"],
            "seed": row["seed"],
            "generation_round": row["generation_round"],
            "step": _step_of(scored_path),
            "rollout_shard": str(scored_path).replace("/scored/", "/rollouts/"),
        },
        "reward": {
            "verdict_status": row["verdict_status"],
            "extracted_answer": row["extracted_answer"],
            "correct": row["correct"],
            "rule_reward": row["rule_reward"],
            "overlong_penalty": row["overlong_penalty"],
            "reward": row["reward"],
            "advantage": row["advantage"],
            "reward_version": row["reward_version"],
            "scored_shard": str(scored_path),
        },
        "filter": {
            "group_decision": row["filter_reason"],
            "loss_masked": row["loss_masked"],
            "final": decision,
        },
        "trained": {"step": trained_step, "produced_checkpoint": produced},
    }


def checkpoint_lineage(layout: RunLayout, checkpoint: str) -> dict[str, Any]:
    """A checkpoint's ancestors and, per training step, the data and metrics that made it."""
    folder = checkpoint_by_id(layout, checkpoint)
    folders = {checkpoints.read_info(f).checkpoint_id: f for f in _checkpoint_dirs(layout)}
    batches = run_views.step_batches(run_views.open_run(layout.root))
    chain = []
    while True:
        info = checkpoints.read_info(folder)
        entry: dict[str, Any] = {
            "checkpoint_id": info.checkpoint_id,
            "folder": str(folder),
            "step": info.step,
            "produced_by": info.produced_by,
            "parent_checkpoint_id": info.parent_checkpoint_id,
        }
        if info.step > 0:
            batch_path = Path(layout.batch_shard(info.step))
            if batch_path.exists():
                batch = schemas.read_shard(batch_path, schemas.ScoredRollout)
                entry["batch"] = {
                    "shard": str(batch_path),
                    "samples": batch.num_rows,
                    "problems": len(set(batch.column("problem_id").to_pylist())),
                    "generated_by": sorted(set(batch.column("checkpoint_id").to_pylist())),
                    "reward_versions": sorted(set(batch.column("reward_version").to_pylist())),
                    "rounds": sorted(str(p) for p in Path(layout.step_dir(info.step)).glob("scored/*.parquet")),
                    # every scored shard the batch came from, carried ones included
                    "sources": [{"shard": str(Path(layout.root, s.shard)) if s.shard else None, "samples": s.samples,
                                 "carried": s.carried}
                                for s in batches[info.step].sources] if info.step in batches else [],
                }
            metrics_path = Path(layout.metrics_shard(info.step))
            if metrics_path.exists():
                entry["metrics"] = schemas.read_shard(metrics_path, schemas.StepMetrics).to_pylist()[0]
        else:
            entry["inputs"] = {k: v for k, v in info.inputs.items() if k != "warmup"}
        chain.append(entry)
        if info.parent_checkpoint_id is None:
            break
        folder = folders.get(info.parent_checkpoint_id) or checkpoint_by_id(layout, info.parent_checkpoint_id)
    return {"checkpoint": chain[0]["checkpoint_id"], "ancestry": chain}


@dataclass(frozen=True)
class StepLineage:
    """What one training step trained on: its batch, every sample in it, and the checkpoints it
    updated and produced."""

    step: int
    parent: run_views.CheckpointRow | None  # the checkpoint the step updated (None: not in this run)
    checkpoint: run_views.CheckpointRow | None  # the checkpoint it produced (None: not published yet)
    batch: run_views.StepBatch
    samples: tuple[run_views.StepSample, ...]


def step_lineage(con: duckdb.DuckDBPyConnection, step: int, where: str) -> StepLineage:
    """Step ``step``'s batch and samples (``where``: its batch shard, named when it has none)."""
    batch = run_views.step_batches(con).get(step)
    if batch is None:
        raise LineageError(f"{where}: step {step} has no batch (not run yet?)")
    rows = run_views.checkpoint_rows(con)
    produced = next((row for row in rows if row.step == step), None)
    parent_id = produced.parent_checkpoint_id if produced else None
    parent = next((row for row in rows if row.checkpoint_id == parent_id), None)
    return StepLineage(step, parent, produced, batch, run_views.step_samples(con, step))


_STEP_COLUMNS = ("rollout_id", "problem_id", "source_step", "source_round", "carried", "reward", "advantage", "correct",
                 "generated_by")


def step_text(lineage: StepLineage) -> str:
    """The checkpoints the step updated and produced, its batch and source shards, a few metrics, then one
    table row per sample: its problem, the step, round and checkpoint that generated it, whether it was
    carried, its reward and advantage."""
    parent, produced = lineage.parent, lineage.checkpoint
    updated = f"{parent.checkpoint_id} (step {parent.step})" if parent else "a checkpoint not in this run"
    into = f"into {produced.checkpoint_id}, {produced.folder}" if produced else "into no published checkpoint yet"
    lines = [f"step        {lineage.step}  trained {updated} {into}", *_batch_lines(lineage.batch)]
    lines += _metrics_lines(produced) if produced else []
    rows = tuple(tuple(getattr(s, c) for c in _STEP_COLUMNS) for s in lineage.samples)
    lines += ["", as_table(QueryResult(_STEP_COLUMNS, rows))]
    return "\n".join(lines)


def trained_samples(layout: RunLayout, step: int) -> list[str]:
    """The rollout ids step ``step`` trained on."""
    path = Path(layout.batch_shard(step))
    if not path.exists():
        raise LineageError(f"{path}: step {step} has no batch (not run yet?)")
    return schemas.read_shard(path, schemas.ScoredRollout).column("rollout_id").to_pylist()


def resolve_run(run: str, run_root: str) -> RunLayout:
    """A run folder given as a path or URI, or as a name under ``run_root`` (storage/run_lookup.py;
    a run in an object store is copied, records only, to a local folder, which the layout names)."""
    return RunLayout(run_lookup.local_run_folder(run, run_root))


def find_checkpoint(rows: tuple[run_views.CheckpointRow, ...], checkpoint: str, where: str) -> run_views.CheckpointRow:
    """The row of ``checkpoint``: its id, ``step-N`` or the step number (as :func:`checkpoint_by_id`)."""
    step_text = checkpoint.removeprefix("step-")
    step = int(step_text) if step_text.isdigit() else None
    for row in rows:
        if checkpoint in (row.checkpoint_id, Path(row.folder).name) or row.step == step:
            return row
    raise LineageError(f"{where}: no checkpoint {checkpoint!r}; known: steps {rows[0].step}..{rows[-1].step}" if rows
                       else f"{where}: no published checkpoint")


def checkpoint_chain_text(con: duckdb.DuckDBPyConnection, checkpoint: str, where: str) -> str:
    """A checkpoint in a few lines: its parent, the shards its batch came from (carried ones
    included), a few metrics, and its ancestry back to the step-0 policy (the first ancestors and
    the root; ``--json`` has them all)."""
    rows = run_views.checkpoint_rows(con)
    by_id = {row.checkpoint_id: row for row in rows}
    chain = [find_checkpoint(rows, checkpoint, where)]
    while chain[-1].parent_checkpoint_id in by_id:
        chain.append(by_id[chain[-1].parent_checkpoint_id])
    batches = run_views.step_batches(con)
    head = chain[0]
    lines = [f"checkpoint  {head.checkpoint_id}  step {head.step}, made by {head.produced_by}, {head.folder}"]
    if head.parent_checkpoint_id is not None:
        parent = by_id.get(head.parent_checkpoint_id)
        lines.append(f"parent      {head.parent_checkpoint_id}" + (f"  step {parent.step}" if parent else "  (not in this run)"))
    batch = batches.get(head.step)
    if batch is not None:
        lines += _batch_lines(batch)
    lines += _metrics_lines(head)
    lines.append(f"ancestry    {len(chain)} checkpoint{'s' if len(chain) > 1 else ''} back to step {chain[-1].step}")
    shown = chain if len(chain) <= ANCESTORS_SHOWN + 2 else [*chain[:ANCESTORS_SHOWN], None, chain[-1]]
    width = len(str(head.step))
    for row in shown:
        if row is None:
            lines.append(f"            ... {len(chain) - ANCESTORS_SHOWN - 1} more (--json lists every one)")
            continue
        batch = batches.get(row.step)
        made = f"{batch.samples} samples, {batch.carried_samples} carried" if batch else f"made by {row.produced_by}"
        lines.append(f"            step {row.step:<{width}}  {row.checkpoint_id}  {made}")
    return "\n".join(lines)


def _batch_lines(batch: run_views.StepBatch) -> list[str]:
    """The batch shard, then every scored shard its samples came from (carried ones included)."""
    return [f"batch       {batch.shard}: {batch.samples} samples of {batch.problems} problems",
            *(f"            {_source_text(source, batch.samples)}" for source in batch.sources)]


def _metrics_lines(row: run_views.CheckpointRow) -> list[str]:
    """A few of the step's metrics, in one line (none for the step-0 policy)."""
    metrics = [f"{name} {value:.4g}" for name, value in
               (("loss", row.loss), ("entropy", row.entropy), ("accuracy", row.accuracy), ("reward_mean", row.reward_mean))
               if value is not None]
    return [f"metrics     {'  '.join(metrics)}"] if metrics else []


def _source_text(source: run_views.BatchSource, total: int) -> str:
    if source.shard is None:
        return f"{source.samples} of {total} samples in no scored shard of this run"
    return f"{source.samples} of {total} samples {'carried from' if source.carried else 'from'} {source.shard}"


@dataclass(frozen=True)
class ProblemLineage:
    """A problem and every sample generated for it."""

    problem: run_views.ProblemRow
    samples: tuple[run_views.ProblemSample, ...]


def problem_lineage(con: duckdb.DuckDBPyConnection, problem_id: str, where: str) -> ProblemLineage:
    """The problem and every sample generated for it (step, round, reward, the step that trained on it)."""
    problem = run_views.find_problem(con, problem_id)
    if problem is None:
        raise LineageError(f"{where}: no problem {problem_id!r} in curate/problems/ (ids are 16 hex characters; "
                           f"`dapo audit RUN --sql \"SELECT problem_id, problem FROM problems\"` lists them)")
    return ProblemLineage(problem, run_views.problem_samples(con, problem_id))


_PROBLEM_COLUMNS = ("step", "round", "sample_index", "reward", "correct", "filter_reason", "trained_step", "rollout_id")


def problem_text(lineage: ProblemLineage) -> str:
    """The problem, a count of its samples and trained ones, then one table row per sample."""
    problem, samples = lineage.problem, lineage.samples
    trained = [s for s in samples if s.trained_step is not None]
    steps = {s.step for s in samples}
    lines = [f"problem  {problem.problem_id}  {problem.problem!r}  answer {problem.answer}, split {problem.split}, "
             f"{problem.shard}",
             f"samples  {len(samples)} in {len(steps)} step{'' if len(steps) == 1 else 's'}, {len(trained)} trained on "
             f"({sum(s.correct for s in trained)} of them correct)"]
    if samples:
        rows = tuple(tuple(getattr(s, c) for c in _PROBLEM_COLUMNS) for s in samples)
        lines += ["", as_table(QueryResult(_PROBLEM_COLUMNS, rows))]
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="run folder (a path or an object-store URI), or a run name under --run-root")
    parser.add_argument("--run-root", default="runs", help="where run names are looked up (default: %(default)s)")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--sample", metavar="ROLLOUT_ID", help="trace one sample (prints its JSON record)")
    what.add_argument("--checkpoint", metavar="ID", help="trace a checkpoint (its id, step-N, or the step number)")
    what.add_argument("--problem", dest="problem_id", metavar="PROBLEM_ID", help="every sample of a problem and whether it was trained on")
    what.add_argument("--step", type=int, metavar="N",
                      help="every sample step N trained on: its problem, where it was generated, its reward")
    parser.add_argument("--json", action="store_true", help="--checkpoint, --problem, --step: the full record as JSON")


def run_cli(args: argparse.Namespace) -> int:
    def show(text: str) -> None:
        print(display_names(text, args.run, args.run_root))

    try:
        layout = resolve_run(args.run, args.run_root)
        if args.sample:
            show(json_output.dumps_readable(sample_lineage(layout, args.sample)))
        elif args.checkpoint is not None and args.json:
            show(json_output.dumps_readable(checkpoint_lineage(layout, args.checkpoint)))
        elif args.checkpoint is not None:
            show(checkpoint_chain_text(run_views.open_run(layout.root), args.checkpoint, layout.checkpoints_dir))
        elif args.problem_id is not None:
            lineage = problem_lineage(run_views.open_run(layout.root), args.problem_id, layout.root)
            show(json_output.dumps_readable(asdict(lineage)) if args.json else problem_text(lineage))
        else:
            step = step_lineage(run_views.open_run(layout.root), args.step, layout.batch_shard(args.step))
            show(json_output.dumps_readable(asdict(step)) if args.json else step_text(step))
    except (LineageError, run_lookup.RunNotFound, duckdb.Error) as err:  # duckdb: a shard the views cannot read
        line = str(err).strip().splitlines()[0]
        print(display_names(f"dapo lineage: error: {line}", args.run, args.run_root), file=sys.stderr)
        return BAD_INPUT
    return 0


__all__ = ["sample_lineage", "checkpoint_lineage", "checkpoint_chain_text", "problem_lineage", "ProblemLineage", "trained_samples",
           "step_lineage", "step_text", "StepLineage",
           "resolve_run", "LineageError"]
