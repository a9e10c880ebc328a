"""One DAPO training step on this rank's DeepSpeed engine: old log-probs, then one update per mini-batch.

``StepRunner`` holds the engine across the steps of one launch or warm group and runs
``run_step`` once per rollout step: 1. batch: kept rows, policy lags, this rank's micro-batch
plan; 2. old log-probs of the parent, the proximal policy eq. 10 clips around, with the behaviour
weight of dapo_core/correction.py per ``behaviour_correction``; 3. updates: ``updates_per_step``
seeded mini-batches (sec. 4.1), the token-level loss over the whole mini-batch across ranks
(eq. 12, sec. 3.3; ``backward_scale``); 4. metrics reduced over ranks. Saving is
engines/train/checkpoint.py's. Any failure raises ``TrainStepFailure`` with the step named.

Design notes (each phase in full): docs/ALGORITHM.md, "Training step (engines/train/step.py)".
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from dapo_core.correction import behaviour_weights
from dapo_core.losses import policy_loss
from engines.train import batch as tb
from engines.train.checkpoint import ds_state_matches, load_ds_state, save_and_export
from engines.train.dist import all_reduce_scalars, rank_device
from engines.train.engine import build_engine, forward_log_probs, probe_logits
from engines.train.plan import (
    MicroPlan,
    StepBatch,
    load_step_batch,
    rank_plan,
    step_mini_batches,
)
from engines.train.spec import TrainStepFailure, WorkerSpec

# Per-token fractions of policy_loss's metrics, summed weighted by each micro-batch's token count.
_TOKEN_WEIGHTED = ("clip_frac_low", "clip_frac_high", "dual_clip_frac", "approx_kl")


def _add_micro_batch(sums: dict[str, torch.Tensor], loss: torch.Tensor, metrics: dict[str, torch.Tensor],
                     weight: float) -> None:
    """Add one micro-batch's ``weight``-scaled loss and token-weighted ``_TOKEN_WEIGHTED`` metrics to
    ``sums`` (float64 tensors on the loss's device; nothing is read back to the host)."""
    n_tok = metrics["num_tokens"].detach().double() * weight
    terms = {"loss": loss.double() * weight, **{key: metrics[key].detach().double() * n_tok for key in _TOKEN_WEIGHTED}}
    for key, term in terms.items():
        sums[key] = sums[key] + term if key in sums else term


def backward_scale(*, world_size: int, accumulation_steps: int) -> float:
    """Factor on each micro-batch's loss so DeepSpeed's gradient is the mini-batch gradient.

    Each micro-batch loss is already ``sum(token losses) / T`` with T the token count of the
    whole mini-batch over all ranks (eq. 12), so the plain SUM of all micro-batch gradients of
    all ranks is the exact mini-batch gradient. DeepSpeed instead averages: ``engine.backward``
    divides by the gradient-accumulation steps and the data-parallel reduction divides by the
    world size. Multiplying by both undoes that.
    """
    return float(world_size * accumulation_steps)


@dataclass
class _PassSums:
    """Sums of the old-log-prob pass over real (non-filler) samples: this rank's, or all ranks'."""

    abs_delta: float = 0.0  # |old - rollout| over the response tokens
    resp_tokens: float = 0.0  # response tokens
    entropy: float = 0.0  # entropy of pi_old over the loss tokens
    loss_tokens: float = 0.0  # loss tokens
    weight_sum: float = 0.0  # behaviour weights over the loss tokens
    capped: float = 0.0  # loss tokens whose behaviour weight was capped
    max_delta: float = 0.0  # the largest |old - rollout| (a max, not a sum)
    # The same over the on-policy samples only (lag 0): the engine/trainer mismatch alone, which a
    # stale sample's policy change would otherwise hide.
    on_policy_abs_delta: float = 0.0
    on_policy_resp_tokens: float = 0.0
    on_policy_max_delta: float = 0.0

    def all_reduced(self) -> _PassSums:
        """The sums over every rank (two collectives: the sums, then the maxima)."""
        abs_delta, resp_tokens, entropy, loss_tokens, weight_sum, capped, on_abs, on_tokens = all_reduce_scalars(
            [self.abs_delta, self.resp_tokens, self.entropy, self.loss_tokens, self.weight_sum, self.capped,
             self.on_policy_abs_delta, self.on_policy_resp_tokens]
        )
        max_delta, on_max = all_reduce_scalars([self.max_delta, self.on_policy_max_delta], dist.ReduceOp.MAX)
        return _PassSums(abs_delta, resp_tokens, entropy, loss_tokens, weight_sum, capped, max_delta,
                         on_abs, on_tokens, on_max)


@dataclass(frozen=True)
class _OldLogProbs:
    """pi_old of eq. 10 for every planned micro-batch, and the pass's sums over all ranks."""

    log_probs: list[list[torch.Tensor]]  # [m][j]: token log-probs [b, l], on the CPU
    weights: list[list[torch.Tensor]]  # [m][j]: behaviour weights [b, l]; every [m] is empty when not correcting
    sums: _PassSums


@dataclass
class _UpdateSums:
    """This rank's record of a step's updates."""

    # the loss of each micro-batch (so, per mini-batch, its loss), and the token-weighted fractions
    sums: dict[str, float] = field(default_factory=lambda: {"loss": 0.0, **dict.fromkeys(_TOKEN_WEIGHTED, 0.0)})
    grad_norms: list[float] = field(default_factory=list)  # one per update
    lrs: list[float] = field(default_factory=list)  # the learning rate of each update
    updates: int = 0


class StepRunner:
    """Holds the engine across steps of one launch; one ``run_step`` per rollout step."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.device = rank_device()
        self.updates_done = spec.start_updates  # the parent's; counts on through every update of this engine
        self.head_calls: int | None = None  # output-head calls per forward with chunked log-probs (_plan)
        self.last_saved: tuple[int, int] | None = None  # (step, updates_done) of the last save()
        self.engine, self.pad_token_id = build_engine(spec, world_size=self.world_size)
        if spec.resume_ds_state:
            restored = load_ds_state(self.engine, Path(spec.resume_ds_state), world_size=self.world_size,
                                     zero_stage=spec.train.zero_stage)
            if restored != spec.start_updates:  # the schedule DeepSpeed restored is not where the parent's record says
                raise TrainStepFailure(f"{spec.resume_ds_state}: optimizer state after {restored} updates, but its "
                                       f"checkpoint records {spec.start_updates}")

    def run_step(self, step: int, shards: list[str], parent_version: int) -> dict[str, Any]:
        """One training step on ``shards``; ``parent_version`` is the step of the checkpoint being
        updated (the proximal policy), against which each sample's policy lag is measured."""
        timings: dict[str, float] = {}
        t0 = time.perf_counter()
        sb = load_step_batch(shards, step=step, parent_version=parent_version, train=self.spec.train,
                             pad_token_id=self.pad_token_id)
        plan, gas = self._plan(sb.batch, step)
        timings["batch_s"] = time.perf_counter() - t0

        # --- old log-probs with the training engine, before any update (pi_old of eq. 10) ---
        t0 = time.perf_counter()
        old = self._old_log_probs(sb, plan, step)
        timings["old_log_probs_s"] = time.perf_counter() - t0

        # --- one optimizer update per mini-batch ---
        t0 = time.perf_counter()
        updates = self._updates(sb, plan, old, gas, step)
        timings["updates_s"] = time.perf_counter() - t0
        return self._metrics(step, sb, old.sums, updates, gas, timings)

    def _forward_log_probs(self, mb: tb.TrainBatch, *, entropy_mask: torch.Tensor | None = None
                           ) -> tuple[torch.Tensor, float | None]:
        """train_engine.forward_log_probs with this launch's engine, device and chunking."""
        return forward_log_probs(self.engine, mb, device=self.device, chunk_tokens=self.spec.train.logprob_chunk_tokens,
                                 head_calls=self.head_calls, entropy_mask=entropy_mask)

    def _plan(self, batch: tb.TrainBatch, step: int) -> tuple[MicroPlan, int]:
        """(this rank's micro-batch plan, gradient-accumulation steps); sets the engine to match."""
        train, W = self.spec.train, self.world_size
        if train.logprob_chunk_tokens:
            # Chunks per forward from the whole batch's width, which every rank knows: micro-batches
            # are trimmed to their own length, but under ZeRO-3 each head call is a collective
            # gather, so all ranks must make the same number of calls (dapo_core/logprobs.py).
            self.head_calls = -(-(batch.input_ids.shape[1] - 1) // train.logprob_chunk_tokens)
        minis, gas = step_mini_batches(batch.num_samples, train, step=step, world_size=W)
        # Only the loss scaling in engine.backward and the sample count read this; where the optimizer
        # steps is set explicitly per micro-batch (_update_mini_batch).
        self.engine.set_train_batch_size(train.micro_batch_samples * gas * W)
        plan = rank_plan(minis, gas, rank=self.rank, world_size=W, micro_batch_samples=train.micro_batch_samples)
        return plan, gas

    def _old_log_probs(self, sb: StepBatch, plan: MicroPlan, step: int) -> _OldLogProbs:
        """pi_old of every planned micro-batch, before any update, with its behaviour weights and
        the pass's sums over all ranks (which need at least one loss token)."""
        self.engine.eval()
        old_lp: list[list[torch.Tensor]] = []
        behav_w: list[list[torch.Tensor]] = []  # [m][j]: behaviour weights [b, l] when ``correct``
        local = _PassSums()
        with torch.no_grad():
            for micro in plan:
                row: list[torch.Tensor] = []
                w_row: list[torch.Tensor] = []
                for idx, weight in micro:
                    lp, w = self._old_micro_batch(sb, idx, weight, local)
                    row.append(lp)
                    if w is not None:
                        w_row.append(w)
                old_lp.append(row)
                behav_w.append(w_row)
        sums = local.all_reduced()
        if sums.loss_tokens == 0:
            raise TrainStepFailure(f"step {step}: no token to train on after masking")
        return _OldLogProbs(log_probs=old_lp, weights=behav_w, sums=sums)

    def _old_micro_batch(self, sb: StepBatch, idx: list[int], weight: float, local: _PassSums
                         ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(pi_old log-probs [b, l] on the CPU, behaviour weights or None when not correcting) of one
        micro-batch; adds its statistics to ``local`` (a zero-weight filler adds none)."""
        mb = tb.select(sb.batch, idx)
        lp, entropy_sum = self._forward_log_probs(mb, entropy_mask=mb.loss_mask if weight else None)
        lp = lp.float().cpu()
        w: torch.Tensor | None = None
        if sb.correct:
            w, w_metrics = behaviour_weights(
                lp, mb.rollout_log_probs, mb.loss_mask, cap=self.spec.train.correction_cap,
                sample_mask=None if sb.correct_samples is None else sb.correct_samples[list(idx)])
            n_w = float(w_metrics["num_tokens"]) * weight
            if n_w:
                local.weight_sum += float(w_metrics["weight_mean"]) * n_w
                local.capped += float(w_metrics["capped_frac"]) * n_w
        if weight == 0.0:
            return lp, w
        resp = mb.response_mask
        abs_delta = (lp - mb.rollout_log_probs).abs()
        delta = abs_delta[resp]
        local.abs_delta += float(delta.sum())
        local.resp_tokens += float(resp.sum())
        local.max_delta = max(local.max_delta, float(delta.max()) if delta.numel() else 0.0)
        on_policy = abs_delta[resp & ~sb.stale[list(idx)][:, None]]
        local.on_policy_abs_delta += float(on_policy.sum())
        local.on_policy_resp_tokens += float(on_policy.numel())
        local.on_policy_max_delta = max(local.on_policy_max_delta, float(on_policy.max()) if on_policy.numel() else 0.0)
        # Entropy of pi_old over the loss tokens (sec. 3.1 watches it collapse).
        assert entropy_sum is not None  # a real sample's forward was given its entropy mask
        local.entropy += entropy_sum
        local.loss_tokens += float(mb.loss_mask[:, 1:].sum())
        return lp, w

    def _updates(self, sb: StepBatch, plan: MicroPlan, old: _OldLogProbs, gas: int, step: int) -> _UpdateSums:
        """One optimizer update per mini-batch that has a loss token, in each of ``epochs_per_step``
        passes over the same mini-batches (every pass clips around the same pi_old)."""
        self.engine.train()
        scale = backward_scale(world_size=self.world_size, accumulation_steps=gas)
        record = _UpdateSums()
        passes = [(m, micro) for _ in range(self.spec.train.epochs_per_step) for m, micro in enumerate(plan)]
        for m, micro in passes:
            mini_tokens, mini_sequences = _mini_batch_normalisers(sb.batch, micro, self.spec.train.loss_agg)
            if mini_tokens == 0:
                continue  # every sample of this mini-batch is overlong-filtered: nothing to learn
            lr_now = float(self.engine.get_lr()[0])
            self._update_mini_batch(sb, micro, m, old, mini_tokens=mini_tokens, mini_sequences=mini_sequences,
                                    scale=scale, sums=record.sums, step=step)
            grad_norm = self.engine.get_global_grad_norm()
            grad_norm = float(grad_norm) if grad_norm is not None else float("nan")
            if not math.isfinite(grad_norm):
                raise TrainStepFailure(f"step {step}: gradient norm is {grad_norm} (mini-batch {m}); nothing published")
            record.grad_norms.append(grad_norm)
            record.lrs.append(lr_now)
            record.updates += 1
            self.updates_done += 1
        return record

    def _update_mini_batch(self, sb: StepBatch, micro: list[tuple[list[int], float]], m: int, old: _OldLogProbs, *,
                           mini_tokens: float, mini_sequences: float | None, scale: float, sums: dict[str, float],
                           step: int) -> None:
        """Forward/backward every micro-batch of mini-batch ``m``, then its one optimizer step; adds
        the loss and the token-weighted clip/KL fractions to ``sums``.

        The micro-batches' loss, finiteness and metrics are summed on the device and read once, at
        the mini-batch's boundary: reading each (``float(loss)``) would wait for the GPU's queue to
        drain after every micro-batch."""
        device_sums: dict[str, torch.Tensor] = {}
        finite: torch.Tensor | bool = True
        steps_before = self.engine.global_steps
        for j, (idx, weight) in enumerate(micro):
            # The last micro-batch of the mini-batch is the accumulation boundary (gradient
            # reduction, optimizer and LR-schedule step), set explicitly: DeepSpeed's own rule,
            # (micro_steps + 1) % gas == 0, counts micro-batches since the engine was built, so a
            # warm engine whose gas changed with the batch size would step mid-mini-batch.
            self.engine.set_gradient_accumulation_boundary(j == len(micro) - 1)
            mb = tb.select(sb.batch, idx)
            loss, metrics = self._micro_batch_loss(mb, old.log_probs[m][j], old.weights[m][j] if sb.correct else None,
                                                   mini_tokens=mini_tokens, mini_sequences=mini_sequences)
            finite = torch.isfinite(loss.detach()) & finite
            self.engine.backward(loss * (weight * scale))
            _add_micro_batch(device_sums, loss.detach(), metrics, weight)
            if j == len(micro) - 1:
                # All ranks agree before stepping: a NaN anywhere stops the step everywhere.
                (all_finite,) = all_reduce_scalars([1.0 if bool(finite) else 0.0], dist.ReduceOp.MIN)
                if all_finite < 1.0:
                    raise TrainStepFailure(f"step {step}: loss is not finite (mini-batch {m}); nothing published")
            self.engine.step()
            if self.engine.global_steps != steps_before + (j == len(micro) - 1):
                raise TrainStepFailure(f"step {step}: DeepSpeed's optimizer step did not follow the last "
                                       f"micro-batch of mini-batch {m} (micro-batch {j} of {len(micro)})")
        for key, total in device_sums.items():
            sums[key] += float(total)

    def _micro_batch_loss(self, mb: tb.TrainBatch, old_lp: torch.Tensor, weights: torch.Tensor | None, *,
                          mini_tokens: float, mini_sequences: float | None
                          ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The current policy's eq. 10 loss on ``mb`` (with its gradient) and policy_loss's metrics;
        ``weights``: the behaviour weights of ``mb``'s tokens, None when not correcting."""
        spec, device = self.spec, self.device
        lp, _ = self._forward_log_probs(mb)
        old = old_lp.to(device)
        mask = mb.loss_mask.to(device)
        advantages = mb.advantages.to(device)
        if weights is not None:
            # Decoupled PPO (AReaL; dapo_core/correction.py): eq. 10 clips around pi_old = the
            # parent (proximal policy), and each token's loss is weighted by the detached
            # min(pi_old / pi_rollout, cap). A positive per-token weight on the loss equals
            # scaling the advantage: eq. 10's min/max of the clipped terms is positively
            # homogeneous in A (the dual clip too).
            advantages = advantages * weights.to(device)
        return policy_loss(
            lp.float(), old, advantages, mask,
            eps_low=spec.train.eps_low, eps_high=spec.train.eps_high, dual_clip_c=spec.train.dual_clip_c,
            agg=spec.train.loss_agg, total_sequences=mini_sequences,
            total_tokens=mini_tokens if spec.train.loss_agg == "token-mean" else None,
            max_response_tokens=spec.train.loss_norm_tokens or None,
        )

    def _metrics(self, step: int, sb: StepBatch, old: _PassSums, record: _UpdateSums, gas: int,
                 timings: dict[str, float]) -> dict[str, Any]:
        """The step's metrics: the update sums reduced over all ranks, over the pass's token counts."""
        keys = list(record.sums)
        totals = dict(zip(keys, all_reduce_scalars([record.sums[k] for k in keys])))
        loss_tokens, correct = old.loss_tokens, sb.correct
        total_update_tokens = loss_tokens * self.spec.train.epochs_per_step  # each pass updates on every loss token once
        return {
            "step": step,
            "loss": totals["loss"] / max(record.updates, 1),  # mean over updates of each mini-batch's loss
            "entropy": old.entropy / loss_tokens,
            "clip_frac_low": totals["clip_frac_low"] / total_update_tokens,
            "clip_frac_high": totals["clip_frac_high"] / total_update_tokens,
            "dual_clip_frac": totals["dual_clip_frac"] / total_update_tokens,
            "approx_kl": totals["approx_kl"] / total_update_tokens,
            # Behaviour correction over the loss tokens (uncorrected samples count 1); NaN when off.
            "behaviour_weight_mean": old.weight_sum / loss_tokens if correct else float("nan"),
            "behaviour_weight_capped_fraction": old.capped / loss_tokens if correct else float("nan"),
            "policy_lag_mean": float(sb.lags.double().mean()),
            "policy_lag_max": int(sb.lags.max()),
            "stale_sample_fraction": float(sb.stale.double().mean()),
            "grad_norm": sum(record.grad_norms) / len(record.grad_norms) if record.grad_norms else float("nan"),
            "grad_norms": record.grad_norms,
            "lr": record.lrs[-1] if record.lrs else float("nan"),
            "lrs": record.lrs,  # each update's, in order
            "tokens": int(loss_tokens),
            "samples": sb.batch.num_samples,
            "masked_samples": int(sb.batch.loss_masked.sum()),
            "updates": record.updates,
            "updates_done": self.updates_done,
            "accumulation_steps": gas,
            "world_size": self.world_size,
            "logprob_mismatch_mean_abs": old.abs_delta / max(old.resp_tokens, 1.0),
            "logprob_mismatch_max_abs": old.max_delta,
            # NaN when no sample is on-policy (a batch of carried surplus, or a pipelined step).
            "logprob_mismatch_on_policy_mean_abs": (old.on_policy_abs_delta / old.on_policy_resp_tokens
                                                    if old.on_policy_resp_tokens else float("nan")),
            "logprob_mismatch_on_policy_max_abs": old.on_policy_max_delta if old.on_policy_resp_tokens else float("nan"),
            "timings": timings,
        }

    def probe(self, input_ids: list[list[int]]) -> torch.Tensor:
        """Logits of the updated policy on ``input_ids`` (equal-length rows), for export tests."""
        return probe_logits(self.engine, input_ids, device=self.device)

    def save(self, last_step: int) -> dict[str, float]:
        """Write ds_state/ (all ranks) and the consolidated HF export (rank 0) into out_dir."""
        timings = save_and_export(self.engine, self.spec, rank=self.rank, world_size=self.world_size,
                                  updates_done=self.updates_done, last_step=last_step)
        self.last_saved = (last_step, self.updates_done) if self.spec.train.keep_optimizer_state else None
        return timings

    def can_continue_from(self, resume_ds_state: str | None) -> bool:
        """True when the in-memory engine is exactly what loading ``resume_ds_state`` would give
        (engines/train/checkpoint.py: ds_state_matches)."""
        return ds_state_matches(resume_ds_state, self.last_saved, world_size=self.world_size,
                                zero_stage=self.spec.train.zero_stage)


def _mini_batch_normalisers(batch: tb.TrainBatch, micro: list[tuple[list[int], float]], loss_agg: str
                            ) -> tuple[float, float | None]:
    """(loss tokens, the sequence count ``loss_agg`` divides by, or None) of the whole mini-batch
    whose share on this rank is ``micro``, over every rank (one collective)."""
    # The loss denominators are those of the whole mini-batch over every rank, so the summed
    # micro-batch gradients equal the mini-batch gradient whatever the split (sec. 3.3).
    real = [tb.select(batch, idx).loss_mask for idx, w in micro if w > 0]
    mini_tokens, mini_seqs_valid, mini_seqs = all_reduce_scalars([
        sum(float(m.sum()) for m in real),
        sum(float((m.sum(dim=-1) > 0).sum()) for m in real),
        sum(float(m.shape[0]) for m in real),
    ])
    # seq-mean-token-mean averages over responses with a loss token (an overlong-filtered
    # response is not a sample of the mean); Dr.GRPO's sum-norm over every response.
    mini_sequences = {"token-mean": None, "seq-mean-token-mean": mini_seqs_valid,
                      "seq-mean-token-sum-norm": mini_seqs}[loss_agg]
    return mini_tokens, mini_sequences
