"""Environment variables set for the length of a block (and the processes started in it), then put back."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping


@contextlib.contextmanager
def overlay(values: Mapping[str, str]) -> Iterator[None]:
    """Within the block, ``os.environ`` holds ``values``; after it, each variable is as it was before
    (removed again where it was unset), whether the block ended or raised."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
