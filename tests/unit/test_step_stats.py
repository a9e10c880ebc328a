"""One frozen record per training step's statistics (schemas/step_stats.py: StepStats), derived from
the StepMetrics model: its columns are today's exactly, the published metrics file keeps its bytes,
and a metric declared once in the model reaches the record, the train task's row and file and the
trackers' names without touching any other consumer."""

from __future__ import annotations

import dataclasses
import hashlib
import math
from pathlib import Path
from typing import Any, Optional

import pandera.pyarrow as pdp
import pyarrow as pa
import pytest

import schemas
from engines.train import publish
from reports import run as run_report
from schemas.models import _stat
from schemas.step_stats import StepStats, record_of, step_fields
from tracking.scalars import STEP_GROUPS, step_groups, step_scalars

I32, I64, F64, STR = pa.int32(), pa.int64(), pa.float64(), pa.string()

# The StepMetrics columns as run folders hold them (names, Arrow types, order): written out by hand.
TODAYS_COLUMNS = [
    ("step", I32), ("checkpoint_id", STR), ("parent_checkpoint_id", STR), ("loss", F64), ("entropy", F64),
    ("clip_frac_low", F64), ("clip_frac_high", F64), ("dual_clip_frac", F64), ("approx_kl", F64),
    ("grad_norm", F64), ("lr", F64), ("tokens", I64), ("samples", I64), ("masked_samples", I64),
    ("reward_mean", F64), ("accuracy", F64), ("response_length_mean", F64), ("truncation_ratio", F64),
    ("generation_rounds", I32), ("trained_groups", I32), ("carried_groups", I32), ("samples_generated", I64),
    ("over_generation", F64), ("zero_signal_share", F64), ("max_policy_lag_steps", I32),
    ("policy_lag_mean", F64), ("policy_lag_max", I32), ("stale_sample_fraction", F64),
    ("logprob_mismatch_mean_abs", F64), ("logprob_mismatch_max_abs", F64),
    ("logprob_mismatch_on_policy_mean_abs", F64), ("logprob_mismatch_on_policy_max_abs", F64),
    ("behaviour_weight_mean", F64), ("behaviour_weight_capped_fraction", F64), ("verdict_timeouts", I64),
    ("verdict_errors", I64), ("time_rollout_s", F64), ("time_score_s", F64), ("time_train_s", F64),
]

WORKER_FLOATS = ("loss", "entropy", "clip_frac_low", "clip_frac_high", "dual_clip_frac", "approx_kl", "grad_norm", "lr",
                 "policy_lag_mean", "stale_sample_fraction", "logprob_mismatch_mean_abs", "logprob_mismatch_max_abs",
                 "logprob_mismatch_on_policy_mean_abs", "logprob_mismatch_on_policy_max_abs",
                 "behaviour_weight_mean", "behaviour_weight_capped_fraction")


def _worker() -> dict[str, Any]:
    """What a training worker reports for its step (plus keys the row does not take: timings)."""
    worker: dict[str, Any] = dict.fromkeys(WORKER_FLOATS, 0.125)
    worker.update(loss=-0.5, lr=1e-6, logprob_mismatch_on_policy_max_abs=math.nan, policy_lag_max=2, tokens=77,
                  samples=8, masked_samples=1, timings={"load_s": 1.0})
    return worker


def test_step_metrics_columns_are_todays_exactly() -> None:
    schema = schemas.arrow_schema(schemas.StepMetrics)
    assert [(f.name, f.type) for f in schema] == TODAYS_COLUMNS
    assert all(f.nullable for f in schema) and schema.metadata == {b"dapo.schema": b"StepMetrics"}
    assert [f.name for f in dataclasses.fields(StepStats)] == [name for name, _ in TODAYS_COLUMNS]
    assert [(f.name, f.arrow_type) for f in schemas.STEP_FIELDS] == TODAYS_COLUMNS


def test_step_stats_is_a_frozen_record_with_blank_statistics() -> None:
    stats = StepStats.blank(4, "train-0004", "train-0003", loss=0.5)
    assert stats.step == 4 and stats.loss == 0.5 and stats.tokens == 0 and math.isnan(stats.accuracy)
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.loss = 1.0  # type: ignore[misc]
    assert StepStats.from_row(stats.row()) == dataclasses.replace(stats)
    with pytest.raises(TypeError):
        StepStats.from_row({**stats.row(), "not_a_metric": 1.0})


def test_train_row_is_todays_row() -> None:
    """The train task's row: worker statistics as their column's type, rollout/score blank."""
    row = publish._step_metrics_row(3, "train-0003-abcd", "train-0002-ef01", _worker(), time_train_s=1.5)
    expected: dict[str, Any] = {"step": 3, "checkpoint_id": "train-0003-abcd", "parent_checkpoint_id": "train-0002-ef01",
                                **{k: _worker()[k] for k in WORKER_FLOATS}, "policy_lag_max": 2, "tokens": 77,
                                "samples": 8, "masked_samples": 1, "time_train_s": 1.5}
    for name, arrow_type in TODAYS_COLUMNS:
        if name not in expected:
            expected[name] = 0 if pa.types.is_integer(arrow_type) else math.nan
    assert list(row) == [name for name, _ in TODAYS_COLUMNS]
    assert {k: type(v) for k, v in row.items()} == {k: type(v) for k, v in expected.items()}
    assert {k: v for k, v in row.items() if v == v} == {k: v for k, v in expected.items() if v == v}
    assert {k for k, v in row.items() if v != v} == {k for k, v in expected.items() if v != v}


def test_published_metrics_file_keeps_its_bytes(tmp_path: Path) -> None:
    """The train task's ``train_metrics.parquet`` is byte for byte what the hand-built table of the
    code before StepStats wrote (NaN kept as NaN, not null; int32 where the schema says so)."""
    row = publish._step_metrics_row(3, "train-0003-abcd", "train-0002-ef01", _worker(), time_train_s=1.5)
    publish._write_metrics(row, tmp_path / "new.parquet")
    int32 = {"step", "generation_rounds", "trained_groups", "carried_groups", "max_policy_lag_steps", "policy_lag_max"}
    before = pa.table({k: pa.array([v], type=pa.int32() if k in int32 else None) for k, v in row.items()})
    schemas.write_shard(before, tmp_path / "old.parquet", schemas.StepMetrics)
    new, old = (tmp_path / "new.parquet").read_bytes(), (tmp_path / "old.parquet").read_bytes()
    assert hashlib.sha256(new).hexdigest() == hashlib.sha256(old).hexdigest()
    back = schemas.read_shard(tmp_path / "new.parquet", schemas.StepMetrics).to_pylist()[0]
    assert math.isnan(back["accuracy"]) and math.isnan(back["logprob_mismatch_on_policy_max_abs"])


def test_every_consumer_names_come_from_the_record() -> None:
    statistics = [f.name for f in schemas.STEP_FIELDS if f.name not in ("step", "checkpoint_id", "parent_checkpoint_id")]
    assert list(STEP_GROUPS) == statistics
    assert STEP_GROUPS["loss"] == "train" and STEP_GROUPS["accuracy"] == "rollout"
    assert STEP_GROUPS["behaviour_weight_mean"] == "off_policy" and STEP_GROUPS["time_train_s"] == "time"
    # the run page's steps table: the step, then every statistic, in the record's order
    assert [c.key for c in run_report.step_columns()] == ["step", *statistics]


class _WithNewMetric(schemas.StepMetrics):
    """StepMetrics plus one metric, declared once as a new metric would be."""

    kl_to_reference: Optional[pa.float64()] = pdp.Field(nullable=True, metadata=_stat("train", "worker"))

    class Config:
        strict = True


def test_adding_a_metric_is_one_declaration_plus_its_producer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Declared in the model alone, a new metric reaches the record, the train task's row and file
    (its producer, the worker, reports it) and the trackers' names; nothing else names it."""
    record = record_of(_WithNewMetric, "StepStatsPlus")
    assert [f.name for f in dataclasses.fields(record)][-1] == "kl_to_reference"
    assert math.isnan(record.blank(0, "a", "b").kl_to_reference)
    monkeypatch.setattr(schemas, "StepMetrics", _WithNewMetric)
    monkeypatch.setattr(schemas, "StepStats", record)
    monkeypatch.setattr(schemas, "STEP_FIELDS", record.FIELDS)
    row = publish._step_metrics_row(3, "train-0003-abcd", "train-0002-ef01", {**_worker(), "kl_to_reference": 0.25},
                                    time_train_s=1.5)
    publish._write_metrics(row, tmp_path / "m.parquet")
    back = schemas.read_shard(tmp_path / "m.parquet", _WithNewMetric).to_pylist()[0]
    assert back["kl_to_reference"] == 0.25 and back["tokens"] == 77
    groups = step_groups(step_fields(_WithNewMetric))
    assert groups == {**STEP_GROUPS, "kl_to_reference": "train"}
    monkeypatch.setattr("tracking.scalars.STEP_GROUPS", groups)
    assert step_scalars(back)["train/kl_to_reference"] == 0.25


def test_the_driver_fills_the_skipped_steps_row_from_the_record(monkeypatch: pytest.MonkeyPatch) -> None:
    """A skipped step's row: every statistic blank, then what rollout, scoring and sampling measured
    (workflows/driver.py: _skipped_step, _step_row), columns in the schema's order."""
    from types import SimpleNamespace

    from workflows import driver

    monkeypatch.setattr(driver.checkpoints, "read_info", lambda _: SimpleNamespace(checkpoint_id="train-0001-aa"))
    trained = driver._skipped_step(2, "/ckpt")
    rounds = [{"samples": 4, "groups": 2, "zero_signal_groups": 1, "accuracy": 0.5, "truncation_ratio": 0.25,
               "verdict_timeouts": 1, "verdict_errors": 0, "time_rollout_s": 2.0, "time_score_s": 0.5},
              {"samples": 12, "groups": 6, "zero_signal_groups": 6, "accuracy": 0.25, "truncation_ratio": 0.0,
               "verdict_timeouts": 0, "verdict_errors": 2, "time_rollout_s": 3.0, "time_score_s": 1.5}]
    plan = SimpleNamespace(round_stats=rounds, result=SimpleNamespace(rounds=2, kept=[]), carried_groups=lambda: 0,
                           policy_lags=lambda: [])
    row = driver._step_row(trained, None, plan, train_s=0.75)
    assert list(row) == [name for name, _ in TODAYS_COLUMNS]
    assert (row["step"], row["checkpoint_id"], row["parent_checkpoint_id"]) == (2, "train-0001-aa", "train-0001-aa")
    assert row["accuracy"] == (4 * 0.5 + 12 * 0.25) / 16 and row["truncation_ratio"] == 4 * 0.25 / 16
    assert (row["generation_rounds"], row["trained_groups"], row["verdict_timeouts"], row["verdict_errors"]) == (2, 0, 1, 2)
    assert (row["time_rollout_s"], row["time_score_s"], row["time_train_s"]) == (5.0, 2.0, 0.75)
    assert math.isnan(row["loss"]) and math.isnan(row["reward_mean"]) and row["tokens"] == 0
    # 16 samples generated, none trained: no ratio; 7 of the 8 groups had all-equal rewards
    assert row["samples_generated"] == 16 and math.isnan(row["over_generation"]) and row["zero_signal_share"] == 7 / 8
    schemas.validate_table(pa.Table.from_pylist([row], schema=schemas.arrow_schema(schemas.StepMetrics)), schemas.StepMetrics)


def test_the_driver_records_sample_use_per_step_and_the_page_and_trackers_show_it() -> None:
    """Samples generated, generated per sample trained (carried surplus counts as trained, so a step
    can be below 1) and the zero-signal share of the step's generated groups (all-equal rewards,
    TRL's frac_reward_zero_std): in the row, on the run page by their declared units, and tracked."""
    from types import SimpleNamespace

    from workflows import driver

    trained = publish._step_metrics_row(3, "train-0003-abcd", "train-0002-ef01", _worker(), time_train_s=1.5)  # 8 samples
    rounds = [{"samples": 12, "groups": 3, "zero_signal_groups": 1, "accuracy": 0.5, "truncation_ratio": 0.0,
               "verdict_timeouts": 0, "verdict_errors": 0, "time_rollout_s": 1.0, "time_score_s": 0.5}]
    plan = SimpleNamespace(round_stats=rounds, result=SimpleNamespace(rounds=1, kept=[("g", None)] * 2),
                           carried_groups=lambda: 0, policy_lags=lambda: [0, 0])
    row = driver._step_row(trained, None, plan, train_s=1.5)
    assert (row["samples_generated"], row["over_generation"], row["zero_signal_share"]) == (12, 1.5, 1 / 3)
    carried_only = SimpleNamespace(round_stats=[], result=SimpleNamespace(rounds=0, kept=[("g", None)] * 2),
                                   carried_groups=lambda: 2, policy_lags=lambda: [1, 1])
    row = driver._step_row(trained, None, carried_only, train_s=1.5)
    assert row["samples_generated"] == 0 and row["over_generation"] == 0.0 and math.isnan(row["zero_signal_share"])
    columns = {c.key: c for c in run_report.step_columns()}
    assert columns["zero_signal_share"].fmt(0.25) == "25.0%" and columns["over_generation"].fmt(1.5) == "1.5"
    assert columns["samples_generated"].fmt(12288) == "12,288"
    assert {STEP_GROUPS[k] for k in ("samples_generated", "over_generation", "zero_signal_share")} == {"sampling"}
    assert step_scalars(row)["sampling/samples_generated"] == 0 and "sampling/zero_signal_share" not in step_scalars(row)
