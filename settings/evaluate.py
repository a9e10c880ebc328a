"""Settings of the evaluate stage: avg@k / pass@k / maj@k at temperature 1.0, top_p 0.7 (paper sec. 4.1)."""

from __future__ import annotations

from dataclasses import dataclass

from settings.checks import COUNT_MAX, SAMPLES_MAX, TOKENS_MAX, check_fields, in_range


@dataclass(frozen=True)
class EvalConfig:
    """Sampling and scoring of an evaluation (defaults: the paper's avg@k protocol, sec. 4.1)."""

    eval_set: str = "heldout"  # name recorded in EvalResult.eval_set
    samples_per_problem: int = 32  # k samples per problem (paper: avg@32); 0 = one per copy of the problem in the input
    temperature: float = 1.0  # sampling temperature (paper: 1.0)
    top_p: float = 0.7  # nucleus sampling (paper: 0.7)
    max_response_tokens: int = 64  # response cap (use the training cap)
    max_problems: int = 0  # evaluate only the first N problems of the set; 0 = all
    seed: int = 0  # sampling seed (per-request seeds derive from it)
    reward_timeout_s: float = 5.0  # wall-clock limit per verdict
    prompt_template: str = ""  # renders raw (non-Problem) input rows; "" = DAPO's template

    def __post_init__(self) -> None:
        check_fields(self, {
            "samples_per_problem": (in_range(self.samples_per_problem, 0, SAMPLES_MAX), f"must be in [0, {SAMPLES_MAX}] (0 = one per copy)"),
            "temperature": (self.temperature > 0, "must be > 0"),
            "top_p": (0 < self.top_p <= 1, "must be in (0, 1]"),
            "max_response_tokens": (in_range(self.max_response_tokens, 1, TOKENS_MAX), f"must be in [1, {TOKENS_MAX}]"),
            "max_problems": (in_range(self.max_problems, 0, COUNT_MAX), f"must be in [0, {COUNT_MAX}] (0 = all)"),
            "reward_timeout_s": (self.reward_timeout_s > 0, "must be > 0"),
        })
