"""What the commands print: strict JSON (NaN as null), and lineage's lists of ids on one line."""

from __future__ import annotations

import json

from workflows import json_output


def _strict(text: str) -> object:
    def refuse(constant: str) -> None:
        raise AssertionError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_non_finite_floats_are_null_at_any_depth() -> None:
    value = {"accuracy": float("nan"), "rows": [{"reward": float("inf")}, (1.5, float("-inf"))]}
    expected = {"accuracy": None, "rows": [{"reward": None}, [1.5, None]]}
    assert _strict(json_output.dumps(value)) == expected
    assert _strict(json_output.dumps_readable(value)) == expected


def test_a_checkpoints_warm_up_ids_take_one_line_and_keys_keep_their_order() -> None:
    """`dapo lineage --checkpoint N`: the step-0 policy's ~800 warm-up problem ids were 800 lines."""
    ids = [f"{i:016x}" for i in range(800)]
    lineage = {"checkpoint_id": "train-0002-x", "ancestry": [
        {"step": 2, "inputs": {"batch": ["steps/step-0002/batch.parquet"]}},
        {"step": 0, "inputs": {"warmup_problem_ids": ids, "seed": 1}}]}
    text = json_output.dumps_readable(lineage)
    assert _strict(text) == lineage
    assert len(text.splitlines()) < 25
    assert text.index("checkpoint_id") < text.index("ancestry") and text.index('"batch"') < text.index("warmup")
