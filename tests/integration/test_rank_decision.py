"""Elastic ranks take rank 0's decision (engines/train/rank.py: _decided_by_rank_0).

Whether a published step is reused is decided once, by rank 0, and broadcast: every rank takes the
same branch even where its own view of the store would differ, and an error rank 0 meets (a pruned
parent) is raised on every rank instead of leaving the others waiting at a collective.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _two_ranks(tmp_path: Path, case: str) -> list[dict]:
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         f"--log-dir={tmp_path / 'torchelastic'}", str(Path(__file__).parent / "rank_decision_main.py"),
         str(tmp_path), case],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.parametrize("case", ["value", "error"])
def test_every_rank_takes_rank_0s_decision_and_its_error(tmp_path: Path, case: str) -> None:
    ranks = _two_ranks(tmp_path, case)
    assert [r["decide_calls"] for r in ranks] == [[0], []]  # rank 1 never decides on its own
    if case == "value":
        assert [r["value"] for r in ranks] == ["decided on rank 0"] * 2
    else:
        assert [(r["error"], r["message"]) for r in ranks] == [
            ("PrunedWeightsError", "ck0: pruned by the retention policy (decided on rank 0)")] * 2
