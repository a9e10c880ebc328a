"""One training step's statistics as a frozen record, derived from the ``StepMetrics`` model.

The model (schemas/models.py) declares each statistic once: its column name, Arrow type, checks,
doc, tracker group and who measures it. :func:`record_of` turns such a model into a frozen
dataclass with one field per column, in column order (ints for integer columns, floats for float
columns, str for strings), plus the :class:`StepField` list the consumers read their names from:
trackers (tracking/scalars.py) and the run report (reports/run.py). Adding a metric is one model
field plus its producer; the record, the Parquet columns and the tracker scalar follow.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from schemas.models import STEP_KEY, StepMetrics
from schemas.shards import arrow_schema


@dataclasses.dataclass(frozen=True)
class StepField:
    """One step statistic as the model declares it."""

    name: str
    arrow_type: pa.DataType
    group: str  # tracker panel: the scalar is ``<group>/<name>``; "" for the key columns
    by: str  # "key", "worker" (the training workers report it) or "driver" (filled by the driver)
    unit: str = ""  # "fraction" (0-1), "s" (seconds) or "" (a plain number); schemas/models.py: UNITS

    @property
    def python_type(self) -> type:
        if pa.types.is_integer(self.arrow_type):
            return int
        return float if pa.types.is_floating(self.arrow_type) else str

    @property
    def blank(self) -> Any:
        """What a stage that does not measure it writes: 0 for counts, NaN for floats."""
        return 0 if self.python_type is int else math.nan


def step_fields(model: type = StepMetrics) -> tuple[StepField, ...]:
    """The model's columns in order, with the metadata each field declares."""
    columns = model.to_schema().columns
    return tuple(StepField(f.name, f.type, columns[f.name].metadata["group"], columns[f.name].metadata["by"],
                           columns[f.name].metadata.get("unit", ""))
                 for f in arrow_schema(model))


class _StepRecord:
    """Methods shared by every record :func:`record_of` makes (a mixin of helpers, no state)."""

    FIELDS: tuple[StepField, ...] = ()

    @classmethod
    def blank(cls, step: int, checkpoint_id: str, parent_checkpoint_id: str, **values: Any) -> Any:
        """The step's record with every statistic blank (0 / NaN) except ``values``."""
        row = {f.name: f.blank for f in cls.FIELDS if f.by != STEP_KEY}
        row.update(values)
        return cls(step=step, checkpoint_id=checkpoint_id, parent_checkpoint_id=parent_checkpoint_id, **row)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Any:
        """The record of one StepMetrics row (a dict read from a shard); extra keys are an error."""
        return cls(**row)

    def row(self) -> dict[str, Any]:
        """The StepMetrics row, in column order (what ``write_shard`` takes)."""
        return {f.name: getattr(self, f.name) for f in self.FIELDS}


def record_of(model: type, name: str) -> type:
    """A frozen dataclass named ``name`` with one field per column of ``model``, in order."""
    fields = step_fields(model)
    cls = dataclasses.make_dataclass(name, [(f.name, f.python_type) for f in fields], bases=(_StepRecord,),
                                     frozen=True, namespace={"FIELDS": fields, "__module__": __name__})
    cls.__doc__ = f"One training step's statistics: one field per {model.__name__} column (schemas/models.py documents each)."
    return cls


StepStats = record_of(StepMetrics, "StepStats")
STEP_FIELDS: tuple[StepField, ...] = StepStats.FIELDS
