"""A shipped config's generation round runs as one engine wave: every request in one ``generate``
chunk, scheduled together (engines/rollout/vllm_engine.py: MAX_NUM_SEQS). Split in two, the round pays the
scheduler's cost per decoding step twice; the samples are the same either way (a seed per request)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engines.rollout.vllm_engine import MAX_NUM_SEQS, EngineSettings
from workflows.config import load_config

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["tiny-cpu.yaml", "ablation-addsub.yaml", "ablation-checks.yaml", "ablation-tiny.yaml"])
def test_a_shipped_round_fits_one_wave(name: str) -> None:
    config = load_config(REPO / "configs" / name)
    requests = config.run.prompts_per_round * config.rollout.samples_per_prompt
    assert requests <= MAX_NUM_SEQS, f"{name}: a round of {requests} requests runs as several waves of {MAX_NUM_SEQS}"
    assert EngineSettings().max_num_seqs == MAX_NUM_SEQS  # the engine schedules a whole chunk together
