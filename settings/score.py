"""Settings of the score stage: reward, overlong shaping (sec. 3.4), advantages, dynamic sampling (sec. 3.2)."""

from __future__ import annotations

from dataclasses import dataclass

from settings.checks import TOKENS_MAX, WORKERS_MAX, check_fields, in_range


@dataclass(frozen=True)
class ScoreConfig:
    """Reward, overlong handling, advantages and the dynamic-sampling rule."""

    reward_timeout_s: float = 5.0  # wall-clock limit per math-verify verdict (timeouts count as wrong and are reported)
    reward_workers: int = 0  # verifier processes; 0 = one per CPU core
    soft_overlong_punishment: bool = True  # add the length penalty of eq. 13 to the reward
    overlong_buffer_tokens: int = 16  # L_cache of eq. 13: the penalty ramps over the last this-many tokens
    overlong_penalty_factor: float = 1.0  # the penalty's size at L_max (eq. 13 uses 1)
    overlong_filtering: bool = False  # mask truncated samples out of the loss (sec. 3.4)
    truncated_is_wrong: bool = False  # give truncated samples the wrong-answer reward (naive baseline)
    normalize_advantage_by_std: bool = True  # GRPO/DAPO (R-mean)/(std+eps); False = Dr.GRPO mean-only
    dynamic_sampling: bool = True  # keep only informative groups (sec. 3.2); False = every group is trained on
    informative_by: str = "accuracy"  # dynamic-sampling test: "accuracy" (0<correct<G, eq. 11) or "reward_std" (std>0)

    @property
    def advantage_estimator(self) -> str:
        """The registered estimator (dapo_core/advantages.py: ADVANTAGE_ESTIMATORS) these settings select."""
        return "grpo" if self.normalize_advantage_by_std else "dr-grpo"

    def __post_init__(self) -> None:
        check_fields(self, {
            "reward_timeout_s": (self.reward_timeout_s > 0, "must be > 0"),
            "reward_workers": (in_range(self.reward_workers, 0, WORKERS_MAX), f"must be in [0, {WORKERS_MAX}] (0 = one per core)"),
            "overlong_buffer_tokens": (in_range(self.overlong_buffer_tokens, 0, TOKENS_MAX) and (self.overlong_buffer_tokens >= 1 or not self.soft_overlong_punishment),
                                       f"must be in [1, {TOKENS_MAX}] with soft_overlong_punishment (L_cache of eq. 13), else in [0, {TOKENS_MAX}]"),
            "overlong_penalty_factor": (self.overlong_penalty_factor >= 0, "must be >= 0"),
            "informative_by": (self.informative_by in ("accuracy", "reward_std"), "must be 'accuracy' or 'reward_std'"),
        })
