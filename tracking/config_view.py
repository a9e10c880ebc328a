"""The resolved run config as trackers show it: flat ``section.field`` values, and YAML text.

Trackers want flat key/value pairs (TensorBoard's hparams, MLflow's parameters): numbers, strings
and booleans stay typed, so TensorBoard's hparams table can sort and filter them; a list or a
missing value becomes its JSON text. The YAML text is the config as a user writes it (a run
config file), for TensorBoard's text tab and MLflow's artifacts. The digest tells a resumed run
whether the config changed since a tracker last logged it (tracking/tensorboard_log.py).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

Value = str | int | float | bool


def _plain(value: Any) -> Value:
    if isinstance(value, (str, int, float, bool)):
        return value
    return json.dumps(value, default=str)


def flat_config(run_config: Mapping[str, Mapping[str, Any]]) -> dict[str, Value]:
    """``{"train.lr": 0.0001, "run.data": '["synthetic:..."]', ...}`` from ``RunConfig.to_dict()``."""
    return {f"{section}.{field}": _plain(value) for section, fields in run_config.items() for field, value in fields.items()}


def flat_params(run_config: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """:func:`flat_config` with every value as text (MLflow's parameters are strings)."""
    return {key: value if isinstance(value, str) else json.dumps(value)
            for key, value in flat_config(run_config).items()}


def config_yaml(run_config: Mapping[str, Mapping[str, Any]]) -> str:
    """The config as YAML, sections and fields in their declared order."""
    import yaml

    return yaml.safe_dump(json.loads(json.dumps(run_config, default=str)), sort_keys=False)


def config_digest(run_config: Mapping[str, Mapping[str, Any]]) -> str:
    """A digest of the whole config (trackers' section included: it is what was logged)."""
    return hashlib.sha256(json.dumps(run_config, sort_keys=True, default=str).encode()).hexdigest()
