"""Group-relative advantages (GRPO / DAPO, paper sec. 2.2 and eq. 9 of arXiv 2503.14476).

DAPO has no critic: each of the G responses to one prompt is scored against its siblings,

    A_i = (R_i - mean({R_j})) / (std({R_j}) + eps)          (the advantage inside eq. 8 / eq. 12)

where the mean and std run over the responses that share a prompt (a "group"). Every token of
response i then carries the same advantage A_i. Dr.GRPO (arXiv 2503.20783) drops the division by
the std (it up-weights groups that are nearly all right or all wrong); ``normalize_by_std=False``
gives that mean-only variant.

Two implementations live here: ``group_advantages`` (vectorised with ``index_add``) and
``group_advantages_reference`` (a slow, obvious loop); tests check that they agree.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable

import torch

__all__ = ["ADVANTAGE_ESTIMATORS", "dense_group_index", "dr_grpo_advantages", "estimate_advantages", "group_advantages",
           "group_advantages_reference"]


def dense_group_index(group_ids: torch.Tensor | Iterable[Hashable], num_items: int) -> tuple[torch.Tensor, int]:
    """Map group ids to dense indices ``0..num_groups-1``.

    Args:
        group_ids: either an integer tensor ``[N]`` (any values, e.g. prompt indices) or an iterable
            of ``N`` hashable ids (e.g. ``problem_id`` strings). Equal ids form one group.
        num_items: ``N``, the number of rewards the ids must line up with.

    Returns:
        ``(index [N] int64, num_groups)``. For a tensor the groups are numbered in sorted id order;
        for other iterables in first-seen order. Only the partition matters to callers.
    """
    if isinstance(group_ids, torch.Tensor):
        if group_ids.dim() != 1:
            raise ValueError(f"group_ids must be 1-D [N], got shape {tuple(group_ids.shape)}")
        if group_ids.dtype.is_floating_point or group_ids.dtype.is_complex or group_ids.dtype == torch.bool:
            raise TypeError(f"group_ids tensor must have an integer dtype, got {group_ids.dtype}")
        if group_ids.numel() != num_items:
            raise ValueError(f"group_ids has {group_ids.numel()} entries but rewards has {num_items}")
        unique, inverse = torch.unique(group_ids, return_inverse=True)
        return inverse.to(torch.long), int(unique.numel())
    ids = list(group_ids)
    if len(ids) != num_items:
        raise ValueError(f"group_ids has {len(ids)} entries but rewards has {num_items}")
    first_seen: dict[Hashable, int] = {}
    dense = [first_seen.setdefault(gid, len(first_seen)) for gid in ids]
    return torch.tensor(dense, dtype=torch.long), len(first_seen)


def _check_rewards(rewards: torch.Tensor, eps: float) -> None:
    if not isinstance(rewards, torch.Tensor) or not rewards.dtype.is_floating_point:
        raise TypeError(f"rewards must be a floating-point tensor [N], got {type(rewards).__name__}"
                        + (f" of dtype {rewards.dtype}" if isinstance(rewards, torch.Tensor) else ""))
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [N], got shape {tuple(rewards.shape)}")
    bad = (~torch.isfinite(rewards)).nonzero().flatten()
    if bad.numel():
        raise ValueError(f"rewards must be finite; row {int(bad[0])} is {float(rewards[bad[0]])}")
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")


def group_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor | Iterable[Hashable],
    eps: float = 1e-6,
    *,
    normalize_by_std: bool = True,
) -> torch.Tensor:
    """Group-relative advantage of every response (paper eq. 9), vectorised.

    Args:
        rewards: ``[N]`` float tensor, one scalar reward per response (``B * G`` for B prompts with
            G samples each; groups may also have unequal sizes).
        group_ids: ``[N]`` integer tensor (e.g. prompt index) or ``N`` hashable ids (e.g.
            ``problem_id`` strings); responses with equal ids form one group.
        eps: added to the group std so a zero-variance group does not divide by zero. 1e-6 as in
            verl and TRL.
        normalize_by_std: True (GRPO / DAPO): ``(R - mean) / (std + eps)``. False (Dr.GRPO):
            ``R - mean``.

    Returns:
        ``[N]`` advantages, same dtype as ``rewards``, detached. The std is the unbiased (n - 1)
        sample std, matching ``torch.std`` as verl and TRL use it. A group of one response has no
        sibling to compare with, so its advantage is 0; so is every advantage of a group whose
        rewards are all equal (exactly 0, also with ``eps=0``).
    """
    _check_rewards(rewards, eps)
    index, num_groups = dense_group_index(group_ids, rewards.numel())
    index = index.to(rewards.device)
    r = rewards.detach()
    counts = torch.zeros(num_groups, dtype=r.dtype, device=r.device).index_add_(0, index, torch.ones_like(r))
    sums = torch.zeros(num_groups, dtype=r.dtype, device=r.device).index_add_(0, index, r)
    means = sums / counts
    centred = r - means[index]
    singleton = counts[index] < 2
    if not normalize_by_std:
        return torch.where(singleton, torch.zeros_like(centred), centred)
    # Two-pass variance (sum of squared deviations from the group mean): numerically stabler than
    # E[x^2] - E[x]^2 when rewards are large and close together.
    sq_dev = torch.zeros(num_groups, dtype=r.dtype, device=r.device).index_add_(0, index, centred * centred)
    std = torch.sqrt(sq_dev / (counts - 1).clamp(min=1))
    std_i = std[index]
    # A zero-variance group (all rewards equal) has no signal; force exactly 0 rather than
    # rounding noise / eps, and avoid 0 / 0 when eps == 0.
    no_signal = singleton | (std_i == 0)
    adv = centred / torch.where(no_signal, torch.ones_like(std_i), std_i + eps)
    return torch.where(no_signal, torch.zeros_like(adv), adv)


def dr_grpo_advantages(rewards: torch.Tensor, group_ids: torch.Tensor | Iterable[Hashable], eps: float = 1e-6) -> torch.Tensor:
    """Dr.GRPO (arXiv 2503.20783): ``R - mean`` of the group, no division by its std."""
    return group_advantages(rewards, group_ids, eps, normalize_by_std=False)


# The advantage-estimator registry: the name a config or an ablation rung selects -> its function
# (rewards [N], group ids [N]) -> advantages [N].
ADVANTAGE_ESTIMATORS: dict[str, Callable[..., torch.Tensor]] = {
    "grpo": group_advantages,  # (R - mean) / (std + eps), paper eq. 9 (GRPO and DAPO)
    "dr-grpo": dr_grpo_advantages,
}


def estimate_advantages(name: str, rewards: torch.Tensor, group_ids: torch.Tensor | Iterable[Hashable]) -> torch.Tensor:
    """Advantages of every response with the estimator registered as ``name``."""
    if name not in ADVANTAGE_ESTIMATORS:
        raise ValueError(f"advantage estimator must be one of {list(ADVANTAGE_ESTIMATORS)}, got {name!r}")
    return ADVANTAGE_ESTIMATORS[name](rewards, group_ids)


def group_advantages_reference(
    rewards: torch.Tensor,
    group_ids: torch.Tensor | Iterable[Hashable],
    eps: float = 1e-6,
    *,
    normalize_by_std: bool = True,
) -> torch.Tensor:
    """Slow, obvious Python-loop version of ``group_advantages`` (same arguments and result)."""
    _check_rewards(rewards, eps)
    ids = group_ids.tolist() if isinstance(group_ids, torch.Tensor) else list(group_ids)
    if len(ids) != rewards.numel():
        raise ValueError(f"group_ids has {len(ids)} entries but rewards has {rewards.numel()}")
    values = [float(x) for x in rewards.tolist()]
    members: dict[Hashable, list[int]] = {}
    for i, gid in enumerate(ids):
        members.setdefault(gid, []).append(i)
    out = [0.0] * len(values)
    for rows in members.values():
        n = len(rows)
        if n < 2:
            continue  # singleton group: advantage stays 0
        mean = sum(values[i] for i in rows) / n
        std = (sum((values[i] - mean) ** 2 for i in rows) / (n - 1)) ** 0.5
        if normalize_by_std and std == 0.0:
            continue  # all rewards equal: no signal, advantage stays 0
        for i in rows:
            out[i] = (values[i] - mean) / (std + eps) if normalize_by_std else values[i] - mean
    return torch.tensor(out, dtype=rewards.dtype, device=rewards.device)
