"""Off-policy correction: behaviour-policy weights of the decoupled PPO objective.

A sample from an older policy (a carried dynamic-sampling surplus group, paper sec. 3.2, or a
pipelined rollout) is corrected as in the decoupled PPO objective (Hilton et al. 2021, arXiv
2110.00641; AReaL): eq. 10's clip is taken around the proximal policy (the trainer's parent), and
each token's loss is multiplied by the detached weight

    w = min(pi_prox / pi_behav, cap) = min(exp(prox_log_probs - behav_log_probs), cap)

truncated at ``cap`` as in TIS. ``behaviour_weights_reference`` is a slow per-token loop of the
same maths; tests check they agree. Shapes: ``B`` samples, ``L`` token positions.
Design notes (the two policies, why truncate): docs/ALGORITHM.md, "Off-policy correction (dapo_core/correction.py)".
"""

from __future__ import annotations

import math

import torch

__all__ = ["behaviour_weights", "behaviour_weights_reference", "policy_lags"]


def _check(prox: torch.Tensor, behav: torch.Tensor, mask: torch.Tensor, cap: float,
           sample_mask: torch.Tensor | None) -> None:
    if not (cap > 0 and math.isfinite(cap)):
        raise ValueError(f"cap must be a finite positive number, got {cap!r}")
    if prox.dim() != 2 or prox.shape != behav.shape or prox.shape != mask.shape:
        raise ValueError(f"prox_log_probs, behav_log_probs and mask must share one [B, L] shape, got "
                         f"{tuple(prox.shape)}, {tuple(behav.shape)}, {tuple(mask.shape)}")
    if sample_mask is not None and tuple(sample_mask.shape) != (prox.shape[0],):
        raise ValueError(f"sample_mask must have shape [B] = ({prox.shape[0]},), got {tuple(sample_mask.shape)}")


def behaviour_weights(
    prox_log_probs: torch.Tensor,
    behav_log_probs: torch.Tensor,
    mask: torch.Tensor,
    *,
    cap: float,
    sample_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token weights min(pi_prox / pi_behav, cap), detached, for the decoupled PPO loss.

    Args:
        prox_log_probs: [B, L] log-probs of the tokens under the proximal policy (the current
            parent, recomputed by the trainer).
        behav_log_probs: [B, L] log-probs recorded by the policy that generated the tokens.
        mask: [B, L] bool, the tokens that count in the loss (the metrics are over these).
        cap: truncation of the weight (> 0).
        sample_mask: [B] bool, the samples to correct; the others (and every token outside
            ``mask``) get weight exactly 1. None = every sample.
    Returns:
        (weights [B, L] float32, metrics) with detached 0-d metrics over the ``mask`` tokens:
        ``weight_mean`` (uncorrected samples count as 1; NaN with no token), ``capped_frac``
        (tokens whose ratio exceeded ``cap``), ``num_tokens``.
    """
    _check(prox_log_probs, behav_log_probs, mask, cap, sample_mask)
    with torch.no_grad():
        correct = mask.bool()
        if sample_mask is not None:
            correct = correct & sample_mask.bool()[:, None]
        ratio = torch.exp(prox_log_probs.float() - behav_log_probs.float())
        weights = torch.where(correct, torch.clamp(ratio, max=cap), torch.ones_like(ratio))
        capped = correct & (ratio > cap)
        valid = mask.bool()
        num_tokens = valid.sum()
        denom = num_tokens.clamp(min=1).float()
        nan = torch.tensor(float("nan"))
        metrics = {
            "weight_mean": torch.where(num_tokens > 0, (weights * valid).sum() / denom, nan),
            "capped_frac": torch.where(num_tokens > 0, capped.sum() / denom, nan),
            "num_tokens": num_tokens,
        }
    return weights, metrics


def behaviour_weights_reference(
    prox_log_probs: torch.Tensor,
    behav_log_probs: torch.Tensor,
    mask: torch.Tensor,
    *,
    cap: float,
    sample_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Slow per-token loop of ``behaviour_weights`` (same arguments; metrics as Python floats)."""
    _check(prox_log_probs, behav_log_probs, mask, cap, sample_mask)
    batch, width = prox_log_probs.shape
    weights = torch.ones(batch, width)
    total, capped, tokens = 0.0, 0, 0
    for b in range(batch):
        chosen = sample_mask is None or bool(sample_mask[b])
        for t in range(width):
            if not bool(mask[b, t]):
                continue
            tokens += 1
            if chosen:
                ratio = math.exp(float(prox_log_probs[b, t]) - float(behav_log_probs[b, t]))
                weights[b, t] = min(ratio, cap)
                capped += ratio > cap
            total += float(weights[b, t])
    nan = float("nan")
    return weights, {"weight_mean": total / tokens if tokens else nan,
                     "capped_frac": capped / tokens if tokens else nan, "num_tokens": float(tokens)}


def policy_lags(policy_versions: torch.Tensor, *, current_version: int) -> torch.Tensor:
    """Policy lag of each sample: how many checkpoints older than the one being updated its policy is.

    Args:
        policy_versions: [B] int, the training step whose checkpoint generated each sample.
        current_version: the step of the checkpoint being updated (the proximal policy); step s
            trains from checkpoint s - 1 (or an older one when steps in between were skipped).
    Returns:
        [B] int64, 0 for on-policy samples. A sample newer than the current policy is an error.
    """
    lags = current_version - policy_versions.long()
    if bool((lags < 0).any()):
        b = int(torch.nonzero(lags < 0)[0, 0])
        raise ValueError(f"sample {b} has policy_version {int(policy_versions[b])}, newer than the policy being "
                         f"updated (version {current_version})")
    return lags
