"""The DeepSpeed engine of a training launch: building it from the parent checkpoint, and its forward passes.

``build_engine`` loads the parent HF checkpoint in fp32 (``load_policy``: partitioned from the
start under ZeRO-3) and wraps it in a DeepSpeed engine (ZeRO 1/2/3, fp32 or bf16, torch AdamW, the
paper's linear warm-up continued from the parent's update count (``warmup_scheduler``), gradient
clipping; the config is infra/deepspeed.py's).
``forward_log_probs`` gives the current policy's log-prob of every token (the old log-probs before
the first update, the new ones in each update) with the entropy the step reports, either from the
full logits or chunk by chunk from the hidden states (dapo_core/logprobs.py). ``probe_logits`` is
for the export tests. The step itself (engines/train_step.py) decides when each runs; restoring and
saving the optimizer state is engines/train_checkpoint.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from dapo_core.logprobs import chunked_token_log_probs
from dapo_core.metrics import token_mean_entropy
from engines import train_batch as tb
from engines.train_spec import WorkerSpec

if TYPE_CHECKING:
    from deepspeed import DeepSpeedEngine
    from transformers import PreTrainedModel


def warmup_lr_factor(update_index: int, warmup_updates: int) -> float:
    """Linear warm-up: update u (0-based) runs at lr * min(1, (u + 1) / warmup_updates).

    The paper warms the learning rate up linearly over its first 20 rollout steps (sec. 4.1).
    The first update already moves (lr / warmup_updates), unlike DeepSpeed's WarmupLR.
    """
    if warmup_updates <= 0:
        return 1.0
    return min(1.0, (update_index + 1) / warmup_updates)


def warmup_scheduler(optimizer: torch.optim.Optimizer, *, warmup_updates: int, updates_done: int
                     ) -> torch.optim.lr_scheduler.LambdaLR:
    """The linear warm-up (:func:`warmup_lr_factor`) over ``optimizer``, standing after ``updates_done``
    updates: the next update runs at ``lr * warmup_lr_factor(updates_done, warmup_updates)``, as it
    would after that many steps of a schedule started at 0 (``last_epoch``, torch's resume index).

    The updates done travel with the checkpoint (storage/checkpoints.py: CheckpointInfo.optimizer_updates),
    so a step that starts a fresh optimizer (``resume_optimizer: false``, a parent without its
    optimizer state) continues the warm-up instead of restarting it at every step.
    """
    if updates_done < 0:
        raise ValueError(f"updates_done={updates_done} must be >= 0")
    for group in optimizer.param_groups:
        group.setdefault("initial_lr", group["lr"])  # what torch sets itself on a schedule started at 0
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda u: warmup_lr_factor(u, warmup_updates),
                                             last_epoch=updates_done - 1)


def load_policy(parent: str, ds_config: dict[str, Any], *, zero_stage: int, weights: bool = True) -> PreTrainedModel:
    """The parent HF checkpoint as the model DeepSpeed trains (fp32 parameters; DeepSpeed casts them
    under ``precision: bf16``). Collective under ZeRO-3: every rank calls it.

    ``weights=False`` builds it from the parent's config with its parameters left uninitialised, for
    a step that resumes the parent's DeepSpeed state, which restores every weight (module states and
    optimizer partitions, engines/train_checkpoint.py: load_ds_state): the parent's HF weights are
    neither read nor fetched then (engines/train_checkpoint.py: parent_fetch_skip).

    ZeRO-3 (the paper config's) builds it partitioned, inside DeepSpeed's ``zero.Init``,
    which transformers enters while an ``HfDeepSpeedConfig`` of a stage-3 config is alive: each rank
    holds 1/world of every parameter from the start and the checkpoint's tensors are read through
    memory maps, one parameter gathered at a time. Loaded whole on every rank instead, a node of the
    paper config's 8 ranks would hold 8 x 131 GB of fp32 weights at once on a 900 GiB pod.
    ZeRO-1/2 keep a whole copy of the parameters on every rank anyway.
    """
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    def load() -> PreTrainedModel:
        if weights:
            return AutoModelForCausalLM.from_pretrained(parent, dtype=torch.float32)
        with no_init_weights():  # the resumed state overwrites every parameter
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(parent), dtype=torch.float32)
        model.tie_weights()  # tied as from_pretrained ties them (skipped with the initialisation)
        return model

    if zero_stage != 3:
        return load()
    from transformers.integrations import HfDeepSpeedConfig
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    zero3 = HfDeepSpeedConfig(ds_config)  # held through a weak reference: it must live while loading
    try:
        return load()
    finally:
        # Later loads in this process are no collective: the export builds its layout on rank 0 alone
        # (engines/train_checkpoint.py).
        unset_hf_deepspeed_config()
        del zero3


def build_engine(spec: WorkerSpec, *, world_size: int) -> tuple[DeepSpeedEngine, int]:
    """(DeepSpeed engine over the parent checkpoint, its pad token id); seeded with ``train.seed``.

    Collective (``deepspeed.initialize``): every rank of the group calls it.
    """
    import deepspeed

    from infra.deepspeed import build_deepspeed_config

    torch.manual_seed(spec.train.seed)
    ds_config = build_deepspeed_config(
        zero_stage=spec.train.zero_stage,
        precision=spec.train.precision,
        micro_batch_samples=spec.train.micro_batch_samples,
        gradient_accumulation_steps=1,  # set per step from the batch (set_train_batch_size)
        world_size=world_size,
        lr=spec.train.lr,
        betas=(spec.train.beta1, spec.train.beta2),
        weight_decay=spec.train.weight_decay,
        adam_eps=spec.train.adam_eps,
        grad_clip_norm=spec.train.grad_clip_norm,
    )
    model = load_policy(spec.parent_checkpoint, ds_config, zero_stage=spec.train.zero_stage,
                        weights=spec.resume_ds_state is None)
    pad_token_id = int(model.config.pad_token_id if model.config.pad_token_id is not None else 0)
    if spec.train.activation_checkpointing:
        # Keep only each layer's input in forward; recompute the rest in backward.
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    warmup = spec.warmup_updates
    # A resumed state restores the schedule's own state (engines/train_checkpoint.py: load_ds_state),
    # which went on from the same start; a fresh optimizer's schedule starts where the parent's stood.
    updates_done = 0 if spec.resume_ds_state is not None else spec.start_updates

    def make_scheduler(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
        return warmup_scheduler(optimizer, warmup_updates=warmup, updates_done=updates_done)

    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=ds_config, lr_scheduler=make_scheduler
    )
    return engine, pad_token_id


def forward_log_probs(engine: DeepSpeedEngine, mb: tb.TrainBatch, *, device: torch.device, chunk_tokens: int,
                      head_calls: int | None, entropy_mask: torch.Tensor | None = None
                      ) -> tuple[torch.Tensor, float | None]:
    """(token log-probs [b, l], entropy summed over ``entropy_mask`` or None) of the current policy.

    ``entropy_mask`` [b, l] selects the positions whose predicting distribution's entropy is
    summed (position p: the distribution over token p). With ``chunk_tokens``
    (``logprob_chunk_tokens``) the logits come from the hidden states chunk by chunk
    (dapo_core/logprobs.py), in ``head_calls`` output-head calls; the model's own head then
    computes one position only (``logits_to_keep=1``).
    """
    ids = mb.input_ids.to(device)
    attention = mb.attention_mask.to(device).long()
    if not chunk_tokens:
        logits = engine(input_ids=ids, attention_mask=attention).logits
        entropy_sum = None
        if entropy_mask is not None:
            # logits at p - 1 gave token p, and position 0 is always a prompt token.
            shifted = entropy_mask[:, 1:].to(device)
            entropy_sum = float(token_mean_entropy(logits[:, :-1], shifted)) * float(shifted.sum())
        return tb.token_log_probs(logits, ids), entropy_sum
    captured: dict[str, torch.Tensor] = {}
    base = engine.module.model
    handle = base.register_forward_hook(lambda _m, _i, out: captured.__setitem__("hidden", out.last_hidden_state))
    try:
        engine(input_ids=ids, attention_mask=attention, logits_to_keep=1)
    finally:
        handle.remove()
    lp, entropy = chunked_token_log_probs(engine.module.lm_head, captured["hidden"], ids, chunk_tokens=chunk_tokens,
                                          with_entropy=entropy_mask is not None, num_chunks=head_calls)
    entropy_sum = None
    if entropy is not None and entropy_mask is not None:
        entropy_sum = float((entropy * entropy_mask.to(device)).sum())
    return lp, entropy_sum


def probe_logits(engine: DeepSpeedEngine, input_ids: list[list[int]], *, device: torch.device) -> torch.Tensor:
    """Logits of the engine's policy on ``input_ids`` (equal-length rows), for export tests."""
    engine.eval()
    with torch.no_grad():
        ids = torch.tensor(input_ids, dtype=torch.long, device=device)
        return engine(input_ids=ids).logits.float().cpu()
