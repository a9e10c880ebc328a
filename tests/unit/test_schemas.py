"""Stage-boundary models and atomic shard I/O (schemas/)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import schemas.models
import schemas.shards
from schemas import (
    ALL_MODELS,
    EvalResult,
    Problem,
    RejectedProblem,
    Rollout,
    ScoredRollout,
    ShardValidationError,
    StepMetrics,
    arrow_schema,
    read_shard,
    read_shards,
    write_shard,
)

PID = "0123456789abcdef"


def problem_row(**over: Any) -> dict[str, Any]:
    row = dict(problem_id=PID, source="synthetic", source_row=0, problem="37+5-18", answer=24,
               original_answer="24", prompt="37+5-18=\n", split="train", answer_rule="integer")
    return {**row, **over}


def rollout_row(**over: Any) -> dict[str, Any]:
    row = dict(rollout_id="r0", problem_id=PID, sample_index=0, prompt_token_ids=[1, 2, 3],
               response_token_ids=[4, 5], response_text="ab", rollout_log_probs=[-0.5, -1.5],
               response_length=2, finish_reason="stop", truncated=False, checkpoint_id="ckpt-0",
               policy_version=0, seed=7, generation_round=0)
    return {**row, **over}


def scored_row(**over: Any) -> dict[str, Any]:
    # reward = rule_reward + overlong_penalty = 1.0 + (-0.25) = 0.75
    row = dict(rollout_row(), gold_answer=24, extracted_answer="24", correct=True, verdict_status="ok",
               rule_reward=1.0, overlong_penalty=-0.25, reward=0.75, advantage=0.5, loss_masked=False,
               kept=True, filter_reason="kept", reward_version="rv1")
    return {**row, **over}


def eval_row(**over: Any) -> dict[str, Any]:
    # 3 of k=4 correct: avg@4 = 3 / 4 = 0.75, pass@4 = True
    row = dict(eval_set="aime24", problem_id=PID, checkpoint_id="ckpt-3", step=3, k=4, num_correct=3,
               avg_at_k=0.75, pass_at_k=True, maj_answer="24", maj_correct=True, verdict_timeouts=0,
               verdict_errors=0, temperature=1.0, top_p=0.7, seed=0)
    return {**row, **over}


def metrics_row(**over: Any) -> dict[str, Any]:
    row: dict[str, Any] = {}
    for f in arrow_schema(StepMetrics):
        row[f.name] = 1 if pa.types.is_integer(f.type) else 0.5 if pa.types.is_floating(f.type) else "ckpt"
    return {**row, **over}


def test_arrow_schemas_match_the_architecture_contract() -> None:
    problem = arrow_schema(Problem)
    assert problem.names == ["problem_id", "source", "source_row", "problem", "answer",
                             "original_answer", "prompt", "split", "answer_rule"]
    assert problem.field("answer").type == pa.int64() and problem.field("source_row").type == pa.int64()
    rollout = arrow_schema(Rollout)
    assert rollout.field("prompt_token_ids").type == pa.list_(pa.int32())
    assert rollout.field("rollout_log_probs").type == pa.list_(pa.float32())
    assert rollout.field("sample_index").type == pa.int32() and rollout.field("seed").type == pa.int64()
    scored = arrow_schema(ScoredRollout)
    assert scored.names[: len(rollout.names)] == rollout.names  # all Rollout columns, then more
    assert scored.field("reward").type == pa.float32() and scored.field("gold_answer").type == pa.int64()
    metrics = arrow_schema(StepMetrics)
    assert metrics.field("step").type == pa.int32() and metrics.field("tokens").type == pa.int64()
    assert metrics.field("generation_rounds").type == pa.int32() and metrics.field("lr").type == pa.float64()
    assert metrics.field("trained_groups").type == pa.int32() and metrics.field("max_policy_lag_steps").type == pa.int32()
    assert metrics.field("policy_lag_max").type == pa.int32()
    assert len(metrics) == 39  # + samples_generated, over_generation, zero_signal_share (issue 51)
    ev = arrow_schema(EvalResult)
    assert ev.field("k").type == pa.int32() and ev.field("avg_at_k").type == pa.float64()
    assert ev.field("pass_at_k").type == pa.bool_() and ev.field("seed").type == pa.int64()
    assert ev.field("verdict_timeouts").type == pa.int32() and ev.field("verdict_errors").type == pa.int32()
    assert len(ALL_MODELS) == 6


@pytest.mark.parametrize(
    ("model", "rows"),
    [
        (Problem, [problem_row(), problem_row(problem_id="fedcba9876543210", source_row=1)]),
        (RejectedProblem, [dict(source="f.parquet", source_row=3, problem=None, original_answer=None,
                                reason_code="bad_encoding", reason="row 3 is not UTF-8")]),
        (Rollout, [rollout_row(), rollout_row(rollout_id="r1", sample_index=1, finish_reason="length", truncated=True)]),
        (ScoredRollout, [scored_row()]),
        (StepMetrics, [metrics_row(), metrics_row(step=2, loss=float("nan"))]),
        (EvalResult, [eval_row()]),
    ],
)
def test_round_trip_each_model(tmp_path: Path, model: type, rows: list[dict[str, Any]]) -> None:
    path = write_shard(rows, tmp_path / "x.parquet", model)
    table = read_shard(path, model)
    assert table.schema.remove_metadata() == arrow_schema(model).remove_metadata()
    assert table.num_rows == len(rows)
    assert pq.read_schema(path).field(0).type == arrow_schema(model).field(0).type
    for back, row in zip(table.to_pylist(), rows, strict=True):  # every value as written, in row order
        for key, value in row.items():
            # A NaN in a row of Python values is stored as null (pyarrow's from_pandas conversion):
            # both mean "no figure" to every reader.
            want = None if isinstance(value, float) and math.isnan(value) else value
            assert back[key] == want, (key, value, back[key])


def test_step_metrics_allows_nan_for_unfilled_floats(tmp_path: Path) -> None:
    table = pa.Table.from_pylist([metrics_row(entropy=float("nan"), grad_norm=None)], schema=arrow_schema(StepMetrics))
    back = read_shard(write_shard(table, tmp_path / "m.parquet", StepMetrics), StepMetrics)
    assert math.isnan(back["entropy"][0].as_py())
    assert back["grad_norm"][0].as_py() is None


def test_dataframe_and_table_inputs(tmp_path: Path) -> None:
    df = pd.DataFrame([problem_row(), problem_row(problem_id="fedcba9876543210")])
    assert read_shard(write_shard(df, tmp_path / "a.parquet", Problem), Problem).num_rows == 2
    # A table with int32 where int64 is wanted is widened safely; a string column is not reinterpreted.
    t = pa.Table.from_pylist([problem_row()]).set_column(4, "answer", pa.array([24], pa.int32()))
    assert read_shard(write_shard(t, tmp_path / "b.parquet", Problem), Problem)["answer"].type == pa.int64()
    bad = t.set_column(4, "answer", pa.array(["24"]))
    with pytest.raises(ShardValidationError, match=r"column 'answer': type string, expected int64"):
        write_shard(bad, tmp_path / "c.parquet", Problem)


def test_validation_error_names_file_column_rows_and_values(tmp_path: Path) -> None:
    rows = [problem_row(), problem_row(problem_id="not-hex", source_row=1), problem_row(source_row=-4)]
    target = tmp_path / "problems.parquet"
    with pytest.raises(ShardValidationError) as info:
        write_shard(rows, target, Problem)
    message = str(info.value)
    assert str(target) in message
    assert "column 'problem_id'" in message and "1='not-hex'" in message  # row 1, its value
    assert "column 'source_row'" in message and "2=-4" in message  # row 2, its value
    assert not target.exists()


def test_validation_errors_for_nulls_missing_and_extra_columns(tmp_path: Path) -> None:
    with pytest.raises(ShardValidationError, match=r"column 'answer': nulls not allowed: 1 row\(s\): 1=None"):
        write_shard([problem_row(), problem_row(answer=None)], tmp_path / "n.parquet", Problem)
    row = problem_row(extra=1)
    del row["split"]
    with pytest.raises(ShardValidationError, match=r"missing column\(s\): \['split'\]") as info:
        write_shard([row], tmp_path / "m.parquet", Problem)
    assert "unexpected column(s): ['extra']" in str(info.value)
    with pytest.raises(ShardValidationError, match=r"column 'answer': values not convertible to int64: 1 row\(s\): 0='x'"):
        write_shard([problem_row(answer="x")], tmp_path / "v.parquet", Problem)


def test_row_rules_name_the_rows(tmp_path: Path) -> None:
    rows = [rollout_row(), rollout_row(rollout_id="r1", rollout_log_probs=[-1.0])]  # 2 tokens, 1 log-prob
    with pytest.raises(ShardValidationError, match=r"row rule 'log_probs_per_token'.*1 row\(s\): 1="):
        write_shard(rows, tmp_path / "r.parquet", Rollout)
    with pytest.raises(ShardValidationError, match=r"truncated_iff_length.*0="):
        write_shard([rollout_row(truncated=True)], tmp_path / "r.parquet", Rollout)
    with pytest.raises(ShardValidationError, match=r"column 'rollout_id': values must be unique: 2 row\(s\)"):
        write_shard([rollout_row(), rollout_row(sample_index=1)], tmp_path / "r.parquet", Rollout)
    # 1.0 + (-0.25) = 0.75, not 0.5
    with pytest.raises(ShardValidationError, match=r"reward_is_sum.*0="):
        write_shard([scored_row(reward=0.5)], tmp_path / "s.parquet", ScoredRollout)
    with pytest.raises(ShardValidationError, match=r"column 'filter_reason'.*0='lucky'"):
        write_shard([scored_row(filter_reason="lucky", kept=False)], tmp_path / "s.parquet", ScoredRollout)
    # 3 / 4 = 0.75, not 0.7
    with pytest.raises(ShardValidationError, match=r"avg_is_fraction.*0="):
        write_shard([eval_row(avg_at_k=0.7)], tmp_path / "e.parquet", EvalResult)
    with pytest.raises(ShardValidationError, match=r"must be unique together: 2 row\(s\)"):
        write_shard([eval_row(), eval_row()], tmp_path / "e.parquet", EvalResult)
    with pytest.raises(ShardValidationError, match=r"column 'step': values must be unique"):
        write_shard([metrics_row(), metrics_row()], tmp_path / "m.parquet", StepMetrics)


def test_read_validates_exact_types_of_foreign_files(tmp_path: Path) -> None:
    path = tmp_path / "foreign.parquet"
    # Written by someone else with int32 answers: no silent cast on read.
    pq.write_table(pa.Table.from_pylist([problem_row()]).set_column(4, "answer", pa.array([24], pa.int32())), path)
    with pytest.raises(ShardValidationError, match=r"foreign.parquet.*\n.*column 'answer': type int32, expected int64"):
        read_shard(path, Problem)
    pq.write_table(pa.Table.from_pylist([problem_row(split="")], schema=arrow_schema(Problem)), path)
    with pytest.raises(ShardValidationError, match=r"column 'split'.*0=''"):
        read_shard(path, Problem)
    path.write_bytes(b"PAR1 truncated")
    with pytest.raises(ShardValidationError, match="cannot read Parquet"):
        read_shard(path, Problem)


def test_a_shard_written_before_a_column_was_added_reads_with_nulls_there(tmp_path: Path) -> None:
    # A run folder of an earlier version: its StepMetrics shards lack the columns added since.
    path = tmp_path / "old.parquet"
    added = schemas.models.ADDED_COLUMNS["StepMetrics"]
    full = arrow_schema(StepMetrics)
    old = pa.Table.from_pylist([metrics_row(step=3)], schema=full).drop_columns(list(added))
    pq.write_table(old, path)
    back = read_shard(path, StepMetrics)
    assert back.schema.equals(full, check_metadata=False)
    assert all(back.column(name).to_pylist() == [None] for name in added)
    assert back.column("step").to_pylist() == [3] and back.column("loss").to_pylist() == old.column("loss").to_pylist()
    # Any other column missing is still an error, named.
    pq.write_table(old.drop_columns(["entropy"]), path)
    with pytest.raises(ShardValidationError, match=r"missing column\(s\): \['entropy'\]"):
        read_shard(path, StepMetrics)


def test_every_added_column_is_a_nullable_column_of_its_model() -> None:
    models = {model.__name__: model for model in ALL_MODELS}
    for name, columns in schemas.models.ADDED_COLUMNS.items():
        schema = arrow_schema(models[name])
        for column in columns:
            assert schema.field(column).nullable, (name, column)
            assert models[name].to_schema().columns[column].nullable, (name, column)


def test_atomic_write_leaves_nothing_on_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "shard.parquet"

    def write_half_then_fail(table: pa.Table, where: Any, **kwargs: Any) -> None:
        where.write(b"PAR1 half a file")
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(schemas.shards.pq, "write_table", write_half_then_fail)
    with pytest.raises(OSError, match="simulated"):
        write_shard([problem_row()], target, Problem)
    assert not target.exists()
    assert list(tmp_path.iterdir()) == []  # the temp file is gone too


def test_atomic_write_keeps_the_old_file_on_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = write_shard([problem_row()], tmp_path / "shard.parquet", Problem)
    before = target.read_bytes()
    with pytest.raises(ShardValidationError):
        write_shard([problem_row(answer=None)], target, Problem)
    monkeypatch.setattr(schemas.shards.os, "replace", lambda *a: (_ for _ in ()).throw(OSError("rename failed")))
    with pytest.raises(OSError, match="rename failed"):
        write_shard([problem_row(answer=99)], target, Problem)
    assert target.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["shard.parquet"]


def test_write_is_byte_deterministic_and_read_shards_concatenates(tmp_path: Path) -> None:
    a = write_shard([problem_row()], tmp_path / "d" / "part-0.parquet", Problem)
    b = write_shard([problem_row()], tmp_path / "other.parquet", Problem)
    assert a.read_bytes() == b.read_bytes()
    write_shard([problem_row(problem_id="fedcba9876543210")], tmp_path / "d" / "part-1.parquet", Problem)
    (tmp_path / "d" / ".part-2.parquet.x.tmp").write_bytes(b"partial")  # never read
    both = read_shards(tmp_path / "d", Problem)
    assert both["problem_id"].to_pylist() == [PID, "fedcba9876543210"]
    assert read_shards([a, b], Problem).num_rows == 2
    with pytest.raises(FileNotFoundError, match="no \\*.parquet shards"):
        read_shards(tmp_path / "empty" if (tmp_path / "empty").mkdir() is None else tmp_path, Problem)


def test_flipped_bytes_in_a_data_page_fail_the_read_naming_the_file(tmp_path: Path) -> None:
    # 64 samples whose log-probs are all distinct; the shard is written by the stages' writer.
    rows = [rollout_row(rollout_id=f"r{i}", sample_index=i, rollout_log_probs=[-0.01 * i, -0.02 * i - 1.0])
            for i in range(64)]
    path = write_shard(rows, tmp_path / "batch.parquet", Rollout)
    intact = read_shard(path, Rollout)
    column = pq.ParquetFile(path).metadata.row_group(0).column(arrow_schema(Rollout).names.index("rollout_log_probs"))
    start, end = column.data_page_offset, column.data_page_offset + column.total_compressed_size
    good = path.read_bytes()
    # Bit rot that still decodes: 4 flipped bytes somewhere in the log-probs page that a reader
    # without page checksums turns into other, schema-valid values.
    for offset in range(start + 16, end - 4):
        damaged = bytearray(good)
        damaged[offset:offset + 4] = bytes(b ^ 0xFF for b in damaged[offset:offset + 4])
        path.write_bytes(bytes(damaged))
        try:
            decoded = pq.read_table(path)
        except (OSError, pa.ArrowException):
            continue
        if not decoded.equals(intact):
            break
    else:
        pytest.fail("no 4-byte flip in the page decodes to other values (test needs another column)")
    with pytest.raises(ShardValidationError, match=r"batch\.parquet: .*\n.*cannot read Parquet.*(?i:checksum)"):
        read_shard(path, Rollout)


def _counting_validations(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    original = schemas.shards.validate_table

    def counted(table: pa.Table, model: type, where: str = "<table>") -> pa.Table:
        calls.append(Path(where).name)
        return original(table, model, where)

    monkeypatch.setattr(schemas.shards, "validate_table", counted)
    return calls


def test_a_shard_is_validated_once_per_content_in_a_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Validate once per boundary: bytes this process wrote or read as a model are not validated again."""
    schemas.shards.forget_validated()
    calls = _counting_validations(monkeypatch)
    path = write_shard([problem_row()], tmp_path / "p.parquet", Problem)
    assert calls == ["p.parquet"]
    assert read_shard(path, Problem).equals(read_shard(path, Problem))
    assert calls == ["p.parquet"]  # the bytes it wrote, unchanged: no second validation
    with pytest.raises(ShardValidationError, match="missing column"):
        read_shard(path, Rollout)  # validated as Problem says nothing about Rollout: the schema check still runs
    # Other content at the same path (a file replaced by another writer) is validated again ...
    pq.write_table(pa.Table.from_pylist([problem_row(split="")], schema=arrow_schema(Problem)), path)
    with pytest.raises(ShardValidationError, match=r"column 'split'"):
        read_shard(path, Problem)
    # ... and so is a foreign file read for the first time, once.
    other = tmp_path / "foreign.parquet"
    pq.write_table(pa.Table.from_pylist([problem_row(problem_id="fedcba9876543210")], schema=arrow_schema(Problem)),
                   other)
    read_shard(other, Problem)
    read_shard(other, Problem)
    assert calls.count("foreign.parquet") == 1


def test_known_validated_content_is_trusted_only_for_its_sha256(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process told which content another process validated (the train workers) skips it only for those bytes."""
    import hashlib

    path = write_shard([problem_row()], tmp_path / "p.parquet", Problem)
    schemas.shards.forget_validated()
    calls = _counting_validations(monkeypatch)
    schemas.shards.trust_validated([hashlib.sha256(path.read_bytes()).hexdigest()], Problem)
    read_shard(path, Problem)
    assert calls == []
    write_shard([problem_row(answer=25)], path, Problem)
    schemas.shards.forget_validated()
    schemas.shards.trust_validated(["0" * 64], Problem)
    read_shard(path, Problem)
    assert calls == ["p.parquet", "p.parquet"]  # the write, then the read of bytes nobody vouched for


def test_validation_does_not_retry_the_missing_pyspark_import_per_column() -> None:
    import importlib.util
    import sys

    if importlib.util.find_spec("pyspark") is not None:
        pytest.skip("pyspark is installed: pandera imports its engine once")
    assert sys.modules["pandera.engines.pyspark_engine"] is None  # an import fails at once
    with pytest.raises(ImportError):
        from pandera.engines import pyspark_engine  # noqa: F401


def test_a_shards_bytes_are_read_into_arrow_memory_not_python_objects(tmp_path: Path) -> None:
    """A shard's bytes must not be a Python object inside Arrow's readers.

    Arrow's pool threads can drop the last reference to a reader after ``read_shard`` returns;
    freeing a Python-owned buffer there takes the GIL, and when the interpreter is exiting by
    then the process aborts ("terminate called without an active exception": ``dapo lineage``
    died with SIGABRT under load in CI). tracemalloc sees Python allocations only, so reading a
    1 MB shard whose content is already validated must not allocate anything near 1 MB there.
    """
    import os
    import tracemalloc

    noise = [os.urandom(2000).hex() for _ in range(500)]  # ~1 MB after compression
    path = write_shard([problem_row(source_row=i, problem=text) for i, text in enumerate(noise)],
                       tmp_path / "big.parquet", Problem)
    size = path.stat().st_size
    assert size > 900_000
    schemas.shards.forget_validated()  # not the table this process just wrote: parse the file
    read_shard(path, Problem)  # validated once; the second read below only parses
    schemas.shards.fresh_tables.forget()  # ... and parses: no table kept from the first read
    tracemalloc.start()
    try:
        read_shard(path, Problem)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < size / 4, f"{peak} bytes of Python memory to read a {size}-byte shard"


def _no_parquet_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the file was parsed")
    monkeypatch.setattr(schemas.shards.pq, "ParquetFile", refuse)


def test_a_shard_this_process_just_wrote_is_read_back_without_parsing_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_shard([problem_row(source_row=i) for i in range(5)], tmp_path / "p.parquet", Problem)
    schemas.shards.forget_validated()
    parsed = read_shard(path, Problem)
    path = write_shard([problem_row(source_row=i) for i in range(5)], tmp_path / "p.parquet", Problem)
    with monkeypatch.context() as patch:
        _no_parquet_parsing(patch)
        fresh = read_shard(path, Problem)
    assert fresh.equals(parsed) and fresh.schema.equals(parsed.schema, check_metadata=True)


def test_a_file_replaced_or_changed_since_this_process_wrote_it_is_parsed_again(tmp_path: Path) -> None:
    path = write_shard([problem_row(source_row=1)], tmp_path / "p.parquet", Problem)
    # Another writer's atomic replace (a new inode): its content is read, not the remembered table.
    other = tmp_path / "other.parquet"
    pq.write_table(read_shard(path, Problem).set_column(2, "source_row", pa.array([7], pa.int64())), other,
                   write_page_checksum=True)
    other.replace(path)
    assert read_shard(path, Problem).column("source_row").to_pylist() == [7]
    # A write into the file (a new mtime) is parsed and its checksums checked.
    path = write_shard([problem_row(source_row=1)], tmp_path / "q.parquet", Problem)
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ShardValidationError, match="q.parquet"):
        read_shard(path, Problem)


def test_tables_kept_are_bounded_by_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(schemas.shards.fresh_tables, "MAX_BYTES", 1)
    path = write_shard([problem_row()], tmp_path / "p.parquet", Problem)
    with monkeypatch.context() as patch:
        _no_parquet_parsing(patch)
        with pytest.raises(AssertionError, match="parsed"):
            read_shard(path, Problem)


def test_another_writers_file_renamed_over_ours_right_after_our_rename_is_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    theirs = write_shard([problem_row(source_row=7)], tmp_path / "theirs.parquet", Problem)
    real_replace = schemas.shards.os.replace

    def replace_then_lose_the_race(src: str, dst: str | Path) -> None:
        real_replace(src, dst)
        real_replace(theirs, dst)  # another process's atomic replace lands right after ours

    monkeypatch.setattr(schemas.shards.os, "replace", replace_then_lose_the_race)
    path = write_shard([problem_row(source_row=1)], tmp_path / "p.parquet", Problem)
    monkeypatch.undo()
    assert read_shard(path, Problem).column("source_row").to_pylist() == [7]


def test_a_shard_whose_folder_was_renamed_after_the_write_is_read_back_without_parsing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A checkpoint's metrics shard is written in a staging folder that is then renamed into place
    # (storage/checkpoints.publish): the file is the same one, only its path changed.
    staged = write_shard([problem_row(source_row=3)], tmp_path / "staging" / "m.parquet", Problem)
    (tmp_path / "staging").rename(tmp_path / "published")
    with monkeypatch.context() as patch:
        _no_parquet_parsing(patch)
        table = read_shard(tmp_path / "published" / "m.parquet", Problem)
    assert table.column("source_row").to_pylist() == [3]
    assert not staged.exists()


def _foreign_shard(path: Path, source_row: int) -> Path:
    """A valid Problem shard written by another process (not through write_shard)."""
    rows = pa.Table.from_pylist([problem_row(source_row=source_row)], schema=arrow_schema(Problem))
    tmp = path.with_name(f".{path.name}.{source_row}.tmp")
    pq.write_table(rows, tmp, write_page_checksum=True)
    tmp.replace(path)
    return path


def test_a_file_read_and_checked_once_is_not_parsed_again_while_it_is_unchanged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _foreign_shard(tmp_path / "train.parquet", 1)
    first = read_shard(path, Problem)  # parsed, checksums and types checked, validated
    with monkeypatch.context() as patch:
        _no_parquet_parsing(patch)
        again = read_shard(path, Problem)
    assert again.equals(first) and again.schema.equals(first.schema, check_metadata=True)
    # Another writer's new file at the path is parsed, and its content returned.
    _foreign_shard(path, 2)
    assert read_shard(path, Problem).column("source_row").to_pylist() == [2]


def test_a_file_replaced_while_it_is_being_read_is_not_remembered_as_the_new_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _foreign_shard(tmp_path / "train.parquet", 1)
    real_parquet_file = schemas.shards.pq.ParquetFile

    def parse_then_lose_the_race(*args: Any, **kwargs: Any) -> Any:
        parsed = real_parquet_file(*args, **kwargs)
        _foreign_shard(path, 2)  # another process's atomic replace lands while we parse the old bytes
        return parsed

    with monkeypatch.context() as patch:
        patch.setattr(schemas.shards.pq, "ParquetFile", parse_then_lose_the_race)
        assert read_shard(path, Problem).column("source_row").to_pylist() == [1]
    assert read_shard(path, Problem).column("source_row").to_pylist() == [2]
