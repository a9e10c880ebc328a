"""Assemble a step's training batch from the scored rounds: the kept groups (dynamic sampling,
sec. 3.2) into the batch shard and the surplus carried to the next step, each row marked."""

from __future__ import annotations

import pyarrow as pa

import schemas
from dapo_core.sampling import REASON_KEPT, REASON_SURPLUS, group_key
from engines.score.stage import group_keys_of


def _with_decision(table: pa.Table, reason: str) -> pa.Table:
    n = table.num_rows
    kept_col = table.schema.get_field_index("kept")
    reason_col = table.schema.get_field_index("filter_reason")
    table = table.set_column(kept_col, "kept", pa.array([reason == REASON_KEPT] * n, pa.bool_()))
    return table.set_column(reason_col, "filter_reason", pa.array([reason] * n, pa.string()))


def assemble_tables(
    scored: list[tuple[int, pa.Table]], kept_groups: list[str], surplus_groups: list[str]
) -> tuple[pa.Table, pa.Table]:
    """Rows of ``kept_groups`` (as the batch) and of ``surplus_groups``, in the listed group order.

    ``scored`` holds ``(step, table)`` per scored shard, the step that generated its rows: a group
    is one (step, round, problem, checkpoint) (``dapo_core.sampling.group_key``), and the shards
    record no step; two steps can generate one problem in one round from one checkpoint.
    """
    overlap = set(kept_groups) & set(surplus_groups)
    if overlap:
        raise ValueError(f"groups both kept and surplus: {sorted(overlap)[:3]}")
    keys = [group_key(step, key) for step, table in scored for key in group_keys_of(table)]
    scored_rows = pa.concat_tables([table for _, table in scored])
    rows_of: dict[str, list[int]] = {}
    for i, key in enumerate(keys):
        rows_of.setdefault(key, []).append(i)
    missing = [g for g in [*kept_groups, *surplus_groups] if g not in rows_of]
    if missing:
        raise ValueError(f"{len(missing)} selected group(s) not found in the scored shards, e.g. {missing[:3]}")

    def take(groups: list[str]) -> pa.Table:
        index = [i for g in groups for i in rows_of[g]]
        return scored_rows.take(pa.array(index, pa.int64()))

    return _with_decision(take(kept_groups), REASON_KEPT), _with_decision(take(surplus_groups), REASON_SURPLUS)


def assemble_shards(
    scored_paths: list[str], scored_steps: list[int], kept_groups: list[str], surplus_groups: list[str],
    batch_path: str, surplus_path: str,
) -> int:
    """Write the batch and surplus shards; returns the number of samples in the batch.

    ``scored_steps[i]`` is the step whose rollout made ``scored_paths[i]``.
    """
    if not kept_groups:
        raise ValueError(f"{batch_path}: no groups selected for the training batch")
    if len(scored_steps) != len(scored_paths):
        raise ValueError(f"{batch_path}: {len(scored_paths)} scored shards but {len(scored_steps)} steps for them")
    scored = [(step, schemas.read_shard(path, schemas.ScoredRollout)) for step, path in zip(scored_steps, scored_paths)]
    batch, surplus = assemble_tables(scored, kept_groups, surplus_groups)
    schemas.write_shard(batch, batch_path, schemas.ScoredRollout)
    schemas.write_shard(surplus, surplus_path, schemas.ScoredRollout)
    return batch.num_rows
