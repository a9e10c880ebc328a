"""Settings of the rollout stage: G samples per prompt, sampling, engines, length caps; and where the
engines live (EngineHosting: in the task's process, or long-lived actors of a Ray cluster)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from settings.checks import SAMPLES_MAX, TOKENS_MAX, WORKERS_MAX, FieldError, check_fields, in_range


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


# The variables that carry EngineHosting to every task process (set by the user or the deployment, as
# RAY_ADDRESS is): a task's environment reaches it locally and on a cluster, and never enters a cache key.
ENGINES_RAY_ADDRESS_ENV = "DAPO_ENGINES_RAY_ADDRESS"
ENGINES_NAMESPACE_ENV = "DAPO_ENGINES_NAMESPACE"
_ADDRESS = re.compile(r"auto|(ray://)?[A-Za-z0-9_.\-\[\]:]+:[0-9]{1,5}")
_NAMESPACE = re.compile(r"[A-Za-z0-9_.\-]{1,128}")


@dataclass(frozen=True)
class EngineHosting:
    """Where the rollout and evaluation engines live: it changes where they run, never what they sample
    (every request carries its own seed), so it is kept out of every cache key and config digest.

    Unset (the default), engines live as today: in the task's process, or as Ray actors owned by it
    (several GPUs) that die with it. Set, they are named, detached Ray actors of a long-lived Ray cluster,
    found by name by each task process and kept (weights included) between tasks; a new checkpoint
    reaches them by in-place weight reload (engines/rollout/ray_engines.py; docs/WARM_ENGINES.md).
    """

    ray_address: str = ""  # "" = engines in the task's process, as before; "auto", "host:port" or "ray://host:port"
    namespace: str = ""  # the engines' Ray namespace; "" = the run's own (derived from its folder by the driver)

    def __post_init__(self) -> None:
        check_fields(self, {
            "ray_address": (not self.ray_address or bool(_ADDRESS.fullmatch(self.ray_address)),
                            "must be empty, 'auto', 'host:port' or 'ray://host:port'"),
            "namespace": (not self.namespace or bool(_NAMESPACE.fullmatch(self.namespace)),
                          "must be empty or 1-128 letters, digits, '_', '.' or '-'"),
        })

    @property
    def persistent(self) -> bool:
        """Whether the engines are long-lived named actors (a Ray address is set)."""
        return bool(self.ray_address)

    @property
    def ray_namespace(self) -> str:
        """The namespace the engines live in: the one named, else a shared default (outside a run)."""
        return self.namespace or "dapo-engines"

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> EngineHosting:
        """The hosting the task process's environment names (unset variables: the defaults); a bad value
        raises FieldError naming the variable."""
        values = {"ray_address": environ.get(ENGINES_RAY_ADDRESS_ENV, ""),
                  "namespace": environ.get(ENGINES_NAMESPACE_ENV, "")}
        try:
            return cls(**values)
        except FieldError as err:
            variable = {"ray_address": ENGINES_RAY_ADDRESS_ENV, "namespace": ENGINES_NAMESPACE_ENV}[err.field]
            raise FieldError(variable, err.value, err.why) from None

    def environ(self) -> dict[str, str]:
        """The variables that give a task process this hosting (``from_environ`` reads them back)."""
        return {ENGINES_RAY_ADDRESS_ENV: self.ray_address, ENGINES_NAMESPACE_ENV: self.namespace}
