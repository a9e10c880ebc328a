"""Flyte's literal type of a dataclass is built once per type (infra/flyte_types.py)."""

from __future__ import annotations

import pytest


def test_dataclass_literal_types_are_built_once_and_handed_out_as_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    from flyte.types import TypeEngine, _type_engine

    from infra import flyte_types
    from settings.train import TrainConfig

    built: list[type] = []
    unwrapped = getattr(_type_engine.DataclassTransformer.get_literal_type, "__wrapped__",
                        _type_engine.DataclassTransformer.get_literal_type)

    def counting(self, t):  # type: ignore[no-untyped-def]
        built.append(t)
        return unwrapped(self, t)

    monkeypatch.setattr(_type_engine.DataclassTransformer, "get_literal_type", counting)
    reference = TypeEngine.to_literal_type(TrainConfig)
    assert built == [TrainConfig]  # without the memo: built on every call
    flyte_types.memoize_dataclass_literal_types()
    first, second = TypeEngine.to_literal_type(TrainConfig), TypeEngine.to_literal_type(TrainConfig)
    assert first == reference and second == reference
    assert built == [TrainConfig, TrainConfig]  # once more for the memo, then never
    first.metadata.Clear()  # a caller changing its copy changes nobody else's
    assert TypeEngine.to_literal_type(TrainConfig) == reference
    flyte_types.memoize_dataclass_literal_types()  # idempotent: no second layer
    assert TypeEngine.to_literal_type(TrainConfig) == reference and len(built) == 2
