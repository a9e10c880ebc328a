"""The DeepSpeed engine of a training launch: building it from the parent checkpoint, and its forward passes.

``build_engine`` loads the parent HF checkpoint in fp32 (``load_policy``: partitioned from the
start under ZeRO-3) and wraps it in a DeepSpeed engine (ZeRO 1/2/3, fp32 or bf16, torch AdamW, the
paper's linear warm-up continued from the parent's update count (``warmup_scheduler``), gradient
clipping; the config is infra/deepspeed.py's).
``forward_log_probs`` gives the current policy's log-prob of every token (the old log-probs before
the first update, the new ones in each update) with the entropy the step reports, either from the
full logits or chunk by chunk from the hidden states (dapo_core/logprobs.py). ``probe_logits`` is
for the export tests. The step itself (engines/train/step.py) decides when each runs; restoring and
saving the optimizer state is engines/train/checkpoint.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from dapo_core.logprobs import chunked_token_log_probs
from dapo_core.metrics import token_mean_entropy
from engines.train import batch as tb
from engines.train.spec import TrainStepFailure, WorkerSpec

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
    optimizer partitions, engines/train/checkpoint.py: load_ds_state): the parent's HF weights are
    neither read nor fetched then (engines/train/checkpoint.py: parent_fetch_skip).

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
        # (engines/train/checkpoint.py).
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
    # A resumed state restores the schedule's own state (engines/train/checkpoint.py: load_ds_state),
    # which went on from the same start; a fresh optimizer's schedule starts where the parent's stood.
    updates_done = 0 if spec.resume_ds_state is not None else spec.start_updates

    def make_scheduler(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
        return warmup_scheduler(optimizer, warmup_updates=warmup, updates_done=updates_done)

    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=ds_config, lr_scheduler=make_scheduler
    )
    return engine, pad_token_id


@dataclass(frozen=True)
class LogitRule:
    """What a causal LM's forward does to ``lm_head``'s output before it returns the logits: an
    operation with the value of one config attribute (no operation where the value is None)."""

    attribute: str
    apply: Callable[[torch.Tensor, float], torch.Tensor]  # (lm_head logits, the value) -> logits


def _soft_cap(logits: torch.Tensor, cap: float) -> torch.Tensor:
    # cap * tanh(logits / cap), in the order the models' forwards compute it (same rounding).
    return torch.tanh(logits / cap) * cap


_SOFT_CAP = LogitRule("final_logit_softcapping", _soft_cap)
_TIMES_LOGIT_SCALE = LogitRule("logit_scale", lambda logits, scale: logits * scale)
_OVER_LOGITS_SCALING = LogitRule("logits_scaling", lambda logits, scaling: logits / scaling)
_TIMES_LOGITS_SCALING = LogitRule("logits_scaling", lambda logits, scaling: logits * scaling)

# Causal LMs (config.model_type) whose forward post-processes lm_head's output, as transformers 5.19's
# *ForCausalLM.forward does it. Keyed by model type, not by attribute: the same attribute means
# different operations (Granite divides by logits_scaling, HyperCLOVA X multiplies by it).
LOGIT_RULES: dict[str, LogitRule] = {
    **dict.fromkeys(("gemma2", "gemma3_text", "gemma3n_text", "gemma4_text", "vaultgemma", "nanochat"), _SOFT_CAP),
    **dict.fromkeys(("cohere", "cohere2", "cohere2_moe", "cohere_compass_text"), _TIMES_LOGIT_SCALE),
    **dict.fromkeys(("granite", "granite_swa", "granitemoe", "granitemoe_swa", "granitemoeshared",
                     "granitemoehybrid"), _OVER_LOGITS_SCALING),
    "hyperclovax": _TIMES_LOGITS_SCALING,
    "recurrent_gemma": LogitRule("logits_soft_cap", _soft_cap),
}
_RULE_ATTRIBUTES = tuple(sorted({rule.attribute for rule in LOGIT_RULES.values()}))
_FALLBACK = "set logprob_chunk_tokens: 0 to take the log-probs from the model's own logits"


def logit_head(model: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """What ``model``'s forward does from its final hidden states to its logits: ``model.lm_head``,
    then its architecture's post-processing (``LOGIT_RULES``). ``model.lm_head`` itself where there is
    none, so a plain model's chunked log-probs are unchanged to the bit.

    Raises TrainStepFailure for a model without the ``model`` body and ``lm_head`` the chunked path
    reads, or whose config (or its text part, in a multimodal model) carries a post-processing
    attribute that no rule covers for its type: the chunked log-probs would be another policy's.
    """
    model_type = model.config.model_type
    if not (hasattr(model, "model") and hasattr(model, "lm_head")):
        raise TrainStepFailure(f"model_type {model_type!r} has no .model and .lm_head to chunk the log-probs "
                               f"from; {_FALLBACK}")
    config, lm_head = model.config.get_text_config(), model.lm_head
    rule = LOGIT_RULES.get(model_type)
    if rule is None:
        unknown = [a for a in _RULE_ATTRIBUTES if getattr(config, a, None) is not None]
        if unknown:
            raise TrainStepFailure(f"model_type {model_type!r} sets {', '.join(unknown)}, a logit "
                                   f"post-processing the chunked log-probs do not know; {_FALLBACK}")
        return lm_head
    value = getattr(config, rule.attribute, None)
    if value is None:
        return lm_head
    return lambda hidden: rule.apply(lm_head(hidden), value)


def _check_head(model_type: str, chunked: torch.Tensor, own_logits: torch.Tensor, ids: torch.Tensor) -> None:
    """Refuse if the chunked log-prob of the last token differs from the one the model's own forward
    gives (``own_logits`` [b, 1, V], predicting it): a safety net under ``LOGIT_RULES`` that costs no
    extra head call (a collective under ZeRO-3).

    The two head calls differ in shape, so their matmuls may round differently: a log-prob moves by
    up to ~2 ulps of the largest logit (target logit and log Z), so the bound is 4 of them in the
    logits' dtype (bf16: ~3% of the largest logit; fp32: ~5e-7 of it). A missing scale or soft-cap
    on a real model moves it by far more.
    """
    with torch.no_grad():
        own = torch.log_softmax(own_logits[:, 0].float(), dim=-1).gather(-1, ids[:, -1:]).squeeze(-1)
        ulp = torch.finfo(own_logits.dtype).eps * max(1.0, float(own_logits.abs().max()))
        worst = float((chunked[:, -1] - own).abs().max())
    if not worst <= 4 * ulp:  # also refuses NaN
        raise TrainStepFailure(f"model_type {model_type!r}: the chunked log-probs differ from the model's own "
                               f"forward by up to {worst:.3g} nats (an unknown logit post-processing?); {_FALLBACK}")


def forward_log_probs(engine: DeepSpeedEngine, mb: tb.TrainBatch, *, device: torch.device, chunk_tokens: int,
                      head_calls: int | None, entropy_mask: torch.Tensor | None = None
                      ) -> tuple[torch.Tensor, float | None]:
    """(token log-probs [b, l], entropy summed over ``entropy_mask`` or None) of the current policy.

    ``entropy_mask`` [b, l] selects the positions whose predicting distribution's entropy is
    summed (position p: the distribution over token p). With ``chunk_tokens``
    (``logprob_chunk_tokens``) the logits come from the hidden states chunk by chunk
    (dapo_core/logprobs.py), in ``head_calls`` calls of the model's head (``logit_head``: lm_head
    and the architecture's logit post-processing); the model's own head then computes two positions
    only (``logits_to_keep=2``), whose first checks the chunked result (``_check_head``).
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
    model = engine.module
    head = logit_head(model)
    captured: dict[str, torch.Tensor] = {}
    body = model.model
    handle = body.register_forward_hook(lambda _m, _i, out: captured.__setitem__("hidden", out.last_hidden_state))
    try:
        own_logits = engine(input_ids=ids, attention_mask=attention, logits_to_keep=2).logits
    finally:
        handle.remove()
    lp, entropy = chunked_token_log_probs(head, captured["hidden"], ids, chunk_tokens=chunk_tokens,
                                          with_entropy=entropy_mask is not None, num_chunks=head_calls)
    if ids.shape[1] >= 2:
        _check_head(model.config.model_type, lp, own_logits[:, :1], ids)
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
