"""Source readers for the curation stage: raw problem files into uniform ``RawRecord``s.

An input is named by a spec string (``parse_input_spec``):

- ``PATH.parquet`` / ``PATH.jsonl`` - a file in one of the layouts below, detected from its columns;
- ``hf:NAME_OR_PATH`` - a Hugging Face ``datasets`` data set (a ``save_to_disk`` folder or a local
  loading script/data folder; offline, nothing is downloaded), one source per split;
- ``synthetic:n=2000,seed=0,min_terms=2,max_terms=5,max_operand=50[,test_fraction=0.1]`` -
  arithmetic problems from ``readers/synthetic.py``;
- any of the above followed by ``@train`` or ``@test`` forces the split of all its rows.

Layouts: verl/DAPO (``prompt`` chat messages + ``reward_model.ground_truth``; the bare problem is
``extra_info.raw_problem`` when present, else the last user message, unwrapped from the DAPO
template if it is wrapped), GSM8K raw (``question`` + ``answer`` ending ``#### N``) and MATH-style
(``problem`` + ``answer`` and/or ``solution`` with ``\\boxed{}``).

A problem with one row (undecodable text, wrong cell type, malformed JSON line) becomes a
RawRecord carrying an error code, so the stage can reject it and go on; a problem with the whole
file (missing, a folder, a symlink loop, gzip-compressed, unreadable/truncated, empty, unknown
layout, wrong column types) raises ``CurationError`` naming the file, before any row is read.
"""

from __future__ import annotations

import errno
import json
import os
import random
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from dapo_core.answers import extract_boxed, extract_gsm8k_answer, unwrap_prompt
from readers.synthetic import make_problem
from storage import run_store

SPLIT_SUFFIXES = ("@train", "@test")
ACCEPTED_INPUTS = ("inputs are .parquet, .jsonl or .json (JSON lines) files, hf:PATH (a Hugging Face data set "
                   "folder, or a folder of data files) or synthetic:...")
HF_SAVED_MARKERS = ("dataset_info.json", "dataset_dict.json", "state.json")
"""Files of a ``datasets`` ``save_to_disk`` folder (any one marks it)."""
GZIP_MAGIC = b"\x1f\x8b"


class CurationError(RuntimeError):
    """A whole input cannot be curated (unreadable, empty, unknown layout, wrong column types)."""


class _MissingAnswer(ValueError):
    """The row has a solution but no final answer in it (no '#### N', no \\boxed{})."""


@dataclass(frozen=True)
class RawRecord:
    """One source row, before integer conversion.

    ``error_code`` (a key of dapo_core.answers.REASON_CODES) is set when the row itself could not
    be read; ``problem`` / ``answer`` then hold whatever could be read (or None).
    """

    source: str
    source_row: int
    problem: str | None
    answer: str | None
    split: str | None = None
    error_code: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class InputSpec:
    """A parsed input spec: ``kind`` is ``file``, ``hf`` or ``synthetic``."""

    kind: str
    target: str
    split: str | None = None
    options: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SourceRecords:
    """The rows of one source; ``test_fraction`` overrides the run's for unsplit rows."""

    source: str
    records: list[RawRecord]
    test_fraction: float | None = None


def split_suffix(spec: str) -> tuple[str, str | None]:
    """``(the source, "train" / "test" / None)`` of an input spec: its ``@train|@test`` suffix apart
    (a path may hold "@" elsewhere)."""
    for suffix in SPLIT_SUFFIXES:
        if spec.endswith(suffix):
            return spec[: -len(suffix)], suffix[1:]
    return spec, None


def parse_input_spec(spec: str) -> InputSpec:
    """Parse ``PATH``, ``hf:NAME``, ``synthetic:k=v,...``, each optionally ending ``@train|@test``."""
    spec, split = split_suffix(spec)
    if spec.startswith("synthetic:") or spec == "synthetic":
        options: dict[str, str] = {}
        body = spec.partition(":")[2]
        for item in filter(None, (part.strip() for part in body.split(","))):
            key, eq, value = item.partition("=")
            if not eq:
                raise CurationError(f"input {spec!r}: synthetic option {item!r} is not key=value")
            options[key.strip()] = value.strip()
        return InputSpec("synthetic", "synthetic", split, options)
    if spec.startswith("hf:"):
        return InputSpec("hf", spec[3:], split)
    return InputSpec("file", spec, split)


def read_input(spec: str | InputSpec) -> list[SourceRecords]:
    """Read one input spec into one or more sources (an HF DatasetDict gives one per split)."""
    parsed = parse_input_spec(spec) if isinstance(spec, str) else spec
    if parsed.kind == "synthetic":
        return [read_synthetic(parsed)]
    if parsed.kind == "hf":
        return read_hf_dataset(parsed)
    return [read_file(parsed)]


# ----------------------------------------------------------------------------- synthetic

_SYNTHETIC_DEFAULTS = {"n": "2000", "seed": "0", "min_terms": "2", "max_terms": "5", "max_operand": "50"}


def read_synthetic(spec: InputSpec) -> SourceRecords:
    """``n`` arithmetic problems from readers/synthetic.py, drawn with ``random.Random(seed)``."""
    unknown = set(spec.options) - set(_SYNTHETIC_DEFAULTS) - {"test_fraction"}
    if unknown:
        raise CurationError(f"input synthetic: unknown option(s) {sorted(unknown)}; known: {sorted(_SYNTHETIC_DEFAULTS)} + test_fraction")
    opts: dict[str, int] = {}
    for key, default in _SYNTHETIC_DEFAULTS.items():
        try:
            opts[key] = int(spec.options.get(key, default))
        except ValueError:
            raise CurationError(f"input synthetic: {key}={spec.options[key]!r} is not an integer") from None
    test_fraction = _synthetic_test_fraction(spec)
    rng = random.Random(opts["seed"])
    records = []
    for row in range(opts["n"]):
        try:
            text, answer = make_problem(
                rng, min_terms=opts["min_terms"], max_terms=opts["max_terms"], max_operand=opts["max_operand"]
            )
        except ValueError as err:
            raise CurationError(f"input synthetic: {err}") from None
        records.append(RawRecord("synthetic", row, text, str(answer), spec.split))
    return SourceRecords("synthetic", records, test_fraction)


def _synthetic_test_fraction(spec: InputSpec) -> float | None:
    """A synthetic input's own ``test_fraction`` option (None when it sets none)."""
    if "test_fraction" not in spec.options:
        return None
    try:
        return float(spec.options["test_fraction"])
    except ValueError:
        raise CurationError(f"input synthetic: test_fraction={spec.options['test_fraction']!r} is not a number") from None


def gives_test_split(specs: Sequence[str], test_fraction: float) -> bool:
    """Whether curating ``specs`` with the run's ``test_fraction`` puts any problem in the test split,
    decided from the specs alone, without reading an input (an ``hf:`` data set may hold a test
    split: assumed so). Raises ``CurationError`` for a spec that cannot be parsed."""
    if test_fraction > 0:
        return True
    for spec in specs:
        parsed = parse_input_spec(spec)
        if parsed.split == "test" or parsed.kind == "hf":
            return True
        if parsed.split is None and parsed.kind == "synthetic" and (_synthetic_test_fraction(parsed) or 0) > 0:
            return True
    return False


# ----------------------------------------------------------------------------- files


def read_file(spec: InputSpec) -> SourceRecords:
    """Read a Parquet or JSONL file; the source name is the file name."""
    path, where = Path(spec.target), str(Path(spec.target))
    if run_store.is_remote(spec.target):
        where = spec.target
        try:
            path = run_store.fetch(spec.target)  # a local copy; the records still name the URI
        except FileNotFoundError as err:
            raise CurationError(str(err)) from None
    _check_input_file(path, where)
    if path.suffix in (".jsonl", ".json"):
        rows, columns = _read_jsonl(path)
        return SourceRecords(path.name, records_from_rows(rows, columns, path.name, where, spec.split))
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as err:
        if path.suffix != ".parquet":  # read as Parquet whatever its name, and named as what it is when it is not
            raise CurationError(f"{where}: unknown file type {path.suffix or '(no suffix)'!r}; {ACCEPTED_INPUTS}") from None
        raise CurationError(f"{where}: cannot read as Parquet (truncated or not Parquet?): {err}") from None
    return SourceRecords(path.name, records_from_table(table, path.name, where, spec.split))


def _path_error(where: str, err: OSError) -> CurationError:
    """The one-line error of an input path that cannot be opened: a symlink loop, a missing file
    (with a hint when it ends in a split suffix that is not one), or what the system said."""
    if err.errno == errno.ELOOP:
        return CurationError(f"{where}: symbolic link loop (ELOOP); point the link at the data file")
    if err.errno in (errno.ENOENT, errno.ENOTDIR):
        at = where.rfind("@")
        hint = f" (a split suffix is {' or '.join(SPLIT_SUFFIXES)}, not {where[at:]!r})" if at > where.rfind("/") else ""
        return CurationError(f"{where}: no such file{hint}")
    return CurationError(f"{where}: cannot read: {err.strerror or err}")


def _check_input_file(path: Path, where: str) -> None:
    """Refuse, naming ``where``, an input path that is not a non-empty, readable, uncompressed file:
    a folder (pointed to ``hf:`` when it holds a data set), a symlink loop, a missing file, a gzip file
    (its bytes would read as undecodable rows or as an unknown layout)."""
    try:
        info = path.stat()  # follows links: a loop is ELOOP, a dangling link ENOENT
        if stat.S_ISDIR(info.st_mode):
            if is_saved_hf_folder(path):
                raise CurationError(f"{where}: is a directory holding a Hugging Face data set; give it as hf:{where}")
            raise CurationError(f"{where}: is a directory, not a file; {ACCEPTED_INPUTS.replace('hf:PATH', f'hf:{where}', 1)}")
        if not stat.S_ISREG(info.st_mode):
            raise CurationError(f"{where}: is not a regular file; {ACCEPTED_INPUTS}")
        if info.st_size == 0:
            raise CurationError(f"{where}: empty file")
        with path.open("rb") as handle:
            magic = handle.read(len(GZIP_MAGIC))
    except OSError as err:
        raise _path_error(where, err) from None
    if magic == GZIP_MAGIC:
        raise CurationError(f"{where}: is gzip-compressed; decompress it first (e.g. gunzip -k) and give the "
                            ".parquet or .jsonl file it holds")


def _read_jsonl(path: Path) -> tuple[list[dict[str, Any] | tuple[str, str]], list[str]]:
    """JSON lines as dicts; a bad line becomes ``(error_code, message)`` instead of failing."""
    rows: list[dict[str, Any] | tuple[str, str]] = []
    columns: dict[str, None] = {}
    with path.open("rb") as handle:
        for line_no, raw in enumerate(handle):
            if not raw.strip():
                rows.append(("unparseable", f"line {line_no + 1} is blank"))
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                rows.append(("bad_encoding", f"line {line_no + 1} is not UTF-8: {err}"))
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as err:
                rows.append(("unparseable", f"line {line_no + 1} is not JSON: {err}"))
                continue
            if not isinstance(obj, dict):
                rows.append(("unparseable", f"line {line_no + 1} is a JSON {type(obj).__name__}, not an object"))
                continue
            columns.update(dict.fromkeys(obj))
            rows.append(obj)
    return rows, list(columns)


# ----------------------------------------------------------------------------- HF datasets


def read_hf_dataset(spec: InputSpec) -> list[SourceRecords]:
    """A local ``datasets`` data set (saved folder or loadable path), offline, one source per split."""
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # never reach for the hub
    import datasets

    target = spec.target
    if os.path.lexists(target):  # a local path (else a name for datasets to resolve): a broken link says so
        try:
            Path(target).stat()
        except OSError as err:
            raise _path_error(f"hf:{target}", err) from None
    name = Path(target).name if Path(target).exists() else target
    try:
        if is_saved_hf_folder(Path(target)):
            loaded = datasets.load_from_disk(target)
        else:
            loaded = datasets.load_dataset(target)
    except Exception as err:  # datasets raises many types; all mean "cannot load this input"
        raise CurationError(f"hf:{target}: cannot load data set offline: {type(err).__name__}: {err}") from None
    splits = loaded.items() if isinstance(loaded, datasets.DatasetDict) else [(None, loaded)]
    sources = []
    for split_name, dataset in sorted(splits, key=lambda item: item[0] or ""):
        source = f"hf:{name}" + (f"/{split_name}" if split_name else "")
        table = (dataset.flatten_indices() if dataset._indices is not None else dataset).data.table
        split = spec.split or split_name
        sources.append(SourceRecords(source, records_from_table(table, source, f"hf:{target}", split)))
    return sources


def is_saved_hf_folder(path: Path) -> bool:
    """Whether ``path`` is a folder written by ``datasets``' ``save_to_disk``."""
    return path.is_dir() and any((path / marker).exists() for marker in HF_SAVED_MARKERS)


# ----------------------------------------------------------------------------- layouts

_STRINGISH = (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary, pa.types.is_large_binary)


def _is_text(t: pa.DataType) -> bool:
    return any(check(t) for check in _STRINGISH)


def _is_answerish(t: pa.DataType) -> bool:
    return _is_text(t) or pa.types.is_integer(t) or pa.types.is_null(t)


def detect_layout(columns: list[str]) -> str | None:
    """``verl``, ``gsm8k`` or ``math`` from the column names, or None."""
    names = set(columns)
    if {"prompt", "reward_model"} <= names:
        return "verl"
    if {"question", "answer"} <= names:
        return "gsm8k"
    if "problem" in names and names & {"answer", "solution"}:
        return "math"
    return None


def _unknown_layout(where: str, columns: list[str]) -> CurationError:
    return CurationError(
        f"{where}: unknown layout, columns {columns}; expected verl/DAPO (prompt, reward_model), "
        "GSM8K (question, answer) or MATH-style (problem + answer and/or solution)"
    )


def _check_column_types(table: pa.Table, layout: str, where: str) -> None:
    """Whole-file type errors (a number where text belongs, ...) name the file and column."""
    schema = table.schema

    def bad(column: str, expected: str) -> CurationError:
        return CurationError(f"{where}: column {column!r} has type {schema.field(column).type}, expected {expected}")

    if layout == "verl":
        prompt_t = schema.field("prompt").type
        ok = _is_text(prompt_t) or (
            pa.types.is_list(prompt_t)
            and pa.types.is_struct(prompt_t.value_type)
            and prompt_t.value_type.get_field_index("content") >= 0
        )
        if not ok:
            raise bad("prompt", "chat messages list<struct<content: string, role: string>> or string")
        rm_t = schema.field("reward_model").type
        if not (pa.types.is_struct(rm_t) and rm_t.get_field_index("ground_truth") >= 0):
            raise bad("reward_model", "struct with a ground_truth field")
        if not _is_answerish(rm_t.field("ground_truth").type):
            raise bad("reward_model", "ground_truth of type string (or integer)")
        if "extra_info" in schema.names and not (pa.types.is_struct(schema.field("extra_info").type) or pa.types.is_null(schema.field("extra_info").type)):
            raise bad("extra_info", "struct")
    elif layout == "gsm8k":
        for column in ("question", "answer"):
            if not (_is_text(schema.field(column).type) or pa.types.is_null(schema.field(column).type)):
                raise bad(column, "string")
    else:
        for column in ("problem", "solution"):
            if column in schema.names and not (_is_text(schema.field(column).type) or pa.types.is_null(schema.field(column).type)):
                raise bad(column, "string")
        if "answer" in schema.names and not _is_answerish(schema.field("answer").type):
            raise bad("answer", "string (or integer)")


def _table_rows(table: pa.Table) -> Iterator[dict[str, Any] | tuple[str, str]]:
    """Rows as dicts; a row whose text is not valid UTF-8 becomes ``("bad_encoding", message)``."""
    batch_size = 4096
    for start in range(0, table.num_rows, batch_size):
        chunk = table.slice(start, batch_size)
        try:
            yield from chunk.to_pylist()
        except UnicodeDecodeError:
            for offset in range(chunk.num_rows):
                try:
                    yield chunk.slice(offset, 1).to_pylist()[0]
                except UnicodeDecodeError as err:
                    yield ("bad_encoding", f"row {start + offset} has text that is not UTF-8: {err}")


def records_from_table(table: pa.Table, source: str, where: str, split: str | None) -> list[RawRecord]:
    """Detect the layout of an Arrow table, check its column types, and read every row."""
    layout = detect_layout(table.column_names)
    if layout is None:
        raise _unknown_layout(where, table.column_names)
    _check_column_types(table, layout, where)
    return records_from_rows(_table_rows(table), table.column_names, source, where, split)


def records_from_rows(
    rows: Any, columns: list[str], source: str, where: str, split: str | None
) -> list[RawRecord]:
    """Read rows (dicts, or ``(error_code, message)`` for rows that could not be decoded)."""
    layout = detect_layout(columns)
    if layout is None:
        raise _unknown_layout(where, columns)
    extract = {"verl": _verl_row, "gsm8k": _gsm8k_row, "math": _math_row}[layout]
    records = []
    for row_index, row in enumerate(rows):
        if isinstance(row, tuple):
            records.append(RawRecord(source, row_index, None, None, split, row[0], row[1]))
            continue
        try:
            problem, answer = extract(row)
        except _MissingAnswer as err:
            problem = row.get("question", row.get("problem"))
            problem = problem if isinstance(problem, str) else None
            records.append(RawRecord(source, row_index, problem, None, split, "missing_answer", f"row {row_index}: {err}"))
            continue
        except UnicodeDecodeError as err:
            records.append(RawRecord(source, row_index, None, None, split, "bad_encoding", f"row {row_index}: text is not UTF-8: {err}"))
            continue
        except (TypeError, KeyError, AttributeError, IndexError, ValueError) as err:
            records.append(RawRecord(source, row_index, None, None, split, "unparseable", f"row {row_index}: {type(err).__name__}: {err}"))
            continue
        records.append(RawRecord(source, row_index, problem, answer, split))
    return records


def _text(value: Any, what: str) -> str | None:
    """A text cell: str as is, bytes decoded strictly as UTF-8, None kept; anything else is an error."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8")
    raise TypeError(f"{what} is a {type(value).__name__}, expected text")


def _answer_text(value: Any, what: str) -> str | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return _text(value, what)


def _verl_row(row: dict[str, Any]) -> tuple[str | None, str | None]:
    extra = row.get("extra_info") or {}
    if not isinstance(extra, dict):
        raise TypeError(f"extra_info is a {type(extra).__name__}, expected a struct")
    problem = _text(extra.get("raw_problem"), "extra_info.raw_problem")
    if not problem:
        prompt = row["prompt"]
        if isinstance(prompt, list):
            user = [m for m in prompt if isinstance(m, dict) and m.get("role", "user") == "user"]
            prompt_text = _text(user[-1].get("content"), "prompt content") if user else None
        else:
            prompt_text = _text(prompt, "prompt")
        problem = prompt_text if prompt_text is None else (unwrap_prompt(prompt_text) or prompt_text)
    reward_model = row["reward_model"]
    if not isinstance(reward_model, dict):
        raise TypeError(f"reward_model is a {type(reward_model).__name__}, expected a struct")
    return problem, _answer_text(reward_model.get("ground_truth"), "reward_model.ground_truth")


def _gsm8k_row(row: dict[str, Any]) -> tuple[str | None, str | None]:
    solution = _answer_text(row["answer"], "answer")
    if solution is None:
        return _text(row["question"], "question"), None
    final = extract_gsm8k_answer(solution)
    if final is None:
        raise _MissingAnswer("GSM8K answer has no '#### N' final line")
    return _text(row["question"], "question"), final


def _math_row(row: dict[str, Any]) -> tuple[str | None, str | None]:
    answer = _answer_text(row.get("answer"), "answer")
    if answer is None or not answer.strip():
        solution = _text(row.get("solution"), "solution")
        answer = extract_boxed(solution) if solution else None
        if answer is None and solution:
            raise _MissingAnswer("solution has no \\boxed{} answer")
    return _text(row["problem"], "problem"), answer
