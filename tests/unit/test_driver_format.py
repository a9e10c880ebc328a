"""The driver's step line survives metrics read back from a shard (a re-run over cache hits)."""

from __future__ import annotations

import math
from pathlib import Path

from workflows.progress import fmt3 as _fmt3


def test_step_line_numbers_hand_worked() -> None:
    assert _fmt3(0.12345) == "0.123"
    assert _fmt3(float("nan")) == "nan"
    # A step filled by carried groups alone has NaN accuracy; written to the metrics shard from
    # a row dict, it can come back as None, and a resumed ladder crashed formatting it.
    assert _fmt3(None) == "nan"


def test_nan_accuracy_round_trips_through_the_metrics_shard(tmp_path: Path) -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from test_schemas import metrics_row

    import schemas

    path = schemas.write_shard([metrics_row(accuracy=float("nan"))], tmp_path / "m.parquet", schemas.StepMetrics)
    value = schemas.read_shard(path, schemas.StepMetrics).to_pylist()[0]["accuracy"]
    assert value is None or math.isnan(value)
    assert _fmt3(value) == "nan"


def test_round_groups_come_from_the_score_stats_without_reading_the_shard() -> None:
    from engines.score.stage import GroupDecision, ScoreStats
    from workflows.driver import _round_groups
    from workflows.step_loop import GroupRef

    stats = ScoreStats(groups=2, group_decisions=[GroupDecision("k-b", "all_wrong", "b" * 16),
                                                  GroupDecision("k-a", "kept", "a" * 16)])
    missing = "/nonexistent/steps/0003/scored/round-00.parquet"  # never opened
    assert _round_groups(stats, missing, 3, 2) == [
        ("k-b", "all_wrong", GroupRef(problem_id="b" * 16, source=missing, generated_step=3, behaviour_step=2)),
        ("k-a", "kept", GroupRef(problem_id="a" * 16, source=missing, generated_step=3, behaviour_step=2)),
    ]
