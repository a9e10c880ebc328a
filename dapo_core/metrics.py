"""Training-health metrics the paper tracks (sec. 3.1 entropy, sec. 3.4 lengths, fig. 3-7).

All functions return detached scalar tensors (no ``.item()``) so hot loops never sync; the
task layer converts once per step when it writes the StepMetrics row.

* ``token_mean_entropy``: mean policy entropy over valid tokens; clip-higher (sec. 3.1) exists to
  keep it from collapsing. Computed from logits with ``logsumexp`` in token chunks, so it never
  materialises a second ``[B, L, V]`` tensor.
* ``response_length_stats``, ``truncation_ratio``: the length curves overlong shaping acts on.
* ``accuracy``, ``zero_std_group_fraction``: how many groups dynamic sampling must discard.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

import torch

from dapo_core.advantages import dense_group_index

__all__ = [
    "accuracy",
    "entropy_from_logits",
    "response_length_stats",
    "token_mean_entropy",
    "truncation_ratio",
    "zero_std_group_fraction",
]


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last axis: ``[..., V] -> [...]``, in nats (float32+).

    H = -sum p log p = logsumexp(z) - sum softmax(z) * z, which avoids log(0) for tiny p.
    """
    z = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    lse = torch.logsumexp(z, dim=-1)
    p = torch.softmax(z, dim=-1)
    return lse - (p * z).sum(dim=-1)


@torch.no_grad()
def token_mean_entropy(logits: torch.Tensor, mask: torch.Tensor, chunk_tokens: int = 128) -> torch.Tensor:
    """Mean entropy over the valid tokens of a batch.

    Args:
        logits: ``[B, L, V]`` policy logits at response positions.
        mask: ``[B, L]`` bool, True for tokens that count.
        chunk_tokens: tokens per chunk; peak extra memory is a few ``chunk_tokens * V`` float32
            buffers (softmax, product), never a second ``[B, L, V]`` tensor.

    Returns:
        Scalar (nats per token), detached; 0 when no token is valid.
    """
    if logits.dim() != 3:
        raise ValueError(f"logits must be [B, L, V], got shape {tuple(logits.shape)}")
    if mask.dtype != torch.bool or mask.shape != logits.shape[:2]:
        raise ValueError(f"mask must be a bool tensor [B, L] = {tuple(logits.shape[:2])}, "
                         f"got dtype {mask.dtype} shape {tuple(mask.shape)}")
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    vocab = logits.shape[-1]
    flat_logits = logits.detach().reshape(-1, vocab)  # a view when logits is contiguous: no copy
    flat_mask = mask.reshape(-1)
    total = torch.zeros((), dtype=torch.float64, device=logits.device)
    for start in range(0, flat_logits.shape[0], chunk_tokens):
        # Select inside the chunk (not logits[mask] up front, which would copy all T x V values);
        # padding positions are skipped outright, so garbage logits there cannot produce NaN.
        chunk = flat_logits[start:start + chunk_tokens][flat_mask[start:start + chunk_tokens]]
        total += entropy_from_logits(chunk).sum().to(torch.float64)
    count = mask.sum().clamp(min=1).to(torch.float64)
    return (total / count).to(torch.float32)


def _as_1d(values: torch.Tensor, name: str) -> torch.Tensor:
    if not isinstance(values, torch.Tensor) or values.dim() != 1:
        raise ValueError(f"{name} must be a 1-D tensor [N]")
    if values.numel() == 0:
        raise ValueError(f"{name} is empty: no responses to summarise")
    return values.detach()


def response_length_stats(lengths: torch.Tensor, max_response_tokens: int) -> dict[str, torch.Tensor]:
    """Length statistics of ``[N]`` response lengths (tokens).

    Returns ``mean``, ``max``, ``min`` (float32 tokens) and ``clip_ratio``, the fraction of
    responses whose length reached ``max_response_tokens`` (the generation cap).
    """
    lengths = _as_1d(lengths, "lengths")
    if max_response_tokens < 1:
        raise ValueError(f"max_response_tokens must be >= 1, got {max_response_tokens}")
    as_float = lengths.to(torch.float32)
    return {
        "mean": as_float.mean(),
        "max": as_float.max(),
        "min": as_float.min(),
        "clip_ratio": (lengths >= max_response_tokens).to(torch.float32).mean(),
    }


def truncation_ratio(truncated: torch.Tensor) -> torch.Tensor:
    """Fraction of ``[N]`` responses the engine cut at the cap (finish_reason == "length")."""
    truncated = _as_1d(truncated, "truncated")
    if truncated.dtype != torch.bool:
        raise TypeError(f"truncated must be bool, got {truncated.dtype}")
    return truncated.to(torch.float32).mean()


def accuracy(correct: torch.Tensor) -> torch.Tensor:
    """Fraction of ``[N]`` responses whose answer is right (mean@1 over all samples)."""
    correct = _as_1d(correct, "correct")
    if correct.dtype != torch.bool:
        raise TypeError(f"correct must be bool, got {correct.dtype}")
    return correct.to(torch.float32).mean()


def zero_std_group_fraction(rewards: torch.Tensor, group_ids: torch.Tensor | Iterable[Hashable]) -> torch.Tensor:
    """Fraction of groups whose rewards are all equal (zero std, hence zero advantage, eq. 9).

    Args:
        rewards: ``[N]`` float rewards.
        group_ids: ``[N]`` integer tensor or N hashable ids, as in ``group_advantages``.

    A singleton group counts as zero-std: it has nothing to compare against.
    """
    rewards = _as_1d(rewards, "rewards")
    index, num_groups = dense_group_index(group_ids, rewards.numel())
    index = index.to(rewards.device)
    r = rewards.to(torch.float64)
    # Equal rewards <=> group max == group min; exact, unlike a std compared with a tolerance.
    gmax = torch.full((num_groups,), -torch.inf, dtype=r.dtype, device=r.device).scatter_reduce(0, index, r, "amax")
    gmin = torch.full((num_groups,), torch.inf, dtype=r.dtype, device=r.device).scatter_reduce(0, index, r, "amin")
    return (gmax == gmin).to(torch.float32).mean()
