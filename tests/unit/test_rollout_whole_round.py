"""A round's results cover every request it asked for, on either engine path (engines/rollout/stage.py).

The engines are faked: each part's results come from a stand-in ``generate_part`` that can lose a
request, as an engine returning fewer outputs than prompts would (``generate_part`` pairs requests
and outputs with ``zip``, which stops at the shorter).
"""

from __future__ import annotations

from typing import Any

import pytest

from engines.rollout import stage as ro


def _requests(problems: int, samples: int) -> list[dict[str, Any]]:
    return [{"problem_id": f"p{i}", "sample_index": s, "prompt_token_ids": [5, 6], "seed": 10 * i + s}
            for i in range(problems) for s in range(samples)]


def _fake_engine(drop: tuple[str, int] | None):
    def generate_part(checkpoint_dir, settings, sampling, requests, label=""):
        kept = [r for r in requests if (r["problem_id"], r["sample_index"]) != drop]
        return ro.GeneratedPart([{**r, "response_token_ids": [7]} for r in kept], 0.1)
    return generate_part


@pytest.mark.parametrize("on_ray", [False, True])
def test_a_round_missing_one_request_is_an_engine_fault_naming_it(monkeypatch: pytest.MonkeyPatch, on_ray: bool) -> None:
    parts = ro.split_parts(_requests(4, 3), 2)
    monkeypatch.setattr(ro, "generate_part", _fake_engine(drop=("p2", 1)))
    monkeypatch.setattr(ro, "_ray_generate", lambda source, settings, sampling, parts, hosting: [
        ro.generate_part(source, settings, sampling, part) for part in parts])
    with pytest.raises(ro.EngineOutputError, match="11 results for 12 requests.*problem p2 sample 1"):
        ro._generate_parts("ckpt", "ckpt", None, {}, parts, on_ray=on_ray)


def test_a_whole_round_comes_back_in_request_order(monkeypatch: pytest.MonkeyPatch) -> None:
    parts = ro.split_parts(_requests(4, 3), 2)
    monkeypatch.setattr(ro, "generate_part", _fake_engine(drop=None))
    results, seconds, _how = ro._generate_parts("ckpt", "ckpt", None, {}, parts, on_ray=False)
    assert [(r["problem_id"], r["sample_index"]) for r in results] == [
        (r["problem_id"], r["sample_index"]) for part in parts for r in part]
    assert seconds == pytest.approx(0.2)
