"""Overlong reward shaping (paper sec. 3.4): soft overlong punishment and overlong filtering.

A response cut off at the generation cap has no answer, so the rule reward calls it wrong even
when its reasoning was sound; that is reward noise. DAPO answers with two tools:

* Soft overlong punishment (eq. 13): a length-aware penalty added to the rule reward. With
  ``L_max`` the hard cap (``max_tokens``) and ``L_cache`` the punishment buffer
  (``buffer_tokens``), a response of ``|y|`` tokens gets

      0                                      if |y| <= L_max - L_cache
      ((L_max - L_cache) - |y|) / L_cache    if L_max - L_cache < |y| <= L_max
      -1                                     if L_max < |y|

  times ``factor``. The ramp is continuous: 0 at L_max - L_cache, -1 at exactly L_max.
* Overlong filtering: truncated responses are masked out of the loss entirely (their tokens carry
  no gradient), while still counting for their group's advantage statistics.
"""

from __future__ import annotations

import torch

__all__ = ["overlong_filter_mask", "soft_overlong_penalty", "soft_overlong_penalty_reference"]


def _check_args(lengths: torch.Tensor, max_tokens: int, buffer_tokens: int, factor: float) -> None:
    if not isinstance(lengths, torch.Tensor) or lengths.dim() != 1:
        raise ValueError("lengths must be a 1-D tensor [N] of response token counts")
    if lengths.dtype.is_floating_point or lengths.dtype == torch.bool:
        raise TypeError(f"lengths must be an integer tensor (token counts), got dtype {lengths.dtype}")
    negative = (lengths < 0).nonzero().flatten()
    if negative.numel():
        raise ValueError(f"lengths must be >= 0; row {int(negative[0])} is {int(lengths[negative[0]])}")
    if max_tokens < 1:
        raise ValueError(f"max_tokens (L_max) must be >= 1, got {max_tokens}")
    if not 1 <= buffer_tokens <= max_tokens:
        raise ValueError(f"buffer_tokens (L_cache) must be in [1, max_tokens={max_tokens}], got {buffer_tokens}")
    if factor < 0:
        raise ValueError(f"factor must be >= 0 (the penalty is factor * a value in [-1, 0]), got {factor}")


def soft_overlong_penalty(
    lengths: torch.Tensor, max_tokens: int, buffer_tokens: int, factor: float = 1.0
) -> torch.Tensor:
    """Soft overlong punishment, paper eq. 13 (values in ``[-factor, 0]``).

    Args:
        lengths: ``[N]`` integer response lengths in tokens (``|y|``).
        max_tokens: ``L_max``, the hard generation cap in tokens (paper: 20480).
        buffer_tokens: ``L_cache``, the punishment buffer below the cap (paper: 4096); the
            penalty starts after ``max_tokens - buffer_tokens`` tokens (paper: 16384).
        factor: scale of the penalty (eq. 13 uses 1).

    Returns:
        ``[N]`` float32 penalties, to be *added* to the rule reward.
    """
    _check_args(lengths, max_tokens, buffer_tokens, factor)
    start = max_tokens - buffer_tokens
    over = (lengths.to(torch.float64) - start).clamp(min=0.0)
    # Linear ramp over the buffer, saturating at -1 from L_max on (eq. 13's third case).
    ramp = (-over / buffer_tokens).clamp(min=-1.0)
    return (ramp * factor).to(torch.float32)


def soft_overlong_penalty_reference(
    lengths: torch.Tensor, max_tokens: int, buffer_tokens: int, factor: float = 1.0
) -> torch.Tensor:
    """Case-by-case transcription of eq. 13, one length at a time (checks the vectorised form)."""
    _check_args(lengths, max_tokens, buffer_tokens, factor)
    out = []
    for y in lengths.tolist():
        if y <= max_tokens - buffer_tokens:
            value = 0.0
        elif y <= max_tokens:
            value = ((max_tokens - buffer_tokens) - y) / buffer_tokens
        else:
            value = -1.0
        out.append(value * factor)
    return torch.tensor(out, dtype=torch.float32)


def overlong_filter_mask(truncated: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Overlong filtering (sec. 3.4): drop every token of truncated responses from the loss mask.

    Args:
        truncated: ``[B]`` bool, True where the response hit the length cap (finish_reason length).
        mask: ``[B, L]`` bool response-token mask.

    Returns:
        ``[B, L]`` bool mask, equal to ``mask`` on non-truncated rows and all False on truncated ones.
    """
    if truncated.dtype != torch.bool or truncated.dim() != 1:
        raise TypeError(f"truncated must be a 1-D bool tensor [B], got dtype {truncated.dtype} "
                        f"shape {tuple(truncated.shape)}")
    if mask.dtype != torch.bool or mask.dim() != 2:
        raise TypeError(f"mask must be a 2-D bool tensor [B, L], got dtype {mask.dtype} shape {tuple(mask.shape)}")
    if mask.shape[0] != truncated.shape[0]:
        raise ValueError(f"truncated has {truncated.shape[0]} rows but mask has {mask.shape[0]}")
    return mask & ~truncated.unsqueeze(-1)
