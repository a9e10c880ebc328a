"""Field checks for the frozen stage config dataclasses, run in ``__post_init__``.

A config is checked when it is built, so ``dapo run`` refuses a bad value while loading the
YAML (workflows/config.py) instead of after curation and the warm-up. A failed check raises
:class:`FieldError`, which names the field so the loader can blame the YAML file or the
``--set`` that gave the value.

Besides each stage's own rules (each numeric field's range, maximum included, declared once in
its dataclass's ``__post_init__``), every field of every stage holds what the pipeline can carry
at all (:func:`_carriable`): a float is finite (``inf`` passed ``> 0`` and failed deep in a
step or in vLLM), an int fits int64 (the shards' and the engines' integers: past it, an
OverflowError once the run folder existed), and a string holds no NUL (names and paths).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

INT64_MAX = 2**63 - 1
# Shared maxima of the size fields, far above any real run (the paper: 20,480 tokens, G = 16), yet
# small enough that a typo (an extra zero or three) is caught before memory is.
TOKENS_MAX = 1 << 20  # tokens of one sequence (response cap, context length, normaliser)
SAMPLES_MAX = 1024  # samples of one prompt (G) or of one evaluated problem (k)
COUNT_MAX = 10**9  # counts of problems, rows, steps, characters
WORKERS_MAX = 4096  # processes, threads, engines, GPUs


class FieldError(ValueError):
    """One config field holds a value its stage cannot use; ``field`` names it."""

    def __init__(self, field: str, value: Any, why: str) -> None:
        self.field, self.value, self.why = field, value, why
        super().__init__(f"{field}={value!r} {why}")


def check_fields(config: Any, rules: dict[str, tuple[bool, str]]) -> None:
    """Raise :class:`FieldError` for the first field that cannot be carried (:func:`_carriable`), then
    for the first ``field: (ok, why)`` rule that does not hold."""
    for f in dataclasses.fields(config):
        why = _carriable(getattr(config, f.name))
        if why:
            raise FieldError(f.name, getattr(config, f.name), why)
    for name, (ok, why) in rules.items():
        if not ok:
            raise FieldError(name, getattr(config, name), why)


def in_range(value: int, low: int, high: int) -> bool:
    """``low <= value <= high`` (a rule's test; the message says ``must be in [low, high]``)."""
    return low <= value <= high


def _carriable(value: Any) -> str | None:
    """Why ``value`` cannot be carried by any field (None: it can)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "must be a finite number"
    if isinstance(value, int) and not isinstance(value, bool) and not -INT64_MAX - 1 <= value <= INT64_MAX:
        return f"must fit a 64-bit integer (|value| < 2**63 = {INT64_MAX + 1})"
    if isinstance(value, str) and "\x00" in value:
        return "must not hold a NUL character"
    if isinstance(value, (tuple, list)):
        return next((why for item in value if (why := _carriable(item))), None)
    return None
