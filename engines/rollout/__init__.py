"""engines.rollout: vLLM engines, rollout generation and serving."""
