"""Run a driver task (the pipeline, the ablation ladder) through Flyte locally, in its run folder.

What `dapo run` and `dapo ablate` do between parsing their arguments and printing the result:
check the inputs and the local GPU plan before any work, point Flyte's local cache and run
records at the run folder, take the folder's lock, and turn Ctrl-C or SIGTERM into a clean stop
(workers killed, the run's records closed, nothing half-published) raised as
:class:`RunInterrupted`. The cluster's counterpart is cli/launch.py (``dapo run --remote``).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import flyte

from infra.flyte_local_db import use_wal
from infra.flyte_patches import forget_config_file_lookup, sync_flyte_connections_normally
from storage import run_store
from storage.run_layout import RunLayout
from storage.run_summary import resolve_paths
from workflows import progress
from workflows.config import RunConfig
from workflows.local_flyte import run_local
from workflows.run_binding import check_run_folder, hold_run_folder
from workflows.run_records import close_open_actions, db_path

T = TypeVar("T")

# How often the main thread looks for a Ctrl-C while a driver runs (see ``call_interruptibly``).
INTERRUPT_POLL_S = 0.1


def _flyte_config(layout: RunLayout) -> Path:
    """Write this run's Flyte config: local cache DB and run records live in the run folder.

    Flyte 2 keeps its local cache next to the config file in use, so a per-run config means a
    deleted run folder can never leave cache entries that point at deleted shards. For a run in
    an object store this folder is in the local mirror (storage/run_store.py): the cache and
    records belong to the machine that drives the run.
    """
    flyte_dir = run_store.local_path(layout.flyte_dir)
    flyte_dir.mkdir(parents=True, exist_ok=True)
    path = flyte_dir / "config.yaml"
    if not path.exists():
        path.write_text("image:\n  builder: local\nlocal:\n  persistence: true\n")
    return path


def init_flyte_for_run(layout: RunLayout) -> Path:
    """``flyte.init_from_config`` with the run's own config (cache + run records in the run folder)."""
    os.environ.setdefault("DO_NOT_TRACK", "1")  # the SDK sends telemetry otherwise
    path = _flyte_config(layout)
    # The SDK finds its local cache through the same search as `flyte` CLI config; point it here.
    os.environ["FLYTECTL_CONFIG"] = str(path.resolve())
    # flyte.config memoises the config-file lookup, possibly at import time; forget it so the
    # lookup sees the variable just set (a private-SDK patch: infra/flyte_patches.py).
    forget_config_file_lookup()
    shadows = [shadow for shadow in (Path("config.yaml"), Path(".flyte") / "config.yaml") if shadow.exists()]
    for shadow in shadows:
        progress.note(f"warning: {shadow} in the current folder takes precedence over the run's Flyte config; "
                      "the local cache will live next to it instead of in the run folder", warning=True)
    if not shadows:  # five SQLite commits per task call: WAL without a sync per commit (infra/flyte_local_db.py)
        use_wal(db_path(layout))
    sync_flyte_connections_normally()
    flyte.init_from_config(str(path.resolve()))
    return path


class RunInterrupted(Exception):
    """Ctrl-C (or SIGTERM: ``terminated``) stopped ``dapo run``; the message says what was interrupted."""

    def __init__(self, message: str, *, terminated: bool = False) -> None:
        super().__init__(message)
        self.terminated = terminated


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived (``kill``; Kubernetes stopping the pod, before its SIGKILL): the run stops as
    Ctrl-C stops it."""


@contextlib.contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """Within the block SIGTERM stops the run as Ctrl-C does (workers stopped, the run's records
    closed, nothing half-published; exit 143), instead of ending the driver where it stands, which
    left its warm group's temp folder and vLLM's rendezvous file behind. Main thread only."""
    def stop(signum: int, frame: object) -> None:
        raise Terminated

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_pipeline(config: RunConfig, run_root: str | Path) -> dict[str, Any]:
    """Run (or resume) the whole pipeline through Flyte locally; returns the summary.

    Before any work: takes the run folder's lock (one driver per folder) and refuses a folder
    whose run.json records another config (workflows/run_binding.py). Ctrl-C stops the
    workers and raises :class:`RunInterrupted`.
    """
    from workflows import driver

    layout = run_layout(config, run_root)
    if not run_store.is_remote(run_root):
        Path(layout.root).mkdir(parents=True, exist_ok=True)
    # For an object-store root the lock is on this machine's mirror of the run folder.
    with hold_run_folder(run_store.local_path(layout.root), note=lambda line: progress.note(line, warning=True)):
        check_run_folder(layout, config.to_dict(), driver.generating_versions())
        outcome = run_driver_locally(
            layout, driver.dapo_pipeline,
            interrupted=lambda: (f"interrupted during {progress.where()} of run folder "
                                 f"{layout.root}; nothing half-published: re-run the same command to resume"),
            run_config=config,
            run_dir=str(layout.root),
        )
    return resolve_paths(json.loads(run_store.read_text(outcome.summary.path)), layout.root)  # summary.json: relative paths


def run_layout(config: RunConfig, run_root: str | Path) -> RunLayout:
    """The run folder of ``config`` under ``run_root`` (a path, made absolute, or an object-store URI)."""
    if run_store.is_remote(run_root):
        return RunLayout(run_store.join(str(run_root), config.run.name))
    return RunLayout(Path(run_root).resolve() / config.run.name)


def run_driver_locally(layout: RunLayout, task: Any, *, interrupted: Callable[[], str], **inputs: Any) -> Any:
    """Run a driver task (``dapo_pipeline``, ``dapo_ablation``) through local Flyte in its folder.

    Call with the folder's lock held and its config checked. First clears what a killed driver
    left (its temp folders, its "running" action records); Ctrl-C stops the workers, closes this
    run's records and raises :class:`RunInterrupted` with ``interrupted()``'s message. Returns
    the task's output.
    """
    from engines.train.launch import clean_stale_temp_dirs

    clean_stale_temp_dirs()  # what a kill -9 of an earlier run left in the temp folder
    close_open_actions(layout, "abandoned: the driver of this folder stopped (killed) before the action finished")
    try:
        init_flyte_for_run(layout)
        flyte_dir = run_store.local_path(layout.flyte_dir)
        outputs = call_interruptibly(
            lambda: run_local(task, inputs, raw_data=flyte_dir / "raw", actions=flyte_dir / "actions"))
    except KeyboardInterrupt as stop:
        terminated = isinstance(stop, Terminated)
        for signum in (signal.SIGINT, signal.SIGTERM):  # a second one must not break the clean-up
            signal.signal(signum, signal.SIG_IGN)
        stop_workers()
        close_open_actions(layout, f"{'stopped (SIGTERM)' if terminated else 'interrupted (Ctrl-C)'} before the action finished")
        raise RunInterrupted(interrupted(), terminated=terminated) from None
    return outputs


def call_interruptibly(call: Callable[[], T]) -> T:
    """``call()`` on a helper thread while the main thread waits in short slices; returns its result.

    Why: CPython runs signal handlers on the main thread only, but the kernel may hand a
    terminal's SIGINT to any thread of the process that does not block it, and a driver has
    dozens (Flyte's event loops and task threads, gloo, OpenMP, tensorboard). Caught on another
    thread, the signal only sets a flag; a main thread parked in an untimed lock wait (Flyte's
    synchronous ``run`` waits for the whole run that way) would not look at it until the run ended,
    so the run went on, published its steps and only then exited. Waking every
    ``INTERRUPT_POLL_S`` lets the main thread raise ``KeyboardInterrupt`` within that time
    wherever the signal landed. The call runs in a copy of the caller's context (contextvars).
    """
    outcome: dict[str, Any] = {}
    finished = threading.Event()
    context = contextvars.copy_context()

    def target() -> None:
        try:
            outcome["value"] = context.run(call)
        except BaseException as err:  # noqa: BLE001 - handed to the main thread, which re-raises it
            outcome["error"] = err
        finally:
            finished.set()

    threading.Thread(target=target, name="dapo-driver", daemon=True).start()
    while not finished.wait(INTERRUPT_POLL_S):
        pass
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def stop_workers() -> None:
    """Kill this process's worker processes (warm DeepSpeed group, vLLM engine core) now.

    Called on Ctrl-C, while a task thread may still hold the group's lock: kills without it.
    """
    from engines.train import server as train_server
    from engines.rollout import vllm_engine

    train_server.stop_now()
    vllm_engine.clear_engine_cache()
    try:
        vllm_engine.release_process_group()
    except Exception:  # noqa: BLE001  best effort on the way out: an engine mid-generation may object
        pass
    me = os.getpid()
    for pid in reversed(train_server.process_tree(me)[1:]):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def check_input_paths(config: RunConfig) -> None:
    """Every local or object-store path of ``config`` (``run.data`` files, which give the held-out
    evaluation set too; ``bootstrap.source``) exists, before curation and before the run folder is made
    or bound: a typo is bad input, refused in one line (``CurationError``, ``BootstrapError``: exit 2)
    in seconds, not after curation, and nothing is left that blocks the corrected command."""
    from engines.bootstrap.stage import BootstrapError, check_import_folder, resolve_source
    from readers.problem_files import CurationError, parse_input_spec

    for spec in config.run.data:
        parsed = parse_input_spec(spec)
        if parsed.kind == "file" and not _is_file(parsed.target):
            raise CurationError(f"run.data: {parsed.target}: no such file")
        if parsed.kind == "hf" and parsed.target.startswith(("/", "./", "../")) and not Path(parsed.target).exists():
            raise CurationError(f"run.data: hf:{parsed.target}: no such folder")
    source = resolve_source(config.bootstrap.source)  # an unknown shipped:NAME is refused here
    if source == "tiny":
        return
    if run_store.is_remote(source):
        if not run_store.exists(run_store.join(source, "config.json")):
            raise BootstrapError(f"bootstrap source {source}: no config.json there (bootstrap.source is 'tiny', "
                                 "'shipped:NAME', a local HF model folder or an object-store URI)")
        return
    check_import_folder(source)


def _is_file(target: str) -> bool:
    """Whether a data file exists: a local path, or an object in an object store."""
    return run_store.exists(target) if run_store.is_remote(target) else Path(target).is_file()


def local_cuda() -> tuple[int, int]:
    """``(CUDA GPUs here, bytes of the first)``; ``(0, 0)`` without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return 0, 0
    return torch.cuda.device_count(), torch.cuda.get_device_properties(0).total_memory


def shared_gpu_plan(config: RunConfig, gpu_memory_bytes: int) -> Any:
    """infra/sizing.py's plan of a GPU the engine and training rank 0 share, or None for the tiny policies
    (they fit any GPU). The shape is the bootstrap.source folder's config.json; a model without one is
    bad input. Raises sizing.PlanDoesNotFit (one line) when the run cannot fit."""
    from engines.bootstrap.stage import SHIPPED_PREFIX, BootstrapError, resolve_source
    from infra import model_shape, sizing

    if config.bootstrap.source == "tiny" or config.bootstrap.source.startswith(SHIPPED_PREFIX):
        return None
    source = resolve_source(config.bootstrap.source)
    try:
        arch = model_shape.load_architecture(source)
    except ValueError as err:
        raise BootstrapError(f"bootstrap.source: {err}") from err
    rollout, train = config.rollout, config.train
    return sizing.plan_shared_gpu(
        arch, zero_stage=train.zero_stage, micro_batch_samples=train.micro_batch_samples,
        tokens_per_sequence=rollout.max_model_len or sizing.PLAN_PROMPT_TOKENS + rollout.max_response_tokens,
        samples_per_prompt=rollout.samples_per_prompt, train_processes=train.num_processes,
        gpu_memory_bytes=gpu_memory_bytes, gpu_memory_utilization=rollout.gpu_memory_utilization,
        # pipelined, the next step's rounds generate while the ranks train: the engine is awake then
        engine_sleeps=rollout.sleep_between_rounds and not config.run.pipelined,
        logprob_chunk_tokens=train.logprob_chunk_tokens, precision=train.precision,
    )


def check_local_gpu_plan(config: RunConfig) -> Any:
    """Before any work of a run on a CUDA host: one rank per GPU, and the shared GPU's plan (returned;
    None without CUDA or for the tiny policies). Raises PlanDoesNotFit / BootstrapError (one line)."""
    from infra.sizing import PlanDoesNotFit

    gpus, memory = local_cuda()
    if not gpus:
        return None
    if config.train.num_processes > gpus:
        raise PlanDoesNotFit(f"train.num_processes={config.train.num_processes} but this machine has {gpus} CUDA "
                             f"GPU(s): a local run places one rank per GPU (set train.num_processes={gpus})")
    return shared_gpu_plan(config, memory)
