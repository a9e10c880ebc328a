"""One GPU shared by the vLLM engine and a DeepSpeed rank, as a local run shares it, measured against
the memory plan (infra/sizing.py: plan_shared_gpu).

A real-shaped model (Qwen2.5-0.5B's config.json from tests/data/model_configs, random bf16 weights, the
tiny tokenizer) goes through a DAPO step's GPU work on one GPU:

1. a rollout round on the in-process engine (engines/rollout/vllm_engine.py: engine_for_call with
   ``sleep_between_calls``), which then sleeps (level 1);
2. the train step on the warm worker group (engines/train/launch.py: train_step; bf16, ZeRO-1, a short
   batch of 8 x 512 tokens), while the device's used memory is sampled;
3. the next round: the engine woken, given the new checkpoint's weights, generating again.

Measured (device-wide, ``torch.cuda.mem_get_info``: every process on the GPU) against the plan's
figures, and written to ``$DAPO_GPU_RECORD`` (default: the test's tmp folder) as JSON and printed
(``-s``): the engine's share awake and asleep, the peak while the rank trains, and what the ranks keep
between steps. Asserted: the plan's promise (the peak fits the usable memory), sleep frees the engine's
share down to the plan's asleep allowance, and the ranks release their activations between steps.

vLLM's CUDA build may be missing on a GPU machine (too large to carry): then steps 1 and 3 skip, with
the reason, and the train step runs alone against the plan's training phase.

    python -m pytest tests/gpu/test_shared_gpu_step.py -v -s -x --timeout 900 -p no:cacheprovider
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason="needs a CUDA GPU (run on a GPU machine: see the module docstring)"),
    pytest.mark.slow,
]

REPO = Path(__file__).resolve().parents[2]
SHAPE = REPO / "tests" / "data" / "model_configs" / "Qwen2.5-0.5B"
SAMPLES, TOKENS, PROMPT_TOKENS = 8, 512, 32  # the short batch: 8 sequences of 512 tokens, one micro-batch of 4
MICRO_BATCH = 4
UTILIZATION = 0.3  # the engine's share while awake (configs/one-gpu.yaml's)
GIB = 2**30

if torch.cuda.is_available():
    sys.path.insert(0, str(REPO / "tests" / "integration"))
    from train_fixtures import scored_row, write_scored

    from engines.train import server as train_server
    from engines.rollout import vllm_engine
    from engines.train.launch import train_step
    from infra import model_shape, sizing
    from settings.train import TrainConfig

TRAIN = None if not torch.cuda.is_available() else TrainConfig(
    num_processes=1, zero_stage=1, precision="bf16", micro_batch_samples=MICRO_BATCH, updates_per_step=1, lr=1e-5,
    warmup_steps=1, activation_checkpointing=True, timeout_s=600.0, keep_workers_warm=True,
)


def _vllm_on_cuda() -> str:
    """Empty when vLLM's CUDA build imports here; else why the engine's part skips."""
    try:
        from vllm.platforms import current_platform
    except Exception as err:  # noqa: BLE001 - any import failure means no engine here
        return f"vLLM does not import here ({type(err).__name__}: {err}); its CUDA build is not installed"
    return "" if current_platform.is_cuda() else f"vLLM here is the {current_platform.device_type} build, not CUDA's"


def _used() -> int:
    """Bytes in use on GPU 0 by every process (the driver's engine and the ranks alike)."""
    free, total = torch.cuda.mem_get_info(0)
    return total - free


class PeakSampler:
    """Samples the device's used memory every 20 ms on a thread while the block runs; ``peak`` after."""

    def __init__(self) -> None:
        self.peak, self._stop = 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _used())
            time.sleep(0.02)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _used())


def _build_checkpoint(out: Path) -> Path:
    """Publish a step-0 checkpoint of Qwen2.5-0.5B's shape: random bf16 weights, the tiny tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    from engines.bootstrap.tiny_policy import build_tokenizer, save_checkpoint

    tokenizer = build_tokenizer()
    fields = json.loads((SHAPE / "config.json").read_text())
    fields.pop("torch_dtype", None)
    config = AutoConfig.for_model(fields.pop("model_type"), **fields, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.generation_config = GenerationConfig(pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    return save_checkpoint(model, tokenizer, out, step=0, produced_by="bootstrap", parent_checkpoint_id=None,
                           inputs={"test": "shared_gpu_step", "shape": SHAPE.name})


def _batch(path: Path, vocab: int) -> Path:
    """SAMPLES ScoredRollout rows of exactly TOKENS tokens (random ids of the model's vocabulary, +/-1 advantages)."""
    g = torch.Generator().manual_seed(0)
    response = TOKENS - PROMPT_TOKENS
    rows = [scored_row(f"s{i}", torch.randint(3, vocab, (PROMPT_TOKENS,), generator=g).tolist(),
                       torch.randint(3, vocab, (response,), generator=g).tolist(), 1.0 if i % 2 == 0 else -1.0,
                       log_probs=(-torch.rand(response, generator=g) * 3).tolist(), sample_index=i % 4)
            for i in range(SAMPLES)]
    return write_scored(path, rows)


def _plan(engine_sleeps: bool) -> Any:
    return sizing.plan_shared_gpu(
        model_shape.load_architecture(SHAPE), zero_stage=TRAIN.zero_stage, micro_batch_samples=MICRO_BATCH,
        tokens_per_sequence=TOKENS, samples_per_prompt=SAMPLES, train_processes=1,
        gpu_memory_bytes=torch.cuda.get_device_properties(0).total_memory, gpu_memory_utilization=UTILIZATION,
        engine_sleeps=engine_sleeps, logprob_chunk_tokens=TRAIN.logprob_chunk_tokens,
    )


def _round(checkpoint: Path, settings: Any) -> tuple[int, int]:
    """One rollout round on the in-process engine: ``(tokens generated, device bytes used while awake)``.
    Prompts use the tiny tokenizer's ids (vLLM refuses ids beyond the tokenizer's); responses are not
    decoded (the model's vocabulary is Qwen's)."""
    from vllm import SamplingParams

    prompts = [[3 + (i + j) % 20 for j in range(PROMPT_TOKENS)] for i in range(SAMPLES)]
    params = [SamplingParams(n=1, max_tokens=TOKENS - PROMPT_TOKENS, seed=i, detokenize=False, ignore_eos=True)
              for i in range(SAMPLES)]
    with vllm_engine.engine_for_call(checkpoint, settings) as (llm, _how):
        outputs = vllm_engine.generate(llm, prompts, params)
        awake = _used()
    return sum(len(o.outputs[0].token_ids) for o in outputs), awake


def _record(name: str, figures: dict[str, Any], tmp_path: Path) -> None:
    folder = Path(os.environ.get("DAPO_GPU_RECORD", tmp_path))
    folder.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"device": torch.cuda.get_device_name(0), **figures}, indent=2, sort_keys=True)
    (folder / f"{name}.json").write_text(text + "\n")
    print(f"\n{name}: {text}")


def _gib(value: int) -> float:
    return round(value / GIB, 2)


def test_engine_asleep_while_the_rank_trains_then_awake_with_the_new_weights(tmp_path: Path) -> None:
    why_not = _vllm_on_cuda()
    if why_not:
        pytest.skip(why_not + " (test_the_train_step_alone_fits_the_plans_training_phase runs the training part)")
    plan = _plan(engine_sleeps=True)
    ck0 = _build_checkpoint(tmp_path / "ck0")
    shard = _batch(tmp_path / "batch.parquet", json.loads((ck0 / "config.json").read_text())["vocab_size"])
    settings = vllm_engine.EngineSettings(dtype="bfloat16", max_model_len=TOKENS + 64, gpu_memory_utilization=UTILIZATION,
                                          max_num_seqs=64, enforce_eager=True, sleep_between_calls=True)
    train_server.stop_active()
    vllm_engine.clear_engine_cache()
    torch.cuda.init()
    before = _used()  # this process's CUDA context, no engine, no ranks
    try:
        tokens, awake = _round(ck0, settings)
        asleep = _used()
        assert tokens == SAMPLES * (TOKENS - PROMPT_TOKENS)
        with PeakSampler() as training:
            result = train_step(ck0, [shard], tmp_path / "ck1", step=1, config=TRAIN)
        between = _used()  # ranks warm (their states), engine asleep
        tokens_after, awake_after = _round(Path(result.checkpoint_dir), settings)
        assert tokens_after == SAMPLES * (TOKENS - PROMPT_TOKENS)  # woken, new weights loaded, generating
    finally:
        train_server.stop_active()
        vllm_engine.clear_engine_cache()
    states = sum(t.bytes for t in plan.rollout_terms if t.name in sizing.STATE_TERMS)
    figures = {
        "plan": {"rollout_gib": _gib(plan.rollout_bytes), "train_gib": _gib(plan.train_bytes),
                 "usable_gib": _gib(plan.usable_bytes), "engine_awake_gib": _gib(int(UTILIZATION * plan.gpu_memory_bytes)),
                 "engine_asleep_gib": _gib(sizing.ENGINE_ASLEEP_BYTES), "rank_states_gib": _gib(states)},
        "measured": {"baseline_gib": _gib(before), "engine_awake_gib": _gib(awake - before),
                     "engine_asleep_gib": _gib(asleep - before), "train_peak_gib": _gib(training.peak),
                     "ranks_between_steps_gib": _gib(between - asleep), "rollout_with_ranks_gib": _gib(awake_after)},
        "train_timings": result.timings,
    }
    _record("shared_gpu_step", figures, tmp_path)
    assert training.peak <= plan.usable_bytes, figures  # the plan said it fits: it does
    assert awake_after <= plan.usable_bytes, figures
    # Level 1 keeps no weights and no KV cache on the GPU: what stays is within the plan's allowance.
    assert asleep - before <= sizing.ENGINE_ASLEEP_BYTES, figures
    assert awake - asleep >= 0.5 * UTILIZATION * plan.gpu_memory_bytes, figures  # sleeping freed the share
    # The warm ranks hand their activations back between steps (engines/train/worker.py): what they keep is
    # their states and runtime, not the training peak.
    assert between - asleep <= states + sizing.RANK_RUNTIME_BYTES + GIB, figures


def test_the_train_step_alone_fits_the_plans_training_phase(tmp_path: Path) -> None:
    """The training part without vLLM (its CUDA build may be missing here): the rank's peak against the
    plan's training phase less the sleeping engine, and what the warm rank keeps after the step."""
    plan = _plan(engine_sleeps=True)
    ck0 = _build_checkpoint(tmp_path / "ck0")
    shard = _batch(tmp_path / "batch.parquet", json.loads((ck0 / "config.json").read_text())["vocab_size"])
    train_server.stop_active()
    torch.cuda.init()
    before = _used()
    try:
        with PeakSampler() as training:
            train_step(ck0, [shard], tmp_path / "ck1", step=1, config=TRAIN)
        between = _used()
    finally:
        train_server.stop_active()
    planned_training = plan.train_bytes - sizing.ENGINE_ASLEEP_BYTES
    states = sum(t.bytes for t in plan.train_terms if t.name in sizing.STATE_TERMS)
    figures = {"plan": {"train_without_engine_gib": _gib(planned_training), "rank_states_gib": _gib(states),
                        "usable_gib": _gib(plan.usable_bytes)},
               "measured": {"baseline_gib": _gib(before), "train_peak_gib": _gib(training.peak - before),
                            "rank_between_steps_gib": _gib(between - before)}}
    _record("shared_gpu_train_alone", figures, tmp_path)
    assert training.peak - before <= plan.usable_bytes, figures
    assert between - before <= states + sizing.RANK_RUNTIME_BYTES + GIB, figures
