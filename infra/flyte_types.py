"""Flyte's literal type of a dataclass, built once per type in a process.

The SDK (flyte 2.12) converts every dataclass input and output of every task call to a literal
and asks ``DataclassTransformer.get_literal_type`` for its type each time (twice per call:
submit and execute), which builds the class's JSON schema with mashumaro from scratch: 50-200 ms
for ``TrainConfig``, ~0.8 s for ``RunConfig`` on the developer machine under load, several tenths
of a second per DAPO step (benchmarks/journal/2026-11-21_to_2026-11-27.md, "Fixed per-step cost"). A class's schema
cannot change while the process runs (a redefined class is another type, another entry), so the
memo keeps the first result per type and hands out copies: callers may modify the protobuf they
get. The literal types, and so the task cache keys, are the same as without it.
"""

from __future__ import annotations

import functools
import threading
from typing import Any


def memoize_dataclass_literal_types() -> None:
    """Wrap ``DataclassTransformer.get_literal_type`` with a per-type memo (idempotent)."""
    from flyte.types import _type_engine

    transformer = _type_engine.DataclassTransformer
    build = transformer.get_literal_type
    if getattr(build, "dapo_memoized", False):
        return
    built: dict[Any, Any] = {}
    lock = threading.Lock()

    @functools.wraps(build)
    def get_literal_type(self: Any, t: Any) -> Any:
        try:
            key = (self.name, t)
            hash(key)
        except TypeError:  # an unhashable type annotation: nothing to key it by
            return build(self, t)
        with lock:
            literal_type = built.get(key)
        if literal_type is None:
            literal_type = build(self, t)
            with lock:
                built.setdefault(key, literal_type)
        copy = type(literal_type)()
        copy.CopyFrom(literal_type)
        return copy

    get_literal_type.dapo_memoized = True  # type: ignore[attr-defined]
    transformer.get_literal_type = get_literal_type
