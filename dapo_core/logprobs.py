"""Token log-probabilities without materialising the whole ``[B, L, V]`` logits tensor.

At the paper's lengths one sample is 21504 tokens; with Qwen2.5's 152064-token vocabulary its
float32 logits alone are 13 GB, and autograd keeps them (and a log-softmax of the same size) for
the backward pass. ``chunked_token_log_probs`` runs the output head on ``chunk_tokens``
positions at a time and, when gradients are on, wraps each chunk in activation checkpointing:
the chunk's logits are freed after its forward and recomputed in backward, so the peak is one
chunk's logits instead of all of them. The result equals the full computation
(``token_log_probs_full``, the slow obvious version kept beside it) up to float rounding, and so do
its gradients (tests/unit/test_logprobs.py).

Position ``p`` of the output is log pi(token_p | tokens_<p), read from the hidden state at
``p - 1``; position 0 has no context and is 0, as in ``tasks/train_batch.token_log_probs``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.checkpoint import checkpoint

# hidden [b, n, H] -> logits [b, n, V]: all the model's forward does after its last norm (lm_head, then any
# logit post-processing such as Gemma's soft-capping; engines/train/engine.py: logit_head).
Head = Callable[[torch.Tensor], torch.Tensor]


def _chunk_log_probs(head: Head, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = head(hidden).float()  # [b, n, V]
    return logits.gather(-1, targets[..., None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def _chunk_log_probs_and_entropy(head: Head, hidden: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    logits = head(hidden).float()
    log_z = torch.logsumexp(logits, dim=-1)
    # Same formula as _chunk_log_probs, so pi_old and pi_theta log-probs agree bit for bit.
    log_probs = logits.gather(-1, targets[..., None]).squeeze(-1) - log_z
    entropy = log_z - (torch.softmax(logits, dim=-1) * logits).sum(-1)  # H = log Z - E_p[logit]
    return log_probs, entropy


def chunked_token_log_probs(
    head: Head,
    hidden: torch.Tensor,
    input_ids: torch.Tensor,
    *,
    chunk_tokens: int = 1024,
    with_entropy: bool = False,
    num_chunks: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of every token, computed ``chunk_tokens`` positions at a time.

    Args:
        head: the model's output head, ``[b, n, H] -> [b, n, V]``: exactly what its forward does
            from the final hidden states to the logits (``lm_head``, then any post-processing), or
            the log-probs are another policy's. Call the module, not its weight: under ZeRO-3 only
            the module's forward sees the whole weight.
        hidden: ``[B, L, H]`` final hidden states (after the last norm).
        input_ids: ``[B, L]`` the tokens; position ``p`` is predicted from ``hidden[:, p - 1]``.
        chunk_tokens: positions per head call (peak memory ~ ``B * chunk_tokens * V`` floats).
        with_entropy: also return each position's entropy of pi (gradients off only; the same
            head call per chunk gives both).
        num_chunks: call the head exactly this many times (trailing calls on empty chunks), at
            least enough to cover the sequence. Data-parallel ranks whose micro-batches have
            different lengths pass the same count: under ZeRO-3 every head call gathers the
            weight collectively, so all ranks must make the same number of calls.

    Returns:
        ``(log_probs [B, L] float32 with position 0 = 0, entropy [B, L] or None)``; entropy at
        position ``p`` is that of the distribution that predicted token ``p`` (0 at position 0).
    """
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    if hidden.dim() != 3 or input_ids.shape != hidden.shape[:2]:
        raise ValueError(f"need hidden [B, L, H] and input_ids [B, L], got {tuple(hidden.shape)} and {tuple(input_ids.shape)}")
    context, targets = hidden[:, :-1], input_ids[:, 1:]
    needed = -(-context.shape[1] // chunk_tokens)
    if num_chunks is None:
        num_chunks = needed
    if num_chunks < needed:
        raise ValueError(f"num_chunks={num_chunks} cannot cover {context.shape[1]} positions in chunks of {chunk_tokens}")
    grad = torch.is_grad_enabled() and hidden.requires_grad
    if with_entropy and grad:
        raise ValueError("with_entropy needs gradients off (the entropy is a metric of pi_old)")
    pieces: list[torch.Tensor] = []
    entropies: list[torch.Tensor] = []
    for index in range(num_chunks):
        start = index * chunk_tokens
        h, t = context[:, start:start + chunk_tokens], targets[:, start:start + chunk_tokens]
        if grad:
            # Recompute this chunk's logits in backward instead of keeping them.
            pieces.append(checkpoint(_chunk_log_probs, head, h, t, use_reentrant=False))
        elif with_entropy:
            lp, ent = _chunk_log_probs_and_entropy(head, h, t)
            pieces.append(lp)
            entropies.append(ent)
        else:
            pieces.append(_chunk_log_probs(head, h, t))
    zero = hidden.new_zeros((hidden.shape[0], 1), dtype=torch.float32)
    log_probs = torch.cat([zero, *pieces], dim=1)
    entropy = torch.cat([zero, *entropies], dim=1) if with_entropy else None
    return log_probs, entropy


def token_log_probs_full(head: Head, hidden: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Slow, obvious version: all logits at once, then a log-softmax (for tests)."""
    logits = head(hidden[:, :-1]).float()
    picked = torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    return torch.nn.functional.pad(picked, (1, 0), value=0.0)
