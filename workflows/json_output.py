"""Strict JSON of what the commands print and the run page's metrics: NaN and infinities as null.

Python's ``json`` writes a float NaN as the bare word ``NaN``, which is not JSON: ``jq`` and other
languages' parsers reject the whole document. A stage's metrics hold NaN where a figure has no
value (``dapo train`` knows no rollout accuracy or reward: its StepMetrics leave them NaN).
"""

from __future__ import annotations

import json
import math
from typing import Any


def finite_or_none(value: Any) -> Any:
    """``value`` with every non-finite float, at any depth of dicts, lists and tuples, replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite_or_none(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_none(item) for item in value]
    return value


def dumps(value: Any) -> str:
    """``value`` as indented, key-sorted strict JSON (non-finite floats as null; other objects as str)."""
    return json.dumps(finite_or_none(value), indent=2, sort_keys=True, default=str, allow_nan=False)


def dumps_readable(value: Any) -> str:
    """``value`` as indented strict JSON in its own key order, with every list of plain values (ids,
    numbers) on one line: `dapo lineage`'s step-0 policy lists ~800 warm-up problem ids, one line
    each under ``json.dumps(indent=2)``, burying the ancestry around them."""
    return _readable(finite_or_none(value), 0)


def _readable(value: Any, level: int) -> str:
    inner, outer = "  " * (level + 1), "  " * level
    if isinstance(value, dict) and value:
        items = (f"{inner}{_plain(str(key))}: {_readable(item, level + 1)}" for key, item in value.items())
        return "{\n" + ",\n".join(items) + "\n" + outer + "}"
    if isinstance(value, list) and any(isinstance(item, (dict, list)) for item in value):
        return "[\n" + ",\n".join(inner + _readable(item, level + 1) for item in value) + "\n" + outer + "]"
    return _plain(value)


def _plain(value: Any) -> str:
    return json.dumps(value, default=str, allow_nan=False)
