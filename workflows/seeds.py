"""Seeds derived from the run's root seed, one per (purpose, step, round).

Every random choice of a run (problem order, rollout sampling, evaluation sampling, training
shuffles) takes its seed from here, so the whole run is a function of the config, and every
sample records the seed that produced it (lineage).
"""

from __future__ import annotations

import hashlib


def derive_seed(root_seed: int, purpose: str, *parts: int) -> int:
    """A 31-bit seed from the root seed, a purpose name and integer parts (e.g. step, round)."""
    blob = "|".join([str(root_seed), purpose, *map(str, parts)]).encode()
    return int.from_bytes(hashlib.sha256(blob).digest()[:4], "big") & 0x7FFFFFFF
