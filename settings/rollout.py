"""Settings of the rollout stage: G samples per prompt, sampling, engines, length caps."""

from __future__ import annotations

from dataclasses import dataclass

from settings.checks import SAMPLES_MAX, TOKENS_MAX, WORKERS_MAX, check_fields, in_range


@dataclass(frozen=True)
class RolloutConfig:
    """Sampling and engine settings of the rollout stage."""

    samples_per_prompt: int = 8  # G: responses per prompt (the group of eq. 9)
    temperature: float = 1.0  # sampling temperature (the paper samples at 1.0)
    top_p: float = 1.0  # nucleus sampling during training rollouts (the paper's eval uses 0.7)
    max_response_tokens: int = 64  # response cap; longer samples end with finish_reason "length"
    dtype: str = "float32"  # engine dtype; fp32 keeps log-probs equal to the trainer's for the tiny model
    max_model_len: int = 0  # prompt + response token limit per sequence; 0 = the model's max positions
    engines: int = 0  # data-parallel engines; 0 = one per visible GPU (one on CPU)
    cpu_threads: int = 0  # OpenMP threads of a CPU engine; 0 = all cores this process may use
    cpu_kvcache_gib: int = 1  # KV-cache budget of a CPU engine
    gpu_memory_utilization: float = 0.85  # fraction of each GPU a CUDA engine may take
    enforce_eager: bool = True  # skip CUDA graphs / compilation (faster start; turn off for long GPU runs)
    tensor_parallel_size: int = 1  # GPUs per engine (vLLM tensor parallel); 32B at 20480 tokens needs 4 (infra/sizing.py)
    sleep_between_rounds: bool = True  # a CUDA engine sleeps between calls, freeing its GPU for training (no-op on CPU)

    def __post_init__(self) -> None:
        check_fields(self, {
            "samples_per_prompt": (in_range(self.samples_per_prompt, 1, SAMPLES_MAX), f"must be in [1, {SAMPLES_MAX}]"),
            "temperature": (self.temperature > 0, "must be > 0"),
            "top_p": (0 < self.top_p <= 1, "must be in (0, 1]"),
            "max_response_tokens": (in_range(self.max_response_tokens, 1, TOKENS_MAX), f"must be in [1, {TOKENS_MAX}]"),
            "max_model_len": (in_range(self.max_model_len, 0, TOKENS_MAX), f"must be in [0, {TOKENS_MAX}] (0 = the model's max positions)"),
            "engines": (in_range(self.engines, 0, WORKERS_MAX), f"must be in [0, {WORKERS_MAX}] (0 = one per GPU)"),
            "cpu_threads": (in_range(self.cpu_threads, 0, WORKERS_MAX), f"must be in [0, {WORKERS_MAX}] (0 = all cores)"),
            "cpu_kvcache_gib": (in_range(self.cpu_kvcache_gib, 1, 1 << 16), "must be in [1, 65536]"),
            "gpu_memory_utilization": (0 < self.gpu_memory_utilization <= 1, "must be in (0, 1]"),
            "tensor_parallel_size": (in_range(self.tensor_parallel_size, 1, WORKERS_MAX), f"must be in [1, {WORKERS_MAX}]"),
        })

    def check_for_training(self) -> None:
        """Refuse sampling settings that make training rollouts wrong (evaluation may use them).

        The trainer recomputes pi_old / pi_theta at temperature 1 over the full vocabulary
        (dapo_core/logprobs.py) and the engine records raw log-probs, so the importance ratio of
        eq. 8 is only right when the rollout samples from that same distribution.
        """
        check_fields(self, {
            "samples_per_prompt": (self.samples_per_prompt >= 2,
                                   "must be >= 2: group advantages (eq. 9) compare G samples of one prompt"),
            "temperature": (self.temperature == 1.0, "must be 1.0: the trainer computes log-probs at temperature 1 "
                            "and the rollout records raw log-probs, so another temperature biases the ratio"),
            "top_p": (self.top_p == 1.0, "must be 1.0: the trainer computes log-probs with no top-p truncation "
                      "and the rollout records raw log-probs (evaluate.top_p is the eval's)"),
        })
