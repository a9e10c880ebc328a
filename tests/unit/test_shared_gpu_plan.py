"""infra/sizing.py: plan_shared_gpu, the memory plan of a local run whose vLLM engine and training
ranks share a GPU, checked against figures worked out by hand for the Qwen2.5-0.5B shape."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infra import model_shape, sizing
from infra.sizing import GB

QWEN_05B = model_shape.load_architecture(Path(__file__).resolve().parents[1] / "data" / "model_configs" / "Qwen2.5-0.5B")

# Qwen2.5-0.5B, 494,032,768 parameters (tests/unit/test_model_shape.py); ZeRO-1 on one rank:
# weights 2 B/param = 988,065,536; gradients 4 B = 1,976,131,072; optimizer state 12 B = 5,928,393,216
STATES = 988_065_536 + 1_976_131_072 + 5_928_393_216  # 8,892,589,824
# one 4096-token micro-batch, log-probs in chunks of 1024: layer inputs 24 x 4096 x 896 x 2 = 176,160,768;
# one layer recomputed 4096 x (4 x 896 + 3 x 4864) x 2 = 148,897,792; logits 1024 x 151,936 x 10 = 1,555,824,640
ACTIVATIONS = 176_160_768 + 148_897_792 + 1_555_824_640  # 1,880,883,200
# the optimizer step (issue 49), ZeRO-1 on one GPU: flat fp32 gradients 4 B/param + CUDA AdamW's sqrt(v) 4 B
# - the module's gradients freed before the update 4 B = 4 B/param = 1,976,131,072 above the states; the
# activations are released before it, so the term is what it needs beyond them: 95,247,872
STEP_BEYOND_ACTIVATIONS = 1_976_131_072 - ACTIVATIONS  # 95,247,872


def _plan(**changes: object) -> sizing.SharedGpuPlan:
    kwargs: dict[str, object] = dict(
        zero_stage=1, micro_batch_samples=1, tokens_per_sequence=4096, samples_per_prompt=16, train_processes=1,
        gpu_memory_bytes=24 * GB, gpu_memory_utilization=0.3, engine_sleeps=True, logprob_chunk_tokens=1024,
    )
    kwargs.update(changes)
    return sizing.plan_shared_gpu(QWEN_05B, **kwargs)  # type: ignore[arg-type]


def test_a_sleeping_engine_leaves_training_the_gpu_and_the_phases_add_up_by_hand() -> None:
    plan = _plan()
    # rollout: the ranks keep their states (activations released after a step) + a rank's runtime
    # 1 GB + the engine awake at 0.3 x 24 GB = 7.2 GB -> 8,892,589,824 + 1e9 + 7.2e9 = 17,092,589,824
    assert plan.rollout_bytes == STATES + sizing.RANK_RUNTIME_BYTES + 7_200_000_000 == 17_092_589_824
    # train: states + activations + the step beyond them + the rank's runtime + the engine asleep (1 GB)
    assert plan.train_bytes == (STATES + ACTIVATIONS + STEP_BEYOND_ACTIVATIONS + sizing.RANK_RUNTIME_BYTES
                                + sizing.ENGINE_ASLEEP_BYTES) == 12_868_720_896
    assert plan.peak_bytes == plan.rollout_bytes and plan.usable_bytes == int(0.9 * 24 * GB)
    # the engine's share: 7.2e9 - 988,065,536 weights - 3e9 workspace = 3,211,934,464 B of KV cache;
    # a 4096-token sequence is 4096 x 12,288 = 50,331,648 B -> 63 sequences at once (a group is 16)
    assert (plan.engine.kv_budget_per_engine, plan.engine.full_length_sequences) == (3_211_934_464, 63)


def test_the_training_terms_are_sizing_training_terms() -> None:
    plan = _plan()
    params = sizing.parameter_count(QWEN_05B)
    expected = sizing.training_terms(QWEN_05B, params, 1, 1, 4096, 1024)
    assert [(t.name, t.bytes) for t in plan.train_terms[: len(expected)]] == [(t.name, t.bytes) for t in expected]
    assert [t.name for t in plan.rollout_terms[:3]] == ["weights", "gradients", "optimizer state"]


def test_without_sleep_the_engine_is_counted_awake_while_the_ranks_train() -> None:
    # 0.45 x 24 GB = 10.8 GB awake. Rollout 8.89 + 1 + 10.8 = 20.69 GB fits 21.6 GB usable, and so does
    # training with the engine asleep (12.87 GB); awake it is 8.89 + 1.98 + 1 + 10.8 = 22.67 GB: refused.
    assert _plan(gpu_memory_utilization=0.45).peak_bytes == STATES + sizing.RANK_RUNTIME_BYTES + 10_800_000_000
    with pytest.raises(sizing.PlanDoesNotFit) as err:
        _plan(gpu_memory_utilization=0.45, engine_sleeps=False)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("shared GPU while training needs 22.7 GB per GPU at 1 GPU shared by the vLLM engine "
                              "and 1 training rank(s) (vLLM engine awake (gpu_memory_utilization 0.45) 10.8 GB)")
    assert "on 24 GB GPUs, 21.6 GB usable" in message
    assert "rollout.sleep_between_rounds=true" in message and "run.pipelined=false" in message


def test_the_default_utilization_on_a_shared_gpu_is_refused_naming_the_largest_that_fits() -> None:
    # 0.85 x 24 GB = 20.4 GB for the engine beside 9.89 GB of ranks: 30.3 GB > 21.6 GB. What fits:
    # (21.6e9 - 9,892,589,824) / 24e9 = 0.487; what the engine needs: (988,065,536 + 3e9 + 16 x
    # 50,331,648) / 24e9 = 0.200
    with pytest.raises(sizing.PlanDoesNotFit) as err:
        _plan(gpu_memory_utilization=0.85)
    message = str(err.value)
    assert message.startswith("shared GPU during rollout needs 30.3 GB per GPU")
    assert "(vLLM engine awake (gpu_memory_utilization 0.85) 20.4 GB)" in message
    assert message.endswith("set rollout.gpu_memory_utilization between 0.20 and 0.48")


def test_a_model_whose_training_state_fills_the_card_is_refused_naming_the_optimizer_state() -> None:
    # 32B, ZeRO-1, one 80 GB GPU: optimizer state 12 x 32,763,876,352 B = 393.2 GB, the biggest term of the
    # rollout phase (states 589.7 GB + 1 GB + 0.3 x 80 GB); one GPU: ZeRO partitions nothing, so no ZeRO knob
    with pytest.raises(sizing.PlanDoesNotFit) as err:
        sizing.plan_shared_gpu(sizing.QWEN2_5_32B, zero_stage=1, micro_batch_samples=1, tokens_per_sequence=4096,
                               samples_per_prompt=16, train_processes=1, gpu_memory_bytes=80 * GB,
                               gpu_memory_utilization=0.3, engine_sleeps=True, logprob_chunk_tokens=1024)
    message = str(err.value)
    assert "(optimizer state 393.2 GB)" in message and "\n" not in message
    assert "a GPU with more memory or a smaller model" in message


def test_an_engine_share_too_small_for_one_group_is_refused() -> None:
    # 0.15 x 24 GB = 3.6 GB < weights 0.99 GB + workspace 3 GB: no KV cache at all
    with pytest.raises(sizing.PlanDoesNotFit, match=r"^rollout engine needs .*raise rollout.gpu_memory_utilization"):
        _plan(gpu_memory_utilization=0.15)


@settings(max_examples=200, deadline=None)
@given(utilization=st.floats(0.05, 0.95), sleeps=st.booleans(), gpu_gb=st.sampled_from([16, 24, 40, 48, 80, 141]),
       chunk=st.sampled_from([0, 1024, 4096]), processes=st.sampled_from([1, 2, 4]))
def test_a_plan_either_fits_every_phase_or_is_refused(utilization: float, sleeps: bool, gpu_gb: int, chunk: int,
                                                      processes: int) -> None:
    """Property: an accepted plan holds both phases within the usable memory and its engine holds a
    group; sleeping never needs more than staying awake."""
    try:
        plan = _plan(gpu_memory_utilization=utilization, engine_sleeps=sleeps, gpu_memory_bytes=gpu_gb * GB,
                     logprob_chunk_tokens=chunk, train_processes=processes)
    except sizing.PlanDoesNotFit as err:
        assert "\n" not in str(err)
        return
    assert max(plan.rollout_bytes, plan.train_bytes) == plan.peak_bytes <= plan.usable_bytes
    assert plan.engine.full_length_sequences >= 16
    if not sleeps:
        assert _plan(gpu_memory_utilization=utilization, engine_sleeps=True, gpu_memory_bytes=gpu_gb * GB,
                     logprob_chunk_tokens=chunk, train_processes=processes).peak_bytes <= plan.peak_bytes


def test_the_printed_plan_shows_both_phases_from_the_plan() -> None:
    plan = _plan()
    text = sizing.format_shared_plan(plan)
    assert f"rollout : {plan.rollout_bytes / GB:.1f} GB" in text
    assert f"train   : {plan.train_bytes / GB:.1f} GB" in text and "engine asleep" in text
    assert "63 sequences of 4096 tokens" in text and "infra/sizing.py" in text
