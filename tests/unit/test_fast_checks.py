"""The vectorised model checks (schemas/fast_checks.py) against their reference, pandera itself.

Tables are generated from each model's own pandera schema: rows that keep every declared check
(values drawn inside each check's bounds, cross-column row rules made to hold), then 0-3
corruptions: a null, a value on or past a check's boundary (NaN, inf, an empty string, a
non-hex id, a value outside ``isin``), a duplicate row, a broken row rule, a missing or extra
column, another Arrow type. For every table the fast path must accept exactly what pandera
accepts, when the table has the model's exact column types; with any other type it must leave
the decision to pandera (answer False).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandera.errors
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import schemas.shards
from schemas import ALL_MODELS, EvalResult, Rollout, ScoredRollout, ShardValidationError, StepMetrics, arrow_schema
from schemas import fast_checks

MAX_ROWS = 4


def _pandera_accepts(table: pa.Table, model: type) -> bool:
    try:
        model.validate(table, lazy=True)
    except (pandera.errors.SchemaErrors, pandera.errors.SchemaError):
        return False
    return True


# ----------------------------------------------------------------------------- values from the checks


def _bounds(checks: tuple[tuple[str, Any, dict[str, Any]], ...]) -> tuple[float | None, float | None, bool]:
    """(low, high, low is strict) of a numeric column's comparison checks."""
    low = high = None
    strict = False
    for name, _, stats in checks:
        if name == "greater_than_or_equal_to":
            low = stats["min_value"]
        elif name == "greater_than":
            low, strict = stats["min_value"], True
        elif name == "less_than_or_equal_to":
            high = stats["max_value"]
        elif name == "in_range":
            low, high = stats["min_value"], stats["max_value"]
    return low, high, strict


def _normal_above(value: float, bit_width: int) -> float:
    """The smallest normal float of ``bit_width`` bits above ``value`` (no subnormals: see conftest)."""
    dtype = np.float32 if bit_width == 32 else np.float64
    above = float(np.nextafter(dtype(value), dtype(np.inf)))
    tiny = float(np.finfo(dtype).tiny)
    return tiny if abs(above) < tiny else above


def _valid_values(column: fast_checks.ColumnPlan) -> st.SearchStrategy[Any]:
    """Values that keep every check of ``column`` (derived from its pandera checks)."""
    stats = {name: s for name, _, s in column.checks}
    t = column.type
    if "isin" in stats:
        return st.sampled_from(list(stats["isin"]["allowed_values"]))
    if pa.types.is_integer(t):
        low, high, strict = _bounds(column.checks)
        lo = int(low) + int(strict) if low is not None else -20
        return st.integers(lo, int(high) if high is not None else lo + 40)
    if pa.types.is_floating(t):
        low, high, strict = _bounds(column.checks)
        lo = -2.0 if low is None else float(low)
        hi = lo + 4.0 if high is None else float(high)
        if strict:  # the first normal float above the bound (hypothesis's exclude_min fails at 0.0 with FTZ on)
            lo = _normal_above(lo, t.bit_width)
        return st.floats(lo, hi, width=t.bit_width, allow_nan=False, allow_subnormal=False)
    if pa.types.is_boolean(t):
        return st.booleans()
    if pa.types.is_string(t):
        if "str_matches" in stats:
            return st.from_regex(stats["str_matches"]["pattern"], fullmatch=True)
        min_size = stats.get("str_length", {}).get("min_value") or 0
        return st.text(min_size=min_size, max_size=6)
    if pa.types.is_list(t) and pa.types.is_integer(t.value_type):
        return st.lists(st.integers(0, 50), max_size=4)
    if pa.types.is_list(t) and pa.types.is_floating(t.value_type):
        return st.lists(st.floats(-5.0, 0.0, width=32, allow_subnormal=False), max_size=4)
    raise AssertionError(f"no value strategy for {column.name}: {t}")


def _check_edges(name: str, stats: dict[str, Any], t: pa.DataType) -> list[Any]:
    """Values on or past one check's boundary (may or may not be valid: pandera says)."""
    edges: list[Any] = []
    for key in ("min_value", "max_value"):
        v = stats.get(key)
        if v is not None and (pa.types.is_integer(t) or pa.types.is_floating(t)):
            edges += [v, v - 1, v + 1, v - 1e-3, v + 1e-3] if pa.types.is_floating(t) else [v, v - 1, v + 1]
    if name == "isin":
        edges += ["other", "", "Stop", 0.0, 2.0, -0.5]
    if name == "str_matches":
        edges += ["", "0123456789ABCDEF", "0123456789abcde", "0123456789abcdef0", "0123456789abcdef\n", "_a",
                  "a b", "Integer", "x9"]
    if name == "str_length":
        edges += ["", "a", " "]
    if pa.types.is_floating(t):
        edges += [math.nan, math.inf, -math.inf, -0.0]
    return [v for v in edges if _fits(v, t)]


def _edge_values(column: fast_checks.ColumnPlan) -> st.SearchStrategy[Any]:
    """Values on or past the checks' boundaries, and nulls (may or may not be valid: pandera says)."""
    t = column.type
    edges: list[Any] = [None]
    for name, _, stats in column.checks:
        edges += _check_edges(name, stats, t)
    if pa.types.is_floating(t):
        edges += [math.nan, math.inf, -math.inf, -0.0]
    if pa.types.is_integer(t):
        edges += [-(2 ** (t.bit_width - 1)), 2 ** (t.bit_width - 1) - 1]
    if pa.types.is_list(t):
        edges += [[], [None], [1, None]] if pa.types.is_integer(t.value_type) else [[], [None], [math.nan]]
    return st.sampled_from(edges)


def _fits(value: Any, t: pa.DataType) -> bool:
    try:
        pa.array([value], type=t)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        return False
    return True


# ----------------------------------------------------------------------------- the row rules made to hold
# One per key of schemas.models.ROW_RULES: makes the rule hold on a row (the generator applies
# them so that corruption-free tables are valid; a "broken rule" corruption skips one).


def _hold_log_probs_per_token(row: dict[str, Any]) -> None:
    n = len(row["response_token_ids"])
    row["rollout_log_probs"] = (row["rollout_log_probs"] + [-0.5] * n)[:n]
    row["response_length"] = n


def _hold_reward_is_sum(row: dict[str, Any]) -> None:
    row["reward"] = float(pa.scalar(row["rule_reward"] + row["overlong_penalty"], pa.float32()).as_py())


def _hold_num_correct_le_k(row: dict[str, Any]) -> None:
    row["num_correct"] = min(row["num_correct"], row["k"])


def _hold_avg_is_fraction(row: dict[str, Any]) -> None:
    _hold_num_correct_le_k(row)
    row["avg_at_k"] = row["num_correct"] / row["k"]
    row["pass_at_k"] = row["num_correct"] > 0


HOLD_RULE = {
    "log_probs_per_token": _hold_log_probs_per_token,
    "truncated_iff_length": lambda row: row.update(truncated=row["finish_reason"] == "length"),
    "reward_is_sum": _hold_reward_is_sum,
    "kept_iff_filter_kept": lambda row: row.update(kept=row["filter_reason"] == "kept"),
    "num_correct_le_k": _hold_num_correct_le_k,
    "avg_is_fraction": _hold_avg_is_fraction,
}

# Rule-breaking edits (a "broken rule" corruption applies one to one row).
BREAK_RULE = {
    "log_probs_per_token": lambda row: row.update(response_length=row["response_length"] + 1),
    "truncated_iff_length": lambda row: row.update(truncated=not row["truncated"]),
    "reward_is_sum": lambda row: row.update(reward=row["reward"] + 0.5),
    "kept_iff_filter_kept": lambda row: row.update(kept=not row["kept"]),
    "num_correct_le_k": lambda row: row.update(num_correct=row["k"] + 1),
    "avg_is_fraction": lambda row: row.update(avg_at_k=0.5 if row["avg_at_k"] != 0.5 else 0.25),
}

# Other Arrow types a column may arrive with (a writer's mistake): some narwhals-equivalent (pandera
# decides), some not.
OTHER_TYPES = [pa.int32(), pa.int64(), pa.int8(), pa.float32(), pa.float64(), pa.string(), pa.large_string(),
               pa.bool_(), pa.list_(pa.int64()), pa.list_(pa.float64()), pa.large_list(pa.int32())]


@st.composite
def tables(draw: st.DrawFn, model: type, max_corruptions: int = 3, min_rows: int = 0) -> pa.Table:
    """A table of ``model``: valid rows, then up to ``max_corruptions`` corruptions."""
    model_plan = fast_checks.plan(model)
    assert model_plan is not None, f"{model.__name__}: no fast plan"
    schema = arrow_schema(model)
    columns = {c.name: c for c in model_plan.columns}
    n_rows = draw(st.integers(min_rows, MAX_ROWS))
    rows = [{name: draw(_valid_values(c)) for name, c in columns.items()} for _ in range(n_rows)]
    for i, row in enumerate(rows):
        for c in columns.values():
            if c.unique:  # distinct per row, still inside the checks' bounds
                low = _bounds(c.checks)[0]
                row[c.name] = f"{row[c.name]}{i}" if pa.types.is_string(c.type) else int(low or 0) + 1 + i
        for rule in model_plan.row_rules:
            HOLD_RULE[rule](row)
    for names in model_plan.unique_sets:  # a row number in the first string column of the set
        first = next(n for n in names if pa.types.is_string(columns[n].type))
        for i, row in enumerate(rows):
            row[first] = f"{row[first]}{i}"
    corruptions = draw(st.lists(st.sampled_from(["cell", "duplicate", "rule", "missing", "extra", "type", "order"]),
                                max_size=max_corruptions))
    for kind in corruptions:
        if kind == "cell" and rows:
            name = draw(st.sampled_from(sorted(columns)))
            value = draw(_edge_values(columns[name]))
            if _fits(value, columns[name].type):
                rows[draw(st.integers(0, len(rows) - 1))][name] = value
        elif kind == "duplicate" and rows:
            rows.append(dict(rows[draw(st.integers(0, len(rows) - 1))]))
        elif kind == "rule" and rows and model_plan.row_rules:
            BREAK_RULE[draw(st.sampled_from(model_plan.row_rules))](rows[draw(st.integers(0, len(rows) - 1))])
    table = pa.Table.from_pylist(rows, schema=schema) if rows else schema.empty_table()
    for kind in corruptions:
        if kind == "missing":
            table = table.drop_columns([draw(st.sampled_from(table.column_names))])
        elif kind == "extra" and "extra" not in table.column_names:
            table = table.append_column("extra", pa.array([1] * table.num_rows, pa.int64()))
        elif kind == "order":
            table = table.select(draw(st.permutations(table.column_names)))
        elif kind == "type":
            name = draw(st.sampled_from(table.column_names))
            target = draw(st.sampled_from(OTHER_TYPES))
            try:
                table = table.set_column(table.column_names.index(name), name, table[name].cast(target))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
                pass
    return table


def _exact_types(table: pa.Table, model: type) -> bool:
    schema = arrow_schema(model)
    return all(table[n].type == schema.field(n).type for n in table.column_names if n in schema.names)


@pytest.mark.parametrize("model", ALL_MODELS, ids=lambda m: m.__name__)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fast_checks_accept_exactly_what_pandera_accepts(model: type, data: st.DataObject) -> None:
    table = data.draw(tables(model))
    fast, reference = fast_checks.passes(table, model), _pandera_accepts(table, model)
    if _exact_types(table, model):
        assert fast == reference, f"fast {fast}, pandera {reference}:\n{table.to_pylist()}"
    else:
        assert not fast, f"a column of another type was accepted without pandera:\n{table.schema}"


@pytest.mark.parametrize("model", ALL_MODELS, ids=lambda m: m.__name__)
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_generated_tables_without_corruption_are_valid(model: type, data: st.DataObject) -> None:
    # The generator's valid rows really are valid (else the test above would compare rejections only).
    table = data.draw(tables(model, max_corruptions=0))
    assert _pandera_accepts(table, model)
    assert fast_checks.passes(table, model)


def _single_violations(model: type, rows: list[dict[str, Any]]) -> list[tuple[str, list[list[dict[str, Any]]]]]:
    """Per check ``model`` declares: (its name, tables (as rows) that each change one cell or row of
    the valid ``rows`` (>= 2) on that check alone). Derived from the fast plan: so a check the plan
    dropped is still listed only if the plan has it; the test below also checks every pandera
    column check and row rule appears here."""
    model_plan = fast_checks.plan(model)
    assert model_plan is not None

    def edited(edit: Any) -> list[dict[str, Any]]:
        copy = [dict(r) for r in rows]
        edit(copy)
        return copy

    def set_cell(name: str, value: Any) -> list[dict[str, Any]]:
        return edited(lambda rs: rs[0].update({name: value}))

    targets: list[tuple[str, list[list[dict[str, Any]]]]] = []
    for c in model_plan.columns:
        if not c.nullable:
            targets.append((f"{c.name}: not nullable", [set_cell(c.name, None)]
                            + ([set_cell(c.name, math.nan)] if pa.types.is_floating(c.type) else [])))
        if c.unique:
            targets.append((f"{c.name}: unique", [edited(lambda rs, n=c.name: rs[1].update({n: rs[0][n]}))]))
        for name, _, stats in c.checks:
            targets.append((f"{c.name}: {name}", [set_cell(c.name, v) for v in _check_edges(name, stats, c.type)]))
    for names in model_plan.unique_sets:
        targets.append((f"{names}: unique together",
                        [edited(lambda rs, ns=names: rs[1].update({n: rs[0][n] for n in ns}))]))
    for rule in model_plan.row_rules:
        targets.append((f"row rule {rule}", [edited(lambda rs, r=rule: BREAK_RULE[r](rs[0]))]))
    return targets


@pytest.mark.parametrize("model", ALL_MODELS, ids=lambda m: m.__name__)
@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_each_declared_check_alone_is_enforced_as_pandera_enforces_it(model: type, data: st.DataObject) -> None:
    # Every check the model declares, broken alone on a valid table: the fast path rejects exactly
    # the tables pandera rejects, and pandera rejects at least one (so the check is exercised).
    # Dropping any one check from the fast path fails here whatever the random draw.
    schema = arrow_schema(model)
    rows = data.draw(tables(model, max_corruptions=0, min_rows=2)).to_pylist()
    targets = _single_violations(model, rows)
    pandera_schema = model.to_schema()
    declared = {f"{n}: {k.name}" for n, c in pandera_schema.columns.items() for k in c.checks}
    declared |= {f"{n}: not nullable" for n, c in pandera_schema.columns.items() if not c.nullable}
    declared |= {f"row rule {k.name}" for k in pandera_schema.checks}
    assert declared <= {name for name, _ in targets}
    for name, variants in targets:
        verdicts = []
        for variant in variants:
            table = pa.Table.from_pylist(variant, schema=schema)
            reference = _pandera_accepts(table, model)
            assert fast_checks.passes(table, model) == reference, f"{name}: {variant[:2]}"
            verdicts.append(reference)
        assert not all(verdicts), f"{name}: no variant broke the check"


@pytest.mark.parametrize(("model", "row_rule"), [(Rollout, "truncated_iff_length"), (ScoredRollout, "reward_is_sum"),
                                                 (EvalResult, "avg_is_fraction")])
def test_every_model_of_the_step_loop_has_a_plan_with_its_row_rules(model: type, row_rule: str) -> None:
    model_plan = fast_checks.plan(model)
    assert model_plan is not None and row_rule in model_plan.row_rules
    assert set(model_plan.row_rules) <= set(HOLD_RULE)


def test_a_model_with_a_check_outside_the_kernels_gets_no_plan() -> None:
    import pandera.pyarrow as pdp

    class Custom(pdp.DataFrameModel):
        x: pa.int64() = pdp.Field(ge=0)

        @pdp.check("x")
        def even(cls, data: Any) -> bool:  # a custom check: only pandera can run it
            return True

    assert fast_checks.plan(Custom) is None
    assert not fast_checks.passes(pa.table({"x": pa.array([2], pa.int64())}), Custom)


def test_validate_table_runs_pandera_only_when_the_fast_checks_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[type] = []
    original = StepMetrics.validate.__func__  # type: ignore[attr-defined]

    def counted(cls: type, *args: Any, **kwargs: Any) -> Any:
        calls.append(cls)
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(StepMetrics, "validate", classmethod(counted))
    row = {f.name: 1 if pa.types.is_integer(f.type) else 0.5 if pa.types.is_floating(f.type) else "c"
           for f in arrow_schema(StepMetrics)}
    good = pa.Table.from_pylist([row], schema=arrow_schema(StepMetrics))
    schemas.shards.validate_table(good, StepMetrics)
    assert calls == []
    bad = pa.Table.from_pylist([{**row, "tokens": -1}], schema=arrow_schema(StepMetrics))
    with pytest.raises(ShardValidationError, match=r"column 'tokens': check greater_than_or_equal_to\(0\) failed: "
                                                   r"1 row\(s\): 0=-1"):
        schemas.shards.validate_table(bad, StepMetrics, "m.parquet")
    assert calls == [StepMetrics]
