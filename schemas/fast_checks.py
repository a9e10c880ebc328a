"""The checks a pandera model declares, compiled once into whole-column ``pyarrow.compute`` calls.

pandera validates through narwhals at ~40-60 ms a shard, mostly fixed per-check overhead; the
same checks over whole columns cost ~1 ms. :func:`passes` answers "does ``table`` keep every check
of ``model``?" from a plan read off ``model.to_schema()``, so each setting stays declared once, in
schemas/models.py. A model with a setting outside the plan gets no plan and ``passes`` answers
False; it never raises, and False sends the caller (schemas/shards.py: validate_table) to pandera,
whose failure cases name the rows. tests/unit/test_fast_checks.py checks it agrees with pandera.

Design notes (which checks compile, and how): docs/ARCHITECTURE.md,
"Fast schema checks (schemas/fast_checks.py)".
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from schemas.models import ROW_RULE_COLUMNS, ROW_RULES, arrow_schema, rule_passes

# A column check: (column, its pandera statistics) -> one boolean per row, null = not decided
# (passes: pandera's ignore_na). Each is the pyarrow kernel narwhals' pyarrow backend runs for
# pandera's built-in check of that name (pandera/backends/narwhals/builtin_checks.py).
ColumnKernel = Callable[..., pa.ChunkedArray]


def _in_range(col: pa.ChunkedArray, min_value: Any, max_value: Any, include_min: bool = True,
              include_max: bool = True) -> pa.ChunkedArray:
    low = (pc.greater_equal if include_min else pc.greater)(col, min_value)
    high = (pc.less_equal if include_max else pc.less)(col, max_value)
    return pc.and_kleene(low, high)


def _is_in(col: pa.ChunkedArray, allowed_values: Any) -> pa.ChunkedArray:
    # narwhals: pc.is_in over pa.array(values), and null where the input is null
    return pc.if_else(pc.is_null(col), None, pc.is_in(col, value_set=pa.array(list(allowed_values))))


def _str_length(col: pa.ChunkedArray, min_value: int | None = None, max_value: int | None = None,
                exact_value: int | None = None) -> pa.ChunkedArray:
    n_chars = pc.utf8_length(col)
    if exact_value is not None:
        return pc.equal(n_chars, exact_value)
    if min_value is None and max_value is None:
        raise ValueError("str_length needs min_value or max_value")
    if min_value is None:
        return pc.less_equal(n_chars, max_value)
    if max_value is None:
        return pc.greater_equal(n_chars, min_value)
    return _in_range(n_chars, min_value, max_value)


def _str_matches(col: pa.ChunkedArray, pattern: Any) -> pa.ChunkedArray:
    pattern = getattr(pattern, "pattern", pattern)
    return pc.match_substring_regex(col, pattern if pattern.startswith("^") else f"^{pattern}")


COLUMN_KERNELS: dict[str, ColumnKernel] = {
    "equal_to": lambda col, value: pc.equal(col, value),
    "not_equal_to": lambda col, value: pc.not_equal(col, value),
    "greater_than": lambda col, min_value: pc.greater(col, min_value),
    "greater_than_or_equal_to": lambda col, min_value: pc.greater_equal(col, min_value),
    "less_than": lambda col, max_value: pc.less(col, max_value),
    "less_than_or_equal_to": lambda col, max_value: pc.less_equal(col, max_value),
    "in_range": _in_range,
    "isin": _is_in,
    "notin": lambda col, forbidden_values: pc.invert(_is_in(col, forbidden_values)),
    "str_matches": _str_matches,
    "str_contains": lambda col, pattern: pc.match_substring_regex(col, getattr(pattern, "pattern", pattern)),
    "str_startswith": lambda col, string: pc.starts_with(col, string),
    "str_endswith": lambda col, string: pc.ends_with(col, string),
    "str_length": _str_length,
}


@dataclass(frozen=True)
class ColumnPlan:
    """What one column of a model must satisfy."""

    name: str
    type: pa.DataType  # the exact Arrow type
    required: bool  # absent is an error (pandera: ``required``; an ``Optional`` field may be absent)
    nullable: bool  # nulls (and NaN in a float column) allowed
    unique: bool
    checks: tuple[tuple[str, ColumnKernel, dict[str, Any]], ...]  # (pandera check name, kernel, statistics)


@dataclass(frozen=True)
class ModelPlan:
    """A model's checks, read off its pandera schema once."""

    columns: tuple[ColumnPlan, ...]
    strict: bool  # no column outside the model
    unique_sets: tuple[tuple[str, ...], ...]  # column sets unique together
    row_rules: tuple[str, ...]  # keys of ROW_RULES, one per dataframe check


def _settings_outside_plan(schema: Any) -> list[str]:
    """Schema-level settings a plan does not cover (a plan is then not made)."""
    outside = []
    for attr, covered in (("coerce", False), ("ordered", False), ("add_missing_columns", False),
                          ("drop_invalid_rows", False), ("unique_column_names", False)):
        if getattr(schema, attr, covered) != covered:
            outside.append(attr)
    if getattr(schema, "strict", False) not in (True, False):
        outside.append("strict")  # "filter" drops columns
    if getattr(schema, "parsers", None) or getattr(schema, "index", None) is not None:
        outside.append("parsers/index")
    return outside


@functools.cache
def plan(model: type) -> ModelPlan | None:
    """The model's checks as a :class:`ModelPlan`, or None when one of its settings has no kernel here."""
    schema = model.to_schema()
    if _settings_outside_plan(schema):
        return None
    types = arrow_schema(model)
    columns = []
    for name, column in schema.columns.items():
        if (column.regex or column.coerce or getattr(column, "default", None) is not None
                or getattr(column, "parsers", None) or name not in types.names):
            return None
        checks = []
        for check in column.checks:
            kernel = COLUMN_KERNELS.get(check.name)
            if kernel is None or not check.ignore_na or check.element_wise or check.groupby is not None:
                return None
            checks.append((check.name, kernel, dict(check.statistics)))
        columns.append(ColumnPlan(name=name, type=types.field(name).type, required=bool(column.required),
                                  nullable=bool(column.nullable), unique=bool(column.unique), checks=tuple(checks)))
    unique = schema.unique or []
    unique_sets = [tuple(unique)] if all(isinstance(u, str) for u in unique) else [tuple(u) for u in unique]
    rules = []
    for check in schema.checks:
        if check.name not in ROW_RULES or check.name not in ROW_RULE_COLUMNS or check.groupby is not None:
            return None
        rules.append(check.name)
    return ModelPlan(columns=tuple(columns), strict=bool(schema.strict),
                     unique_sets=tuple(u for u in unique_sets if u), row_rules=tuple(rules))


def _has_null(col: pa.ChunkedArray) -> bool:
    if col.null_count:
        return True
    if pa.types.is_floating(col.type):
        return bool(pc.any(pc.is_nan(col)).as_py())
    return False


def _all_distinct(table: pa.Table, names: tuple[str, ...]) -> bool:
    if table.num_rows < 2:
        return True
    if len(names) == 1:
        return pc.count_distinct(table[names[0]], mode="all").as_py() == table.num_rows
    return table.group_by(list(names)).aggregate([]).num_rows == table.num_rows


def _column_ok(table: pa.Table, column: ColumnPlan) -> bool:
    col = table[column.name]
    if col.type != column.type:
        return False
    if not column.nullable and _has_null(col):
        return False
    if column.unique and not _all_distinct(table, (column.name,)):
        return False
    for _, kernel, statistics in column.checks:
        if pc.all(pc.fill_null(kernel(col, **statistics), True)).as_py() is False:
            return False
    return True


def passes(table: pa.Table, model: type) -> bool:
    """True when ``table`` keeps every check ``model`` declares; False when it breaks one, or when
    this module cannot decide (no plan for the model, a column type other than the exact one):
    the caller then runs pandera."""
    model_plan = plan(model)
    if model_plan is None or not isinstance(table, pa.Table):
        return False
    present = set(table.column_names)
    if len(present) != table.num_columns:
        return False  # duplicate column names: pandera's business
    known = {c.name for c in model_plan.columns}
    if model_plan.strict and not present <= known:
        return False
    try:
        for column in model_plan.columns:
            if column.name not in present:
                if column.required:
                    return False
                continue
            if not _column_ok(table, column):
                return False
        for names in model_plan.unique_sets:
            subset = tuple(n for n in names if n in present)
            if subset and not _all_distinct(table, subset):
                return False
        for rule in model_plan.row_rules:
            if not present.issuperset(ROW_RULE_COLUMNS[rule]):
                return False  # a row rule over an absent optional column: pandera decides
            if not rule_passes(rule, table):
                return False
        return True
    except (pa.ArrowException, ValueError, TypeError, KeyError):
        return False  # anything a kernel cannot evaluate: pandera decides (and names the problem)
