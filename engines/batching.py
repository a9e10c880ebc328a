"""Assemble a step's training batch from the scored rounds: the kept groups (dynamic sampling,
sec. 3.2) into the batch shard and the surplus carried to the next step, each row marked."""

from __future__ import annotations

import pyarrow as pa

import schemas
from dapo_core.sampling import REASON_KEPT, REASON_SURPLUS
from engines.scoring import group_keys_of


def _with_decision(table: pa.Table, reason: str) -> pa.Table:
    n = table.num_rows
    kept_col = table.schema.get_field_index("kept")
    reason_col = table.schema.get_field_index("filter_reason")
    table = table.set_column(kept_col, "kept", pa.array([reason == REASON_KEPT] * n, pa.bool_()))
    return table.set_column(reason_col, "filter_reason", pa.array([reason] * n, pa.string()))


def assemble_tables(scored: pa.Table, kept_groups: list[str], surplus_groups: list[str]) -> tuple[pa.Table, pa.Table]:
    """Rows of ``kept_groups`` (as the batch) and of ``surplus_groups``, in the listed group order."""
    overlap = set(kept_groups) & set(surplus_groups)
    if overlap:
        raise ValueError(f"groups both kept and surplus: {sorted(overlap)[:3]}")
    keys = group_keys_of(scored)
    rows_of: dict[str, list[int]] = {}
    for i, key in enumerate(keys):
        rows_of.setdefault(key, []).append(i)
    missing = [g for g in [*kept_groups, *surplus_groups] if g not in rows_of]
    if missing:
        raise ValueError(f"{len(missing)} selected group(s) not found in the scored shards, e.g. {missing[:3]}")

    def take(groups: list[str]) -> pa.Table:
        index = [i for g in groups for i in rows_of[g]]
        return scored.take(pa.array(index, pa.int64()))

    return _with_decision(take(kept_groups), REASON_KEPT), _with_decision(take(surplus_groups), REASON_SURPLUS)


def assemble_shards(
    scored_paths: list[str], kept_groups: list[str], surplus_groups: list[str], batch_path: str, surplus_path: str
) -> int:
    """Write the batch and surplus shards; returns the number of samples in the batch."""
    if not kept_groups:
        raise ValueError(f"{batch_path}: no groups selected for the training batch")
    scored = schemas.read_shards(scored_paths, schemas.ScoredRollout)
    batch, surplus = assemble_tables(scored, kept_groups, surplus_groups)
    schemas.write_shard(batch, batch_path, schemas.ScoredRollout)
    schemas.write_shard(surplus, surplus_path, schemas.ScoredRollout)
    return batch.num_rows
