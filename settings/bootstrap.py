"""Settings of the bootstrap stage: where the step-0 policy comes from and the tiny warm-up."""

from __future__ import annotations

from dataclasses import dataclass

from settings.checks import COUNT_MAX, WORKERS_MAX, check_fields, in_range


@dataclass(frozen=True)
class BootstrapConfig:
    """Settings of the bootstrap stage (tiny policy construction and warm-up, or import)."""

    source: str = "tiny"  # "tiny" (build + warm up), "shipped:NAME" (assets/policies/NAME, made once by a warm-up), or a local HF model folder / URI to import as step 0
    link_import: bool = False  # import by symlinking files instead of copying them (same machine only)
    seed: int = 0  # weight init, batch order and synthetic problems all derive from it
    num_layers: int = 3  # tiny model: transformer layers
    hidden_size: int = 128  # tiny model: hidden width
    num_heads: int = 2  # tiny model: attention heads (head size hidden_size / num_heads)
    batch_size: int = 64  # warm-up: sequences per optimizer step
    learning_rate: float = 1e-3  # warm-up: AdamW learning rate
    max_steps: int = 800  # warm-up: hard cap on optimizer steps
    eval_every_steps: int = 25  # warm-up: held-out greedy accuracy is checked this often
    eval_problems: int = 128  # warm-up: held-out problems used for the check (first N of the test split)
    target_accuracy_low: float = 0.2  # warm-up stops at the first check with accuracy in [low, high]
    target_accuracy_high: float = 0.5
    require_band: bool = True  # fail (instead of publishing) when max_steps ends outside the band
    # Synthetic problems used only when no Problem shards are given (standalone `dapo bootstrap`);
    # the pipeline's curate stage should use the same difficulty (synthetic:min_terms=..,...).
    min_terms: int = 2
    max_terms: int = 2
    max_operand: int = 20
    max_check_lines: int = 0  # warm-up solutions restate their last line 0..N times (readers/synthetic.py: check lines)
    synthetic_train_problems: int = 4096
    cpu_threads: int = 0  # torch threads for the warm-up; 0 = all cores this process may use

    def __post_init__(self) -> None:
        check_fields(self, {
            "num_layers": (in_range(self.num_layers, 1, 1024), "must be in [1, 1024]"),
            "hidden_size": (in_range(self.hidden_size, 1, 1 << 16), "must be in [1, 65536]"),
            "num_heads": (in_range(self.num_heads, 1, 1024) and self.hidden_size % self.num_heads == 0,
                          f"must be in [1, 1024] and divide hidden_size={self.hidden_size}"),
            "batch_size": (in_range(self.batch_size, 1, 1 << 20), "must be in [1, 1048576]"),
            "learning_rate": (self.learning_rate > 0, "must be > 0"),
            "max_steps": (in_range(self.max_steps, 0, COUNT_MAX), f"must be in [0, {COUNT_MAX}]"),
            "eval_every_steps": (in_range(self.eval_every_steps, 1, COUNT_MAX), f"must be in [1, {COUNT_MAX}]"),
            "eval_problems": (in_range(self.eval_problems, 1, COUNT_MAX), f"must be in [1, {COUNT_MAX}]"),
            "target_accuracy_low": (0 <= self.target_accuracy_low <= 1, "must be in [0, 1]"),
            "target_accuracy_high": (self.target_accuracy_low <= self.target_accuracy_high <= 1,
                                     f"must be in [target_accuracy_low={self.target_accuracy_low}, 1]"),
            "min_terms": (in_range(self.min_terms, 1, 1000), "must be in [1, 1000]"),
            "max_terms": (in_range(self.max_terms, self.min_terms, 1000), f"must be in [min_terms={self.min_terms}, 1000]"),
            "max_operand": (in_range(self.max_operand, 1, 10**12), "must be in [1, 10**12] (answers are 64-bit integers)"),
            "max_check_lines": (in_range(self.max_check_lines, 0, 1000), "must be in [0, 1000]"),
            "synthetic_train_problems": (in_range(self.synthetic_train_problems, 1, COUNT_MAX), f"must be in [1, {COUNT_MAX}]"),
            "cpu_threads": (in_range(self.cpu_threads, 0, WORKERS_MAX), f"must be in [0, {WORKERS_MAX}] (0 = all cores)"),
        })
