"""``dapo audit RUN``: ask a run folder questions in SQL (DuckDB) over named views of its shards.

The views (``samples``, ``batches``, ``surplus``, ``problems``, ``rejected``, ``steps``,
``checkpoints``, ``eval``) are defined in storage/run_views.py and read the Parquet shards in place.
``--views`` (the default) lists them with their columns; ``--sql "SELECT ..."`` runs a query and
prints a table, or with ``--json`` one JSON document (``{"columns": [...], "rows": [{...}, ...]}``).
docs/LINEAGE.md has recipes. A folder that is no run, or SQL DuckDB refuses: one line, exit 2.
"""

from __future__ import annotations

import argparse
import datetime
import decimal
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import duckdb

from storage import run_lookup, run_views
from workflows import json_output
from workflows.exit_codes import BAD_INPUT, OK

MAX_CELL_CHARS = 60  # a table cell longer than this is cut (with "..."); --json prints every value whole
VIEWS_TEXT_WIDTH = 100  # `--views` wraps its lines at this width


class LineageError(LookupError):
    """The run folder does not hold what was asked for (the message says where it looked)."""


def display_names(text: str, run: str, run_root: str) -> str:
    """``text`` with the local records copy of an object-store run (storage/run_lookup.py:
    local_run_folder) named by its URI again."""
    if "://" not in run + run_root:
        return text
    from storage import run_store

    for candidate in [run.rstrip("/"), run_store.join(run_root, run)]:
        if run_store.is_remote(candidate):
            text = text.replace(str(run_lookup.records_copy(candidate)), candidate)
    return text


@dataclass(frozen=True)
class QueryResult:
    """A query's answer: column names (made unique) and rows of plain Python values."""

    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]


def run_query(con: duckdb.DuckDBPyConnection, sql: str) -> QueryResult:
    """Run ``sql`` (its last statement's rows are the answer; none for a statement without rows)."""
    cursor = con.execute(sql)
    if cursor.description is None:
        return QueryResult((), ())
    return QueryResult(_unique([d[0] for d in cursor.description]), tuple(cursor.fetchall()))


def _unique(names: Sequence[str]) -> tuple[str, ...]:
    """``names`` with a repeated name suffixed ``_2``, ``_3``... (``SELECT a.step, b.step``): JSON keys must differ."""
    seen: dict[str, int] = {}
    out = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}_{seen[name]}")
    return tuple(out)


def as_json(result: QueryResult) -> str:
    """One JSON document: ``{"columns": [...], "rows": [{column: value}, ...]}``."""
    rows = [{name: _json_value(value) for name, value in zip(result.columns, row)} for row in result.rows]
    return json_output.dumps_readable({"columns": list(result.columns), "rows": rows})


def _json_value(value: Any) -> Any:
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, (datetime.date, datetime.time, datetime.timedelta)):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    return value


def as_table(result: QueryResult) -> str:
    """A plain text table: a header, a rule, one line per row (numbers right-aligned), then the row count."""
    if not result.columns:
        return "(no rows: the statement returns none)"
    cells = [[_cell(v) for v in row] for row in result.rows]
    widths = [max([len(name), *(len(r[i]) for r in cells)]) for i, name in enumerate(result.columns)]
    numeric = [bool(result.rows) and all(_is_number(row[i]) or row[i] is None for row in result.rows)
               for i in range(len(result.columns))]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)).rstrip()

    lines = [line(result.columns), "  ".join("-" * w for w in widths), *(line(r) for r in cells)]
    lines.append(f"({len(result.rows)} row{'' if len(result.rows) == 1 else 's'})")
    return "\n".join(lines)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, decimal.Decimal)) and not isinstance(value, bool)


def _cell(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    text = f"{value:.6g}" if isinstance(value, float) else str(value)
    text = text.replace("\n", "\\n")
    return text if len(text) <= MAX_CELL_CHARS else text[:MAX_CELL_CHARS - 3] + "..."


def views_text(views: Sequence[run_views.ViewColumns]) -> str:
    """Each view: its name, what a row is, and its columns with their types."""
    blocks = []
    for view in views:
        heading = textwrap.fill(f"{view.name}: {view.row}", VIEWS_TEXT_WIDTH, subsequent_indent="  ")
        blocks.append("\n".join([heading, *_wrapped([f"{c.name} {c.type}" for c in view.columns], "    ")]))
    return "\n\n".join(blocks)


def _wrapped(items: Sequence[str], indent: str) -> list[str]:
    """``items`` joined by commas into lines of at most VIEWS_TEXT_WIDTH, never splitting an item."""
    lines = [indent]
    for i, item in enumerate(items):
        piece = item + ("," if i < len(items) - 1 else "")
        if lines[-1].strip() and len(lines[-1]) + 1 + len(piece) > VIEWS_TEXT_WIDTH:
            lines.append(indent)
        lines[-1] += ("" if not lines[-1].strip() else " ") + piece
    return lines


def views_json(views: Sequence[run_views.ViewColumns]) -> str:
    return json_output.dumps_readable({v.name: {"row": v.row, "columns": {c.name: c.type for c in v.columns}}
                                       for v in views})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="run folder (a path or an object-store URI), or a run name under --run-root")
    parser.add_argument("--run-root", default="runs", help="where run names are looked up (default: %(default)s)")
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--sql", metavar="QUERY", help="run a query over the views (docs/LINEAGE.md has recipes)")
    what.add_argument("--views", action="store_true", help="list the views and their columns (the default)")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of a table")


def run_cli(args: argparse.Namespace) -> int:
    try:
        con = run_views.open_run(run_lookup.local_run_folder(args.run, args.run_root))
        if args.sql is None:
            views = run_views.describe(con)
            print(views_json(views) if args.json else views_text(views))
            return OK
        result = run_query(con, args.sql)
    except (LineageError, run_lookup.RunNotFound, duckdb.Error) as err:
        line = _first_line(err) if isinstance(err, duckdb.Error) else str(err)
        print(display_names(f"dapo audit: error: {line}", args.run, args.run_root), file=sys.stderr)
        return BAD_INPUT
    print(as_json(result) if args.json else as_table(result))
    return OK


def _first_line(err: Exception) -> str:
    """DuckDB's message in one line: its first (the later ones point a caret at the query text)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__


__all__ = ["run_query", "as_table", "as_json", "QueryResult", "LineageError"]
