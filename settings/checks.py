"""Field checks for the frozen stage config dataclasses, run in ``__post_init__``.

A config is checked when it is built, so ``dapo run`` refuses a bad value while loading the
YAML (workflows/config.py) instead of after curation and the warm-up. A failed check raises
:class:`FieldError`, which names the field so the loader can blame the YAML file or the
``--set`` that gave the value.
"""

from __future__ import annotations

from typing import Any


class FieldError(ValueError):
    """One config field holds a value its stage cannot use; ``field`` names it."""

    def __init__(self, field: str, value: Any, why: str) -> None:
        self.field, self.value, self.why = field, value, why
        super().__init__(f"{field}={value!r} {why}")


def check_fields(config: Any, rules: dict[str, tuple[bool, str]]) -> None:
    """Raise :class:`FieldError` for the first ``field: (ok, why)`` rule that does not hold."""
    for name, (ok, why) in rules.items():
        if not ok:
            raise FieldError(name, getattr(config, name), why)
