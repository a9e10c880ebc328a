"""The DAPO clipped policy-gradient loss (paper sec. 3.1 clip-higher, sec. 3.3 token-level loss).

Per token, with ratio r = exp(log_probs - old_log_probs) and advantage A (eq. 8):

    l = -min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A)            (eq. 8 / eq. 10)

with an optional dual-clip for A < 0. ``agg`` turns the ``[B, L]`` token losses into one scalar:
``"token-mean"`` (DAPO eq. 12; pass ``total_tokens`` when a mini-batch is split into micro-batches),
``"seq-mean-token-mean"`` (GRPO) or ``"seq-mean-token-sum-norm"`` (Dr.GRPO). ``kl_beta > 0`` adds
GRPO's k3 KL estimate (DAPO drops it, sec. 2.3). ``policy_loss_reference`` is a slow per-token
loop of the same maths; tests check they agree.
Design notes (clip-higher, each aggregation, the micro-batch pitfall): docs/ALGORITHM.md, "Losses (dapo_core/losses.py)".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch

__all__ = ["AGGREGATIONS", "Aggregation", "aggregate", "policy_loss", "policy_loss_reference"]

Aggregation = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
Denominator = int | float | torch.Tensor | None  # a global count from outside the micro-batch, or None: local


def _validate(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    ref_log_probs: torch.Tensor | None,
    *,
    eps_low: float,
    eps_high: float,
    dual_clip_c: float | None,
    agg: str,
    total_tokens: int | float | torch.Tensor | None,
    total_sequences: int | float | torch.Tensor | None,
    max_response_tokens: int | None,
    kl_beta: float,
) -> None:
    if log_probs.dim() != 2:
        raise ValueError(f"log_probs must be [B, L], got shape {tuple(log_probs.shape)}")
    shape = log_probs.shape
    named = {"old_log_probs": old_log_probs, "advantages": advantages, "mask": mask}
    if ref_log_probs is not None:
        named["ref_log_probs"] = ref_log_probs
    for name, tensor in named.items():
        if tensor.shape != shape:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)}, expected [B, L] = {tuple(shape)} like log_probs")
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be a bool tensor [B, L], got dtype {mask.dtype}")
    if agg not in AGGREGATIONS:
        raise ValueError(f"agg must be one of {list(AGGREGATIONS)}, got {agg!r}")
    if not 0.0 <= eps_low < 1.0:
        raise ValueError(f"eps_low must be in [0, 1), got {eps_low}")
    if eps_high < 0.0:
        raise ValueError(f"eps_high must be >= 0, got {eps_high}")
    if dual_clip_c is not None and not dual_clip_c > 1.0:
        raise ValueError(f"dual_clip_c must be > 1 (or None to disable), got {dual_clip_c}")
    # Tensor denominators are not checked here: float() on a GPU tensor would force a device sync.
    if isinstance(total_tokens, (int, float)) and not total_tokens > 0:
        raise ValueError(f"total_tokens must be > 0, got {total_tokens}")
    if total_tokens is not None and agg != "token-mean":
        raise ValueError(f"total_tokens only applies to agg='token-mean' (got agg={agg!r}); use total_sequences")
    if isinstance(total_sequences, (int, float)) and not total_sequences > 0:
        raise ValueError(f"total_sequences must be > 0, got {total_sequences}")
    if total_sequences is not None and agg == "token-mean":
        raise ValueError("total_sequences does not apply to agg='token-mean'; use total_tokens")
    if max_response_tokens is not None and max_response_tokens < 1:
        raise ValueError(f"max_response_tokens must be >= 1, got {max_response_tokens}")
    if kl_beta < 0:
        raise ValueError(f"kl_beta must be >= 0, got {kl_beta}")
    if kl_beta > 0 and ref_log_probs is None:
        raise ValueError("kl_beta > 0 needs ref_log_probs [B, L] (the reference policy's log-probs)")


def policy_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    dual_clip_c: float | None = None,
    agg: Aggregation = "token-mean",
    total_tokens: int | float | torch.Tensor | None = None,
    total_sequences: int | float | torch.Tensor | None = None,
    max_response_tokens: int | None = None,
    ref_log_probs: torch.Tensor | None = None,
    kl_beta: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """DAPO clipped surrogate loss to minimise (eq. 10 with the eq. 12 token-level mean).

    Args:
        log_probs: ``[B, L]`` log pi_theta of each response token (carries the gradient).
        old_log_probs: ``[B, L]`` log pi_old of the same tokens (the policy that sampled them).
        advantages: ``[B, L]`` per-token advantage (usually a response's advantage broadcast).
        mask: ``[B, L]`` bool, True for response tokens that count (padding and overlong-filtered
            responses are False).
        eps_low: lower clip, ratio floor 1 - eps_low (paper: 0.2).
        eps_high: upper clip, ratio ceiling 1 + eps_high (paper clip-higher: 0.28).
        dual_clip_c: if set (> 1), a token with A < 0 loses at most -c * A (verl's dual-clip).
        agg: ``"token-mean"`` | ``"seq-mean-token-mean"`` | ``"seq-mean-token-sum-norm"``.
        total_tokens: token-mean denominator; pass the valid-token count of the whole mini-batch
            when this call sees one micro-batch of it. Default: ``mask.sum()``.
        total_sequences: seq-mean denominator for the seq-mean aggregations, likewise for the
            whole mini-batch. Default: rows with >= 1 valid token (seq-mean-token-mean) or B
            (seq-mean-token-sum-norm).
        max_response_tokens: Dr.GRPO's constant per-response normaliser. Default ``L``.
        ref_log_probs: ``[B, L]`` log pi_ref, needed only when ``kl_beta > 0``.
        kl_beta: coefficient of the per-token k3 KL(pi_theta || pi_ref) term; DAPO uses 0.

    Returns:
        ``(loss, metrics)``: ``loss`` a scalar with gradient; ``metrics`` detached scalars over this
        call's valid tokens: ``pg_loss``, ``clip_frac_low`` (A < 0 and r < 1 - eps_low: the low
        clip is active, no gradient), ``clip_frac_high`` (A > 0 and r > 1 + eps_high),
        ``dual_clip_frac`` (A < 0 and r > c), ``approx_kl`` (k3 estimate of KL(pi_old || pi_theta),
        the drift since sampling), ``num_tokens``, and ``kl_ref`` when ``kl_beta > 0``.
        A call with no valid token returns a zero loss (still attached to the graph).
    """
    _validate(log_probs, old_log_probs, advantages, mask, ref_log_probs, eps_low=eps_low, eps_high=eps_high,
              dual_clip_c=dual_clip_c, agg=agg, total_tokens=total_tokens, total_sequences=total_sequences,
              max_response_tokens=max_response_tokens, kl_beta=kl_beta)
    maskf = mask.to(log_probs.dtype)
    old = old_log_probs.detach()
    adv = advantages.detach()
    # Masked positions may hold padding garbage; zero the log-ratio there so exp() cannot overflow.
    log_ratio = torch.where(mask, log_probs - old, torch.zeros_like(log_probs))
    ratio = torch.exp(log_ratio)

    # Eq. 10: the pessimistic (max-of-losses) choice between the raw and the clipped surrogate,
    # with the decoupled bounds of clip-higher (sec. 3.1).
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    token_loss = torch.maximum(unclipped, clipped)
    if dual_clip_c is not None:
        # Dual-clip: for A < 0 the loss -A * r grows without bound in r; cap it at -A * c.
        capped = torch.minimum(token_loss, -adv * dual_clip_c)
        token_loss = torch.where(adv < 0, capped, token_loss)
    pg_token_loss = token_loss

    kl_ref_token: torch.Tensor | None = None
    if kl_beta > 0:
        assert ref_log_probs is not None  # checked in _validate
        # k3 estimator of KL(pi_theta || pi_ref) (GRPO eq. 4): exp(ref - logp) - (ref - logp) - 1 >= 0.
        delta = torch.where(mask, ref_log_probs.detach() - log_probs, torch.zeros_like(log_probs))
        kl_ref_token = torch.exp(delta) - delta - 1.0
        token_loss = token_loss + kl_beta * kl_ref_token

    loss = aggregate(token_loss, maskf, agg, total_tokens, total_sequences, max_response_tokens)

    with torch.no_grad():
        n_tok = maskf.sum()
        local = n_tok.clamp(min=1.0)
        is_low = (adv < 0) & (ratio < 1.0 - eps_low) & mask
        is_high = (adv > 0) & (ratio > 1.0 + eps_high) & mask
        is_dual = (adv < 0) & (ratio > dual_clip_c) & mask if dual_clip_c is not None else torch.zeros_like(mask)
        # k3 estimate of KL(pi_old || pi_theta) with samples from pi_old: (r - 1) - log r >= 0.
        k3_old = (ratio - 1.0) - log_ratio
        metrics: dict[str, torch.Tensor] = {
            "pg_loss": (pg_token_loss * maskf).sum() / local,
            "clip_frac_low": is_low.sum().to(log_probs.dtype) / local,
            "clip_frac_high": is_high.sum().to(log_probs.dtype) / local,
            "dual_clip_frac": is_dual.sum().to(log_probs.dtype) / local,
            "approx_kl": (k3_old * maskf).sum() / local,
            "num_tokens": n_tok,
        }
        if kl_ref_token is not None:
            metrics["kl_ref"] = (kl_ref_token * maskf).sum() / local
    return loss, {k: v.detach() for k, v in metrics.items()}


def token_mean(masked: torch.Tensor, maskf: torch.Tensor, total_tokens: Denominator, total_sequences: Denominator,
               max_response_tokens: int | None) -> torch.Tensor:
    """DAPO eq. 12 (sec. 3.3): 1 / sum_i |o_i| * sum_i sum_t l_{i,t}; ``total_tokens`` = the mini-batch's token count."""
    denom = maskf.sum().clamp(min=1.0) if total_tokens is None else total_tokens
    return masked.sum() / denom


def seq_mean_token_mean(masked: torch.Tensor, maskf: torch.Tensor, total_tokens: Denominator,
                        total_sequences: Denominator, max_response_tokens: int | None) -> torch.Tensor:
    """GRPO: each response's token mean, then the mean over responses with a valid token."""
    seq_tokens = maskf.sum(dim=-1)
    seq_loss = masked.sum(dim=-1) / seq_tokens.clamp(min=1.0)
    n_seq = (seq_tokens > 0).sum().clamp(min=1) if total_sequences is None else total_sequences
    return seq_loss.sum() / n_seq


def seq_mean_token_sum_norm(masked: torch.Tensor, maskf: torch.Tensor, total_tokens: Denominator,
                            total_sequences: Denominator, max_response_tokens: int | None) -> torch.Tensor:
    """Dr.GRPO: each response's token sum over a constant normaliser, mean over all B rows."""
    norm = masked.shape[-1] if max_response_tokens is None else max_response_tokens
    n_seq = masked.shape[0] if total_sequences is None else total_sequences
    return masked.sum() / (norm * n_seq) if masked.shape[0] > 0 else masked.sum()


# The aggregation registry: the name a config or an ablation rung selects -> its reduction.
AGGREGATIONS: dict[str, Callable[..., torch.Tensor]] = {
    "token-mean": token_mean,
    "seq-mean-token-mean": seq_mean_token_mean,
    "seq-mean-token-sum-norm": seq_mean_token_sum_norm,
}


def aggregate(
    token_loss: torch.Tensor,
    maskf: torch.Tensor,
    agg: str,
    total_tokens: Denominator = None,
    total_sequences: Denominator = None,
    max_response_tokens: int | None = None,
) -> torch.Tensor:
    """Reduce ``[B, L]`` token losses to a scalar with the aggregation named ``agg`` (module docstring)."""
    return AGGREGATIONS[agg](token_loss * maskf, maskf, total_tokens, total_sequences, max_response_tokens)


def policy_loss_reference(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    dual_clip_c: float | None = None,
    agg: Aggregation = "token-mean",
    total_tokens: int | float | None = None,
    total_sequences: int | float | None = None,
    max_response_tokens: int | None = None,
    ref_log_probs: torch.Tensor | None = None,
    kl_beta: float = 0.0,
) -> torch.Tensor:
    """Slow per-token loop version of ``policy_loss``; returns the loss only (with gradient).

    Uses the textbook min-of-objectives form of eq. 10 and explicit ``if`` branches for dual-clip,
    so it cross-checks the vectorised max-of-losses form above.
    """
    _validate(log_probs, old_log_probs, advantages, mask, ref_log_probs, eps_low=eps_low, eps_high=eps_high,
              dual_clip_c=dual_clip_c, agg=agg, total_tokens=total_tokens, total_sequences=total_sequences,
              max_response_tokens=max_response_tokens, kl_beta=kl_beta)
    batch, width = log_probs.shape
    seq_sums: list[torch.Tensor] = []
    seq_counts: list[int] = []
    for i in range(batch):
        seq_sum = log_probs.new_zeros(())
        count = 0
        for t in range(width):
            if not bool(mask[i, t]):
                continue
            a = float(advantages[i, t])
            ratio = torch.exp(log_probs[i, t] - float(old_log_probs[i, t]))
            clipped_ratio = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
            objective = torch.minimum(ratio * a, clipped_ratio * a)
            loss_t = -objective
            if dual_clip_c is not None and a < 0 and float(loss_t.detach()) > -a * dual_clip_c:
                loss_t = loss_t * 0.0 + (-a * dual_clip_c)  # constant: no gradient through this token
            if kl_beta > 0:
                assert ref_log_probs is not None
                d = float(ref_log_probs[i, t]) - log_probs[i, t]
                loss_t = loss_t + kl_beta * (torch.exp(d) - d - 1.0)
            seq_sum = seq_sum + loss_t
            count += 1
        seq_sums.append(seq_sum)
        seq_counts.append(count)
    if agg == "token-mean":
        denom = float(total_tokens) if total_tokens is not None else max(sum(seq_counts), 1)
        return sum(seq_sums, log_probs.new_zeros(())) / denom
    if agg == "seq-mean-token-mean":
        per_seq = [s / c for s, c in zip(seq_sums, seq_counts) if c > 0]
        n_seq = float(total_sequences) if total_sequences is not None else max(len(per_seq), 1)
        return sum(per_seq, log_probs.new_zeros(())) / n_seq
    norm = max_response_tokens if max_response_tokens is not None else width
    n_seq = float(total_sequences) if total_sequences is not None else max(batch, 1)
    return sum((s / norm for s in seq_sums), log_probs.new_zeros(())) / n_seq
