"""benchmarks/rollout_throughput.py's matmul ceiling: the fused matrices are the model's own
products, and the ceiling's tokens/s is its prefill plus one decode pass per further token."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from rollout_throughput import fused_weights, matmul_ceiling  # noqa: E402

from engines.bootstrap import tiny_policy  # noqa: E402


def test_fused_matrices_compute_what_the_models_layers_compute() -> None:
    model = tiny_policy.build_random_model(tiny_policy.build_tokenizer(), seed=3, num_layers=2, hidden_size=64,
                                           num_heads=2)
    weights = fused_weights(model)
    assert len(weights) == 4 * 2 + 1
    x = torch.randn(5, 64)
    for index, layer in enumerate(model.model.layers):
        qkv, o, gate_up, down = weights[4 * index: 4 * index + 4]
        attention, mlp = layer.self_attn, layer.mlp
        # Qwen2's q/k/v carry biases; the ceiling times the products only.
        expected_qkv = torch.cat([attention.q_proj(x) - attention.q_proj.bias, attention.k_proj(x) - attention.k_proj.bias,
                                  attention.v_proj(x) - attention.v_proj.bias], dim=-1)
        torch.testing.assert_close(torch.nn.functional.linear(x, qkv), expected_qkv)
        torch.testing.assert_close(torch.nn.functional.linear(x, o), attention.o_proj(x))
        torch.testing.assert_close(torch.nn.functional.linear(x, gate_up), torch.cat([mlp.gate_proj(x), mlp.up_proj(x)], -1))
        wide = torch.randn(5, mlp.down_proj.in_features)
        torch.testing.assert_close(torch.nn.functional.linear(wide, down), mlp.down_proj(wide))
    torch.testing.assert_close(torch.nn.functional.linear(x, weights[-1]), model.lm_head(x))


def test_the_ceiling_is_one_prefill_and_a_decode_pass_per_further_token() -> None:
    weights = [torch.randn(32, 16), torch.randn(16, 32)]
    ceiling = matmul_ceiling(weights, prompt_tokens=40, sequences=12, new_tokens=7, tries=2)
    seconds = ceiling["prefill_s"] + 6 * ceiling["decode_step_s"]
    assert ceiling["seconds"] == seconds
    assert abs(ceiling["tokens_per_s"] - 12 * 7 / seconds) <= 0.05
    assert ceiling["matrices"] == 2 and ceiling["prompt_tokens"] == 40
