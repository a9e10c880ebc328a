"""Synthetic StepMetrics rows and evaluations for the tracker tests, and W&B's offline files read back.

The rows go through ``schemas.write_shard``/``read_shard`` first, so they are what the driver holds:
schema-valid, with NaN read back as None.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

import schemas


def step_rows(tmp: Path, steps: range) -> list[dict[str, Any]]:
    """One StepMetrics row per step; every numeric column a distinct value; step 2 skipped (no loss)."""
    rows = []
    for step in steps:
        row: dict[str, Any] = {}
        for i, field in enumerate(schemas.arrow_schema(schemas.StepMetrics)):
            if field.name == "step":
                row["step"] = step
            elif pa.types.is_string(field.type):
                row[field.name] = f"ckpt-{step}"
            elif pa.types.is_integer(field.type):
                row[field.name] = step * 100 + i
            else:
                row[field.name] = step + i / 64  # exact in float32 and float64
        if step == 2:
            row["loss"] = row["entropy"] = float("nan")
        rows.append(row)
    path = tmp / f"rows-{steps.start}-{steps.stop}.parquet"
    schemas.write_shard(rows, path, schemas.StepMetrics)
    return schemas.read_shard(path, schemas.StepMetrics).to_pylist()


def evaluation(step: int) -> dict[str, Any]:
    """An evaluation summary as the driver holds it (engines/evaluate/stage.py: EvalSummary, plus step and interval)."""
    return {"step": step, "eval_set": "heldout", "checkpoint_id": f"ckpt-{step}", "problems": 40, "k": 4,
            "k_values": [4], "input_rows": 40, "rejected_rows": {}, "avg_at_k": 0.25 + step / 8,
            "pass_at_k": 0.5 + step / 16, "maj_at_k": 0.375, "verdict_timeouts": 0, "verdict_errors": 1,
            "seconds": 2.5, "avg_at_k_ci95_half": 0.125}


def _wandb_records(run_dir: Path) -> Iterator[Any]:
    """Every record of the ``.wandb`` transaction logs under ``run_dir``, decoded with W&B's own
    protobuf ``Record``. wandb 0.31 ships no Python reader of the file (its ``wandb-core`` binary
    reads it for ``wandb sync``), so the framing, LevelDB's log format (32 KiB blocks of
    ``crc32 | length | type`` chunks after a 7-byte W&B header), is read here."""
    from wandb.proto import wandb_internal_pb2

    for path in sorted(run_dir.rglob("*.wandb")):
        data, pos, pending = path.read_bytes(), 7, b""
        assert data[:4] == b":W&B", path
        while pos + 7 <= len(data):
            room = 32768 - pos % 32768
            if room < 7:
                pos += room
                continue
            _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
            chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
            if kind == 0:
                break
            pending = chunk if kind in (1, 2) else pending + chunk
            if kind not in (1, 4):
                continue
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


def wandb_history(run_dir: Path) -> list[dict[str, Any]]:
    """Every history row of the ``.wandb`` transaction logs under ``run_dir``; ``_run_id`` added."""
    import json

    rows, run_id = [], None
    for record in _wandb_records(run_dir):
        if record.WhichOneof("record_type") == "run":
            run_id = record.run.run_id
        elif record.WhichOneof("record_type") == "history":
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            rows.append({**row, "_run_id": run_id})
    return rows


def wandb_runs(run_dir: Path) -> list[dict[str, Any]]:
    """The run record of each session under ``run_dir``: its id, display name and config."""
    import json

    return [{"run_id": r.run.run_id, "name": r.run.display_name,
             "config": {item.key: json.loads(item.value_json) for item in r.run.config.update}}
            for r in _wandb_records(run_dir) if r.WhichOneof("record_type") == "run"]
