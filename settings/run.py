"""Settings of the driver loop (section ``run``): how many steps, how big, when to evaluate, what to keep.

The stage sections (curate, bootstrap, rollout, score, train, evaluate) configure one task each;
this one configures the loop that chains them (workflows/driver.py, workflows/step_loop.py).
``workflows/config.py: RunConfig`` groups it with the others and loads YAML.
"""

from __future__ import annotations

from dataclasses import dataclass

from settings.checks import COUNT_MAX, check_fields, in_range

ON_MAX_ROUNDS = ("raise", "train_on_partial")  # DriverConfig.on_max_rounds
ROUND_SIZES = ("fixed", "adaptive")  # DriverConfig.round_size


@dataclass(frozen=True)
class DriverConfig:
    """The driver loop (section ``run``): how many steps, how big, and when to evaluate."""

    name: str = "dapo"  # run name; the run folder is <run_root>/<name>
    data: tuple[str, ...] = ("synthetic:n=2000,seed=0",)  # curation inputs: files, hf:NAME, synthetic:... (@train/@test forces a split)
    steps: int = 4  # DAPO training steps (each: rollout rounds -> score -> one train task)
    prompts_per_step: int = 16  # prompts (groups) in one training batch (paper: 512)
    prompts_per_round: int = 24  # prompts generated per rollout round (paper: 3 x 512 over-sampling)
    round_size: str = "fixed"  # prompts a rollout round draws: "fixed" (always prompts_per_round, the paper's over-sampling) or "adaptive" (enough for the groups still needed at the informative-group rate of the latest rounds, at most prompts_per_round; workflows/step_loop.py: round_prompts)
    max_rounds: int = 4  # generation rounds per step before giving up (dynamic sampling, sec. 3.2)
    on_max_rounds: str = "train_on_partial"  # when rounds run out short: "raise", or "train_on_partial" (train on the groups found; none found: the step is skipped, policy kept, trained_groups=0)
    eval_every_steps: int = 0  # evaluate every N steps (0 = only before and after training)
    seed: int = 0  # root seed: problem order and every rollout seed derive from it
    keep_optimizer_checkpoints: int = 0  # retention: only the last K checkpoints keep their optimizer state (ds_state/) and weights; the driver prunes older ones after each step (storage/retention_policy.py); 0 = keep every checkpoint whole
    keep_weights_every_steps: int = 0  # retention: checkpoints older than the last K keep their weights only at steps divisible by M; 0 = all weights (needs keep_optimizer_checkpoints >= 1)
    pipelined: bool = False  # one-step off-policy (workflows/step_loop.py): step N+1's rollouts run while step N trains, from the policy after step N-1 (one step stale, corrected as train.behaviour_correction says); false = synchronous, every fresh rollout on-policy

    def __post_init__(self) -> None:
        check_fields(self, {
            "name": (bool(self.name) and "/" not in self.name and self.name not in (".", "..") and self.name.isprintable(),
                     "must be a plain folder name, no / and no control characters (the run folder is <run_root>/<name>)"),
            "data": (len(self.data) >= 1, "must list at least one input"),
            "steps": (in_range(self.steps, 0, COUNT_MAX), f"must be in [0, {COUNT_MAX}]"),
            "prompts_per_step": (in_range(self.prompts_per_step, 1, COUNT_MAX), f"must be in [1, {COUNT_MAX}]"),
            "prompts_per_round": (in_range(self.prompts_per_round, 1, COUNT_MAX), f"must be in [1, {COUNT_MAX}]"),
            "round_size": (self.round_size in ROUND_SIZES, f"must be one of {list(ROUND_SIZES)}"),
            "max_rounds": (in_range(self.max_rounds, 1, 1 << 20), "must be in [1, 1048576]"),
            "on_max_rounds": (self.on_max_rounds in ON_MAX_ROUNDS, f"must be one of {list(ON_MAX_ROUNDS)}"),
            "eval_every_steps": (in_range(self.eval_every_steps, 0, COUNT_MAX), f"must be in [0, {COUNT_MAX}] (0 = only before and after)"),
            "keep_optimizer_checkpoints": (in_range(self.keep_optimizer_checkpoints, 0, COUNT_MAX), f"must be in [0, {COUNT_MAX}] (0 = keep every checkpoint whole)"),
            "keep_weights_every_steps": (
                in_range(self.keep_weights_every_steps, 0, COUNT_MAX) and (self.keep_weights_every_steps == 0 or self.keep_optimizer_checkpoints >= 1),
                f"must be in [0, {COUNT_MAX}], and > 0 only with run.keep_optimizer_checkpoints >= 1 (0 keeps every checkpoint whole)"),
        })
        # Pipelined, step N+1 generates from the checkpoint before the latest while step N trains
        # (and a resume may generate from it again): retention must keep its weights.
        check_fields(self, {
            "keep_optimizer_checkpoints": (not self.pipelined or self.keep_optimizer_checkpoints != 1,
                                           ("must be 0 or >= 2 with run.pipelined (the checkpoint before the latest "
                                            "is the policy the next step's rollouts use)")),
        })
