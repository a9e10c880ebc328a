"""Which parts of which checkpoint a run keeps: the retention policy, as a pure function.

Every training step publishes a whole checkpoint: bf16 weights plus the DeepSpeed optimizer
state (``ds_state/``: fp32 master weights and Adam moments, 6x the weights), about 65 GB +
393 GB for Qwen2.5-32B, so a 1,000-step run would store ~460 TB (infra/sizing.py). A run
needs far less of it:

- the **latest** checkpoint whole: the next step trains from it (weights + optimizer state), and
  a resume after a kill starts there;
- the **step-0 policy** whole: the run's origin (lineage, and the baseline evaluation);
- the last ``keep_optimizer_last`` (K) checkpoints whole, to restart a few steps back;
- the **weights** of every ``keep_weights_every``-th (M) step, to evaluate or serve later;
- with the optimizer state written only every E-th step (``train.optimizer_state_every``), the
  newest checkpoint that has it, whole: a cold start replays from it (engines/train/replay.py).

Optimizer state is never kept without its weights (a step resumes from both). Lineage records
(``dapo_checkpoint.json``, metrics, configs, tokenizer files) are always kept; storage/pruning.py
deletes only what this policy drops. K = 0 keeps every checkpoint whole (M is then moot); M = 0
keeps every checkpoint's weights. Stdlib only: infra/sizing.py uses the same function to
project a run's storage.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

# Checkpoint copies a node's mirror of an object-store run keeps (storage/run_store.py:
# evict_mirrored): the one a rollout generates from, the one before (a pipelined rollout lags a
# step) and one more for an evaluation.
MIRRORED_CHECKPOINTS = 3


@dataclass(frozen=True)
class Keep:
    """What of one checkpoint the policy keeps."""

    weights: bool  # the *.safetensors files
    optimizer_state: bool  # the ds_state/ folder (DeepSpeed optimizer, LR schedule, update count)


WHOLE = Keep(weights=True, optimizer_state=True)


def checkpoint_retention(
    steps: Iterable[int], *, latest: int, keep_optimizer_last: int, keep_weights_every: int,
    optimizer_state_every: int = 1,
) -> dict[int, Keep]:
    """``{step: Keep}`` for the checkpoints of ``steps`` (0 = the step-0 policy), ``latest`` the newest.

    ``keep_optimizer_last`` (K) counts checkpoints, not step numbers: a skipped step publishes
    none. ``optimizer_state_every`` (E): only trained steps divisible by E hold optimizer state, and
    the newest of them is the replay origin of the latest. Raises ValueError when ``latest`` is not
    among ``steps`` or a step comes after it.
    """
    if keep_optimizer_last < 0 or keep_weights_every < 0:
        raise ValueError(f"keep_optimizer_last={keep_optimizer_last} and keep_weights_every={keep_weights_every} "
                         "must be >= 0 (0 = keep all)")
    ordered = sorted(set(steps))
    if latest not in ordered:
        raise ValueError(f"latest={latest} is not among the checkpoint steps {ordered[-5:]}")
    if ordered[-1] != latest:
        raise ValueError(f"step {ordered[-1]} comes after the latest checkpoint (step {latest})")
    trained = [s for s in ordered if s > 0]
    whole = set(trained if keep_optimizer_last == 0 else trained[-keep_optimizer_last:]) | {0, latest}
    whole |= set([s for s in trained if s % optimizer_state_every == 0][-1:])  # the replay origin
    plan = {}
    for step in ordered:
        if step in whole:
            plan[step] = WHOLE
        else:
            plan[step] = Keep(weights=keep_weights_every == 0 or step % keep_weights_every == 0, optimizer_state=False)
    return plan


__all__ = ["Keep", "WHOLE", "checkpoint_retention"]
