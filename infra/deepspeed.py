"""The DeepSpeed config dict of one training step, built from plain scalars.

The training worker (engines/train/engine.py: build_engine) passes this dict to ``deepspeed.initialize``. It
fixes the choices that matter for a DAPO step:

- ZeRO stage 1, 2 or 3 (optimizer states / + gradients / + parameters partitioned over ranks);
- precision: fp32, or bf16 with fp32 master weights held by DeepSpeed's optimizer wrapper;
- torch's AdamW (``torch_adam``: no JIT-compiled fused/CPU Adam, which would spend ~100 s
  compiling on a machine without CUDA, see ../shared/notes/stack-on-cpu.md);
- gradient-norm clipping.

The learning-rate warm-up is not DeepSpeed's ``WarmupLR`` (its linear form runs the first two
updates at lr 0): the worker passes its own schedule (``engines/train/engine.py:
warmup_lr_factor``), which DeepSpeed saves and restores with the optimizer state.

Gradient scaling is NOT configured here: the worker scales each micro-batch loss so that the
gradient DeepSpeed ends up with is exactly the gradient of the mini-batch's token-mean loss
(see ``engines/train/step.py: backward_scale``).
"""

from __future__ import annotations

from typing import Any

PRECISIONS = ("fp32", "bf16")
ZERO_STAGES = (1, 2, 3)


def build_deepspeed_config(
    *,
    zero_stage: int,
    precision: str,
    micro_batch_samples: int,
    gradient_accumulation_steps: int,
    world_size: int,
    lr: float,
    betas: tuple[float, float],
    weight_decay: float,
    adam_eps: float,
    grad_clip_norm: float,
) -> dict[str, Any]:
    """The config dict for ``deepspeed.initialize``.

    Args:
        zero_stage: 1, 2 or 3.
        precision: "fp32" or "bf16".
        micro_batch_samples: samples per forward/backward on one rank.
        gradient_accumulation_steps: micro-batches per rank per optimizer update.
        world_size: data-parallel processes (DeepSpeed checks
            train_batch_size == micro * accumulation * world_size).
        lr: peak learning rate (the worker's warm-up schedule scales it).
        betas: AdamW (beta1, beta2).
        weight_decay: AdamW decoupled weight decay.
        adam_eps: AdamW epsilon.
        grad_clip_norm: clip the global gradient 2-norm to this value; 0 = no clipping.
    """
    if zero_stage not in ZERO_STAGES:
        raise ValueError(f"zero_stage must be one of {ZERO_STAGES}, got {zero_stage}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    for name, value in (
        ("micro_batch_samples", micro_batch_samples),
        ("gradient_accumulation_steps", gradient_accumulation_steps),
        ("world_size", world_size),
    ):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if lr <= 0:
        raise ValueError(f"lr must be > 0, got {lr}")
    if grad_clip_norm < 0 or weight_decay < 0:
        raise ValueError("grad_clip_norm and weight_decay must be >= 0")

    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro_batch_samples,
        "gradient_accumulation_steps": gradient_accumulation_steps,
        "train_batch_size": micro_batch_samples * gradient_accumulation_steps * world_size,
        "gradient_clipping": float(grad_clip_norm),
        "optimizer": {
            "type": "AdamW",
            "params": {
                "lr": lr,
                "betas": list(betas),
                "eps": adam_eps,
                "weight_decay": weight_decay,
                "torch_adam": True,
            },
        },
        "zero_optimization": {"stage": zero_stage},
        "bf16": {"enabled": precision == "bf16"},
        "fp16": {"enabled": False},
        "steps_per_print": 1 << 30,  # the worker reports its own metrics
        "wall_clock_breakdown": False,
    }
    if precision == "bf16":
        # Accumulate micro-batch gradients in fp32: bf16 accumulation over many micro-batches
        # loses the small per-token contributions of a token-level mean (paper sec. 3.3).
        config["data_types"] = {"grad_accum_dtype": "fp32"}
    if zero_stage == 3:
        # The export gathers the fp32 master weights itself (safe_get_full_fp32_param), so the
        # 16-bit consolidated copy DeepSpeed could add to every checkpoint is not needed.
        config["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] = False
    return config
