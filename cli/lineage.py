"""Lineage: where a training sample or a checkpoint came from, read from a run folder.

For a sample (a ``rollout_id``): its problem and source row, the checkpoint and seed that
generated it, the reward verdict and the reward code's version, the dynamic-sampling decision,
and the step that trained on it (and the checkpoint that step produced). For a checkpoint:
its ancestors back to step 0, and for each training step the batch, the rounds and the
metrics that produced it. Everything is read from the shards the stages wrote; nothing is
inferred from names alone.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import pyarrow.compute as pc

import schemas
from storage import checkpoints, run_store
from storage.run_layout import RunLayout
from workflows import json_output
from workflows.exit_codes import BAD_INPUT


class LineageError(LookupError):
    """The run folder does not hold what was asked for (the message says where it looked)."""


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
                }
            metrics_path = Path(layout.metrics_shard(info.step))
            if metrics_path.exists():
                entry["metrics"] = schemas.read_shard(metrics_path, schemas.StepMetrics).to_pylist()[0]
        else:
            entry["inputs"] = {k: v for k, v in info.inputs.items() if k != "warmup"}
        chain.append(entry)
        if info.parent_checkpoint_id is None:
            break
        folder = checkpoint_by_id(layout, info.parent_checkpoint_id)
    return {"checkpoint": chain[0]["checkpoint_id"], "ancestry": chain}


def trained_samples(layout: RunLayout, step: int) -> list[str]:
    """The rollout ids step ``step`` trained on."""
    path = Path(layout.batch_shard(step))
    if not path.exists():
        raise LineageError(f"{path}: step {step} has no batch (not run yet?)")
    return schemas.read_shard(path, schemas.ScoredRollout).column("rollout_id").to_pylist()


# Lineage reads records, never weights or optimizer state: these stay in the object store.
_NOT_RECORDS = (".safetensors", ".bin", ".pt", ".pth", ".png", ".html")


def resolve_run(run: str, run_root: str) -> RunLayout:
    """A run folder given as a path or URI, or as a name under ``run_root``.

    A run in an object store is copied (records only) to a local folder first, which the
    returned layout names; ``display_names`` maps its paths back to URIs.
    """
    candidates = [run] if run_store.is_remote(run) else [run, run_store.join(run_root, run)]
    for candidate in candidates:
        if not run_store.exists(run_store.join(candidate, "run.json")):
            continue
        if not run_store.is_remote(candidate):
            return RunLayout(Path(candidate).resolve())
        local = _records_copy(candidate)
        run_store.download_tree(candidate, local, exclude_suffixes=_NOT_RECORDS)
        return RunLayout(local)
    raise LineageError(f"{run!r}: not a run folder (no run.json here or under {run_root}/)")


def _records_copy(uri: str) -> Path:
    return run_store.mirror_root() / "lineage" / run_store.local_path(uri).relative_to(run_store.mirror_root())


def display_names(text: str, run: str, run_root: str) -> str:
    """``text`` with the local records copy of an object-store run named by its URI again."""
    for candidate in [run, run_store.join(run_root, run)]:
        if run_store.is_remote(candidate):
            text = text.replace(str(_records_copy(candidate)), candidate)
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="run folder, or a run name under --run-root")
    parser.add_argument("--run-root", default="runs", help="where run names are looked up (default: %(default)s)")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--sample", metavar="ROLLOUT_ID", help="trace one sample")
    what.add_argument("--checkpoint", metavar="ID", help="trace a checkpoint (its id, step-N, or the step number)")
    what.add_argument("--step", type=int, metavar="N", help="list the sample ids step N trained on")


def run_cli(args: argparse.Namespace) -> int:
    def show(text: str) -> None:
        print(display_names(text, args.run, args.run_root))

    try:
        layout = resolve_run(args.run, args.run_root)
        if args.sample:
            show(json_output.dumps_readable(sample_lineage(layout, args.sample)))
        elif args.checkpoint is not None:
            show(json_output.dumps_readable(checkpoint_lineage(layout, args.checkpoint)))
        else:
            for rollout_id in trained_samples(layout, args.step):
                print(rollout_id)
    except LineageError as err:
        print(display_names(f"dapo lineage: {err}", args.run, args.run_root), file=sys.stderr)
        return BAD_INPUT
    return 0


__all__ = ["sample_lineage", "checkpoint_lineage", "trained_samples", "resolve_run", "LineageError"]
