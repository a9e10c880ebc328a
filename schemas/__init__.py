"""Stage-boundary contracts: pandera models of the Arrow tables and atomic shard I/O.

``Problem`` / ``RejectedProblem`` (curate), ``Rollout`` (rollout), ``ScoredRollout``
(score/filter), ``StepMetrics`` (train), ``EvalResult`` (evaluate). Write with
``write_shard(data, path, Model)``, read with ``read_shard`` / ``read_shards``; use
``arrow_schema(Model)`` to build tables with the exact column types. ``StepStats`` is one
training step's statistics as a frozen record, derived from ``StepMetrics``.
"""

from schemas.models import (
    ALL_MODELS,
    EvalResult,
    Problem,
    RejectedProblem,
    Rollout,
    ScoredRollout,
    StepMetrics,
)
from schemas.shards import (
    ShardValidationError,
    arrow_schema,
    read_shard,
    read_shards,
    shard_paths,
    trust_validated,
    validate_table,
    validated_sha256,
    write_shard,
)
from schemas.step_stats import STEP_FIELDS, StepField, StepStats

__all__ = [
    "ALL_MODELS",
    "EvalResult",
    "Problem",
    "RejectedProblem",
    "Rollout",
    "ScoredRollout",
    "StepMetrics",
    "STEP_FIELDS",
    "StepField",
    "StepStats",
    "ShardValidationError",
    "arrow_schema",
    "read_shard",
    "read_shards",
    "shard_paths",
    "trust_validated",
    "validate_table",
    "validated_sha256",
    "write_shard",
]
