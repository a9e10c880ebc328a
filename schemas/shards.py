"""Atomic, validated Parquet shard I/O: the only way stages read and write their tables.

``write_shard`` conforms the data to the model's exact Arrow schema (``arrow_schema``),
validates it, writes a temp file in the destination folder, fsyncs it and renames it into place:
a reader can never see a partial or unvalidated file under the final name. ``read_shard``
validates again on the way in (exact types, no casting), so a shard written by anything else is
checked at the stage boundary. Validation is a pure function of a file's bytes and its model, so
it runs once per content in a process: bytes this process wrote or already validated as a model
(or that the process that launched it vouched for: ``trust_validated``, by sha256) are read
back with the Parquet and Arrow-schema checks only. The driver runs every task in-process, so a
shard is validated where it is written and not again by each stage that reads it. A validation
runs the model's checks as whole-column pyarrow kernels first (schemas/fast_checks.py, compiled
from the pandera model); pandera runs only on a table they do not pass. Every failure is a
``ShardValidationError`` naming the file, the column and the first offending rows with their
values.

A file this process wrote, or already read and checked, is not parsed again while it is the same
file (a rename, also of a folder above it, keeps it so): ``read_shard`` returns the table it
holds (schemas/fresh_tables.py).

Every data page carries a CRC-32 (``write_page_checksum``) that ``read_shard`` verifies, so
flipped bytes in a shard (bit rot, a bad copy) fail the read naming the file instead of decoding
to plausible wrong values (a log-prob, a reward) that pass the schema.
"""

from __future__ import annotations

import collections
import hashlib
import os
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import pandera.errors
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from schemas import fast_checks, file_identity, fresh_tables
from schemas.disk_space import writing
from schemas.fsync import fsync_folder
from schemas.models import ADDED_COLUMNS, ROW_RULE_COLUMNS, ROW_RULES, arrow_schema

ShardData = pa.Table | pd.DataFrame | list[dict[str, Any]]
_MAX_VALIDATED = 65536  # (sha256, model) pairs remembered; ~100 bytes each
MAX_ROWS_SHOWN = 5


class ShardValidationError(ValueError):
    """A table does not match its model; the message names the file, columns and rows."""

    def __init__(self, where: str, model_name: str, problems: Sequence[str]) -> None:
        self.where = where
        self.model_name = model_name
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{where}: not a valid {model_name} shard:\n{lines}")


# ----------------------------------------------------------------------------- conforming


def _rows_text(rows: list[int], values: list[Any]) -> str:
    shown = ", ".join(f"{r}={v!r}" for r, v in zip(rows[:MAX_ROWS_SHOWN], values[:MAX_ROWS_SHOWN]))
    more = f" (+{len(rows) - MAX_ROWS_SHOWN} more)" if len(rows) > MAX_ROWS_SHOWN else ""
    return f"{len(rows)} row(s): {shown}{more}"


def _same_kind(got: pa.DataType, want: pa.DataType) -> bool:
    """Whether a safe cast from ``got`` to ``want`` is a width change, not a reinterpretation."""
    if pa.types.is_null(got):
        return True
    if pa.types.is_integer(want):
        return pa.types.is_integer(got)
    if pa.types.is_floating(want):
        return pa.types.is_floating(got) or pa.types.is_integer(got)
    if pa.types.is_string(want):
        return pa.types.is_string(got) or pa.types.is_large_string(got)
    if pa.types.is_list(want):
        return (pa.types.is_list(got) or pa.types.is_large_list(got)) and _same_kind(got.value_type, want.value_type)
    return got == want


def _column_from_values(name: str, values: list[Any], field: pa.Field, problems: list[str]) -> pa.Array | None:
    try:
        return pa.array(values, type=field.type, from_pandas=True)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        bad_rows, bad_values = [], []
        for row, value in enumerate(values):
            try:
                pa.array([value], type=field.type, from_pandas=True)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
                bad_rows.append(row)
                bad_values.append(value)
        problems.append(f"column {name!r}: values not convertible to {field.type}: {_rows_text(bad_rows, bad_values)}")
        return None


def _conform(data: ShardData, model: type, where: str) -> pa.Table:
    """Put ``data`` into the model's exact Arrow schema, or raise naming what does not fit."""
    schema = arrow_schema(model)
    problems: list[str] = []
    if isinstance(data, pa.Table):
        present = set(data.column_names)
    elif isinstance(data, pd.DataFrame):
        present = {str(c) for c in data.columns}
    elif isinstance(data, list):
        present = set().union(*(row.keys() for row in data)) if data else set(schema.names)
    else:
        raise TypeError(f"{where}: expected a pyarrow.Table, pandas.DataFrame or list of dicts, got {type(data).__name__}")
    missing = [n for n in schema.names if n not in present]
    extra = sorted(present - set(schema.names))
    if missing:
        problems.append(f"missing column(s): {missing}")
    if extra:
        problems.append(f"unexpected column(s): {extra}")
    if problems:
        raise ShardValidationError(where, model.__name__, problems)

    arrays: list[pa.Array | pa.ChunkedArray] = []
    for field in schema:
        if isinstance(data, pa.Table):
            column = data[field.name]
            if column.type != field.type:
                if not _same_kind(column.type, field.type):
                    problems.append(f"column {field.name!r}: type {column.type}, expected {field.type}")
                    continue
                try:
                    column = column.cast(field.type, safe=True)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                    converted = _column_from_values(field.name, column.to_pylist(), field, problems)
                    if converted is None:
                        continue
                    column = converted
            arrays.append(column)
            continue
        if isinstance(data, pd.DataFrame):
            values = data[field.name].tolist()
        else:
            values = [row.get(field.name) for row in data]
        converted = _column_from_values(field.name, values, field, problems)
        if converted is not None:
            arrays.append(converted)
    if problems:
        raise ShardValidationError(where, model.__name__, problems)
    return pa.Table.from_arrays(arrays, schema=schema)


# ----------------------------------------------------------------------------- validation


def _text_values(column: pa.ChunkedArray) -> list[str | None]:
    try:
        return pc.cast(column, pa.string()).to_pylist()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return [None if v is None else str(v) for v in column.to_pylist()]


def _locate(table: pa.Table, model: type, column: str, check: str, cases: list[Any]) -> str:
    """Describe a failed check, with the offending rows found by re-evaluating it."""
    model_name = model.__name__
    if column == model_name:  # a table-level check
        if check in ROW_RULES:
            ok = pc.fill_null(ROW_RULES[check](table), True).to_pylist()
            rows = [i for i, good in enumerate(ok) if not good]
            shown = [{c: table[c][i].as_py() for c in ROW_RULE_COLUMNS[check]} for i in rows[:MAX_ROWS_SHOWN]]
            return f"row rule {check!r} ({ROW_RULES[check].__doc__}): {_rows_text(rows, shown)}"
        if check == "multiple_fields_uniqueness":
            key_columns = list(model.to_schema().unique or [])
            keys = list(zip(*(table[c].to_pylist() for c in key_columns)))
            counts: dict[tuple[Any, ...], int] = {}
            for key in keys:
                counts[key] = counts.get(key, 0) + 1
            rows = [i for i, key in enumerate(keys) if counts[key] > 1]
            return f"columns {key_columns} must be unique together: {_rows_text(rows, [keys[i] for i in rows])}"
        if check == "column_in_schema":
            return f"unexpected column(s): {cases}"
        if check == "column_in_dataframe":
            return f"missing column(s): {cases}"
        return f"table check {check!r} failed: {cases[:MAX_ROWS_SHOWN]}"
    if check.startswith("dtype("):
        return f"column {column!r}: type {cases[0] if cases else '?'}, expected {check[6:-1]}"
    values = table[column].to_pylist() if column in table.column_names else []
    if check == "not_nullable":
        rows = [i for i, v in enumerate(values) if v is None]
        return f"column {column!r}: nulls not allowed: {_rows_text(rows, [None] * len(rows))}"
    if check == "field_uniqueness":
        seen: dict[Any, int] = {}
        for v in values:
            seen[v] = seen.get(v, 0) + 1
        rows = [i for i, v in enumerate(values) if seen[v] > 1]
        return f"column {column!r}: values must be unique: {_rows_text(rows, [values[i] for i in rows])}"
    failing = {str(c) for c in cases if c is not None}
    texts = _text_values(table[column]) if column in table.column_names else []
    rows = [i for i, t in enumerate(texts) if t is not None and t in failing]
    if not rows:
        return f"column {column!r}: check {check} failed for values {sorted(failing)[:MAX_ROWS_SHOWN]}"
    return f"column {column!r}: check {check} failed: {_rows_text(rows, [values[i] for i in rows])}"


def validate_table(table: pa.Table, model: type, where: str = "<table>") -> pa.Table:
    """Validate ``table`` against ``model`` (all checks, lazily); raise ShardValidationError.

    The model's checks run first as whole-column pyarrow kernels (schemas/fast_checks.py, ~1 ms);
    only a table they do not pass (invalid, or not decided there) goes through pandera, which
    decides and whose failure cases name the columns and rows.
    """
    if fast_checks.passes(table, model):
        return table
    try:
        model.validate(table, lazy=True)
    except pandera.errors.SchemaErrors as err:
        cases = err.failure_cases
        if isinstance(cases, pd.DataFrame):
            cases = pa.Table.from_pandas(cases, preserve_index=False)
        grouped: dict[tuple[str, str], list[Any]] = {}
        for row in cases.to_pylist():
            grouped.setdefault((str(row["column"]), str(row["check"])), []).append(row["failure_case"])
        problems = [_locate(table, model, col, check, vals) for (col, check), vals in grouped.items()]
        raise ShardValidationError(where, model.__name__, problems) from None
    except pandera.errors.SchemaError as err:
        raise ShardValidationError(where, model.__name__, [str(err)]) from None
    return table


# ----------------------------------------------------------------------------- validated content

# (sha256 of a shard's bytes, model) pairs this process validated: the same bytes are valid again.
_validated: collections.OrderedDict[tuple[str, type], None] = collections.OrderedDict()


def _remember(sha256: str, model: type) -> None:
    _validated[(sha256, model)] = None
    _validated.move_to_end((sha256, model))
    while len(_validated) > _MAX_VALIDATED:
        _validated.popitem(last=False)


def trust_validated(sha256s: Iterable[str], model: type) -> None:
    """Treat shards with these exact bytes (sha256, hex) as validated ``model`` shards in this process.

    For a process started by one that validated them (the training workers read the batch the
    train task validated): a file with other bytes is still validated on read.
    """
    for sha in sha256s:
        _remember(sha, model)


def forget_validated() -> None:
    """Forget what this process validated and wrote (tests; the next read of each shard parses
    and validates its file again)."""
    _validated.clear()
    fresh_tables.forget()


def validated_sha256(path: str | Path) -> str:
    """sha256 (hex) of the shard at ``path`` as ``read_shard`` keys its validation (its bytes)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# ----------------------------------------------------------------------------- files


def write_shard(data: ShardData, path: str | Path, model: type) -> Path:
    """Validate ``data`` as ``model`` and write it to ``path`` atomically (temp, fsync, rename).

    The bytes depend only on the rows (no timestamps), so equal inputs give identical files.
    """
    path = Path(path)
    table = validate_table(_conform(data, model, str(path)), model, str(path))
    buffer = pa.BufferOutputStream()
    pq.write_table(table, buffer, compression="zstd", write_page_checksum=True)
    data_bytes = buffer.getvalue()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with writing(path, f"{model.__name__} shard"), os.fdopen(fd, "wb") as handle:
            handle.write(data_bytes)
            handle.flush()
            os.fsync(handle.fileno())
            written = file_identity.identity(os.fstat(handle.fileno()))
        os.chmod(tmp_name, 0o644)  # mkstemp creates 0600; shards are meant to be shared read-only
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    fsync_folder(path.parent)
    _remember(hashlib.sha256(data_bytes).hexdigest(), model)
    fresh_tables.keep(table.combine_chunks().replace_schema_metadata(arrow_schema(model).metadata), model, written)
    return path


def read_shard(path: str | Path, model: type) -> pa.Table:
    """Read one Parquet shard and validate it as ``model`` (exact types, no casting).

    Page checksums and the exact Arrow schema are checked on the first read of a file in this
    process unless this process wrote it; later reads of the unchanged file get the checked table
    back (schemas/fresh_tables.py). The model's checks (pandera) run once per content in this
    process (see the module docstring).
    """
    path = Path(path)
    fresh = fresh_tables.recall(path, model)
    if fresh is not None:
        return fresh
    seen = file_identity.identity_of(path)
    try:
        # Arrow-owned bytes and a plain Parquet reader, never Python bytes inside a dataset scan:
        # a scan's pool thread can drop the last reference after the table is returned, and
        # freeing a Python buffer there takes the GIL; if the interpreter is exiting by then,
        # the process aborts ("terminate called without an active exception", seen under load).
        with pa.OSFile(str(path)) as source:
            data = source.read_buffer()
        table = pq.ParquetFile(pa.BufferReader(data), page_checksum_verification=True).read()
    except (OSError, pa.ArrowException) as err:
        raise ShardValidationError(str(path), model.__name__, [f"cannot read Parquet: {err}"]) from None
    schema = arrow_schema(model)
    problems = []
    table = _with_added_columns(table, model)
    missing = [n for n in schema.names if n not in table.column_names]
    extra = [n for n in table.column_names if n not in schema.names]
    if missing:
        problems.append(f"missing column(s): {missing}")
    if extra:
        problems.append(f"unexpected column(s): {extra}")
    for field in schema:
        if field.name in table.column_names and table[field.name].type != field.type:
            problems.append(f"column {field.name!r}: type {table[field.name].type}, expected {field.type}")
    if problems:
        raise ShardValidationError(str(path), model.__name__, problems)
    table = table.select(schema.names).replace_schema_metadata(schema.metadata)
    sha256 = hashlib.sha256(memoryview(data)).hexdigest()
    if (sha256, model) in _validated:
        _validated.move_to_end((sha256, model))
    else:
        validate_table(table, model, str(path))
        _remember(sha256, model)
    if seen is not None and file_identity.identity_of(path) == seen:  # not replaced while read
        fresh_tables.keep(table, model, seen)
    return table


def _with_added_columns(table: pa.Table, model: type) -> pa.Table:
    """``table`` with nulls in the columns ``model`` gained after it was written (``ADDED_COLUMNS``)
    and it lacks; every other column as it is."""
    schema = arrow_schema(model)
    for name in ADDED_COLUMNS.get(model.__name__, ()):
        if name not in table.column_names:
            table = table.append_column(schema.field(name), pa.nulls(table.num_rows, schema.field(name).type))
    return table


def shard_paths(folder_or_paths: str | Path | Iterable[str | Path]) -> list[Path]:
    """The shards to read: a folder's ``*.parquet`` files (sorted, hidden temp files skipped),
    or the given paths in order."""
    if isinstance(folder_or_paths, (str, Path)) and Path(folder_or_paths).is_dir():
        folder = Path(folder_or_paths)
        paths = sorted(p for p in folder.glob("*.parquet") if not p.name.startswith("."))
        if not paths:
            raise FileNotFoundError(f"{folder}: no *.parquet shards in this folder")
        return paths
    if isinstance(folder_or_paths, (str, Path)):
        return [Path(folder_or_paths)]
    return [Path(p) for p in folder_or_paths]


def read_shards(folder_or_paths: str | Path | Iterable[str | Path], model: type) -> pa.Table:
    """Read and validate several shards (a folder or a list of paths) into one table."""
    tables = [read_shard(p, model) for p in shard_paths(folder_or_paths)]
    if not tables:
        return arrow_schema(model).empty_table()
    return pa.concat_tables(tables)
