"""Launch DAPO training steps on DeepSpeed workers, cold or on a warm worker group.

The trainer runs in worker processes: ``torchrun --standalone --nproc_per_node N -m engines.train.worker
SPEC.json`` (each step its own process group), or a warm worker group kept between steps
(engines/train/server.py) that later steps send requests to. A step's output is built in a hidden
staging folder and published by rename; a step already published from the same config and batch
is reused (engines/train/publish.py). The Flyte task (tasks/train.py) and ``dapo train`` call
:func:`train_step_in_store`. With a long-lived Ray cluster named (settings/rollout.py: EngineHosting)
the warm group lives in the train host instead, a named actor that outlives the task process and runs
this same function there (engines/train/ray_host.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import schemas
from engines.runtime import threads
from engines.train import server as train_server
from engines.train import batch as tb
from engines.train import node_group, replay
from engines.train.checkpoint import parent_fetch_skip, resumes_optimizer_state, writes_optimizer_state
from engines.train.publish import (
    NodeGroupLost,
    TrainInputError,
    TrainStepError,
    TrainStepResult,
    batch_sha256_of,
    publish_step,
    reusable_step,
    train_code_version,
)
from engines.train.spec import DS_META_FILE, DS_STATE_DIR
from settings.rollout import EngineHosting
from settings.train import TrainConfig
from storage import checkpoints, outputs, run_store

REPO_ROOT = Path(__file__).resolve().parents[2]


def _worker_env(num_processes: int) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    # Oversubscribed threads are catastrophic on small machines: split the cores between ranks (the
    # trainer's share of them while pipelined rollouts run beside it: engines/runtime/threads.py).
    env.setdefault("OMP_NUM_THREADS", str(max(1, threads.stage_cpus() // num_processes)))
    env.setdefault("DS_ACCELERATOR", "cuda" if _has_cuda() else "cpu")
    # A rank killed by a signal (a C++ abort, a segfault) prints its threads' Python stacks into the
    # worker log, which a failed step's error quotes.
    env.setdefault("PYTHONFAULTHANDLER", "1")
    return env


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _launch(spec: dict[str, Any], work_dir: Path, *, num_processes: int, timeout_s: float, step: int) -> None:
    spec_path = work_dir / "spec.json"
    spec_path.write_text(json.dumps(spec, indent=2))
    cmd = train_server.torchrun_command(num_processes, spec_path)
    log = train_server.WorkerLog.open(work_dir, f"DeepSpeed workers: step {step}, {num_processes} rank(s), one-off launch")
    with log.path.open("ab") as handle:
        # Own session, and on timeout torchrun and every rank (each in a session of its own) are
        # killed: none orphaned (train_server.kill_tree).
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=_worker_env(num_processes), stdout=handle,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired as err:
            train_server.kill_tree(proc)
            raise TrainStepError(f"step {step}: training workers ran past {timeout_s} s (nothing published)") from err
        except BaseException:
            train_server.kill_tree(proc)
            raise
    if proc.returncode != 0:
        errors = sorted(work_dir.glob("error.txt.rank*"))
        if errors:
            first_line = errors[0].read_text().splitlines()[0]
            raise TrainStepError(f"step {step}: training failed: {first_line} (nothing published)")
        tail = log.tail(30)
        raise TrainStepError(f"step {step}: training workers exited with {proc.returncode} (nothing published):\n{tail}")


# Spec fields that change from request to request; all others are baked into a warm group's engine.
_REQUEST_FIELDS = ("parent_checkpoint", "resume_ds_state", "start_updates", "steps", "out_dir", "write_state",
                   "probe_input_ids", "probe_path")


# TrainConfig fields that do not shape the engine (a change must not restart a warm group).
_NOT_ENGINE_FIELDS = ("timeout_s", "keep_workers_warm", "optimizer_state_every")


def engine_key(config: TrainConfig) -> str:
    """The settings a warm group's engine is built from (JSON): another key needs another group."""
    return json.dumps({k: v for k, v in asdict(config).items() if k not in _NOT_ENGINE_FIELDS}, sort_keys=True)


def _group_key(config: TrainConfig, env: dict[str, str]) -> str:
    """Everything a warm group's engine is built from, its launch environment included."""
    launch = {k: env.get(k) for k in ("OMP_NUM_THREADS", "DS_ACCELERATOR", "PYTHONPATH", "CUDA_VISIBLE_DEVICES")}
    return json.dumps({"config": engine_key(config), "env": launch, "python": sys.executable}, sort_keys=True)


def _hosted(config: TrainConfig, hosting: EngineHosting | None) -> EngineHosting | None:
    """The hosting whose train host runs this process's warm steps, or None: they run here. A warm group
    on a long-lived cluster (a Ray address named) lives in the train host; cold steps always run here."""
    hosting = hosting if hosting is not None else EngineHosting.from_environ(os.environ)
    return hosting if hosting.persistent and config.keep_workers_warm else None


def on_train_host(config: TrainConfig) -> bool:
    """True when this process's steps run on the train host: a long-lived Ray cluster named in the environment,
    and warm workers (on one node or several: engines/train/ray_host.py)."""
    return _hosted(config, None) is not None


def rank_threads(num_processes: int) -> str:
    """The OpenMP threads this process gives each rank (the train host's ranks get the same)."""
    return _worker_env(num_processes)["OMP_NUM_THREADS"]


def _run_warm(spec: dict[str, Any], work_dir: Path, staging: Path, *, config: TrainConfig, step: int,
              parent_id: str, resume: bool
              ) -> tuple[list[dict[str, Any]], dict[str, float], train_server.WorkerGroup | None]:
    """Run the request on this process's warm group (started if needed); call with the lock held.

    Returns (worker metrics, extra timings, the group or None when the step fell back to a cold
    launch). A group that is dead or hung before it ran the step is replaced by a cold launch of
    the step, with a warning; a failure of the step itself is a TrainStepError as in the cold path.
    """
    env = _worker_env(config.num_processes)
    engine_spec = {k: v for k, v in spec.items() if k not in ("metrics_path", "error_path")}
    request = {k: spec[k] for k in _REQUEST_FIELDS}
    node = node_group.joined()  # this process leads a group spanning nodes (engines/train/ray_host.py)
    group: train_server.WorkerGroup | None = None
    try:
        group, started = train_server.acquire(key=_group_key(config, env), num_processes=config.num_processes,
                                              engine_spec=engine_spec, env=env, node=node)
        group.relay = node_group.relay()
        # Continue from memory only if a cold launch would load exactly that state: the parent is
        # what this group last published, and its optimizer state is resumed (not a fresh one).
        continue_ok = not started and resume and group.last_checkpoint_id == parent_id
        group.last_checkpoint_id = None  # until this step's output is published
        metrics = group.submit(request, continue_in_memory=continue_ok, timeout_s=config.timeout_s)
    except train_server.GroupUnavailable as err:
        if group is not None:
            train_server.discard(group)  # dead, hung, or killed by stop_now: its temp folder goes with it
        if train_server.stopping():
            raise TrainStepError(f"step {step}: interrupted (nothing published)") from err
        if node is not None:  # a cold launch here would put every node's ranks on this one
            raise NodeGroupLost(f"step {step}: the warm group on {node.nodes} nodes is gone: {err}") from err
        warnings.warn(f"step {step}: {err}; running this step with a cold launch", RuntimeWarning, stacklevel=3)
        shutil.rmtree(staging, ignore_errors=True)  # whatever the dead group half-wrote
        staging.mkdir()
        _launch(spec, work_dir, num_processes=config.num_processes, timeout_s=config.timeout_s, step=step)
        return json.loads((work_dir / "metrics.json").read_text()), {"warm_group": 0.0, "warm_fallback": 1.0}, None
    except train_server.GroupStepFailed as err:
        train_server.discard(group)
        raise TrainStepError(f"step {step}: training failed: {err} (nothing published)") from err
    except train_server.GroupTimeout as err:
        train_server.discard(group)
        raise TrainStepError(f"step {step}: training workers ran past {config.timeout_s} s (nothing published)") from err
    except BaseException:
        if group is not None:
            train_server.discard(group)  # e.g. KeyboardInterrupt mid-step: the engine state is unknown
        raise
    extra = {"warm_group": 1.0, "warm_fallback": 0.0, "group_started": float(started),
             "group_start_s": group.start_s if started else 0.0,
             "continued_in_memory": float(bool(metrics[0].get("continued_in_memory")))}
    return metrics, extra, group


def _held_in_memory(config: TrainConfig, parent_id: str) -> bool:
    """True when this process's warm group holds exactly ``parent_id`` (it published it last): a
    parent written without its optimizer state (train.optimizer_state_every > 1) continues from
    memory as one with it would (the worker re-checks the parent's record: checkpoint.ds_state_matches)."""
    group = train_server.active_group()
    return (config.keep_workers_warm and group is not None and group.alive and group.owner_pid == os.getpid()
            and group.key == _group_key(config, _worker_env(config.num_processes))
            and group.last_checkpoint_id == parent_id)


def start_workers(config: TrainConfig, *, hosting: EngineHosting | None = None) -> None:
    """Start this process's warm worker group for ``config`` now and return at once (with a long-lived
    Ray cluster named, the train host's group: engines/train/ray_host.py; ``hosting`` None: the one the
    environment names).

    The ranks import torch, DeepSpeed and transformers (and what the first engine build would
    import, engines/train/worker.py: _preload), join their process group and wait for the first
    request (engines/train/worker.py: _serve), so a caller that knows the training settings
    early (the local driver, at the start of a run) has the group's start overlap its curation,
    step-0 policy and evaluation instead of charging it to the first step. The first step then
    builds its engine from its parent checkpoint as any reloaded step does. Nothing happens when
    workers are not kept warm or a group with this key is up; a group that cannot start now is
    left to the first step (which starts one, or runs cold).
    """
    if not config.keep_workers_warm:
        return
    hosted = _hosted(config, hosting)
    if hosted is not None:
        from engines.train import ray_host

        ray_host.start_workers(start_workers, config, engine_key(config), rank_threads(config.num_processes), hosted)
        return
    env = _worker_env(config.num_processes)
    # The engine is built per request, and every request carries all of _REQUEST_FIELDS: the base
    # spec needs only the settings.
    engine_spec = {"train": asdict(config), **dict.fromkeys(_REQUEST_FIELDS)}
    with train_server.lock():
        try:
            train_server.acquire(key=_group_key(config, env), num_processes=config.num_processes,
                                 engine_spec=engine_spec, env=env)
        except train_server.GroupUnavailable:
            pass


def _check_batches(steps: Sequence[tuple[int, Sequence[str | Path]]], config: TrainConfig,
                   parent_version: int) -> list[dict[str, Any]]:
    """Validate every step's batch before any process starts (bad input fails fast and clearly);
    returns ``[{"step", "shards", "parent_version"}]`` for the worker spec and the lineage.

    ``parent_version`` is the step of the checkpoint the first step updates; each later step
    updates the previous one's output. A sample's policy lag is its step's parent version minus
    its ``policy_version`` (dapo_core/correction.py); a sample newer than the parent is refused.
    """
    batches_meta = []
    for step, shards in steps:
        try:
            rows = tb.load_rows([str(s) for s in shards])
            tb.check_trainable(rows, step=int(step))
        except tb.TrainBatchError as err:
            raise TrainInputError(f"step {step}: bad training batch: {err}") from err
        newer = [r for r in rows if r.policy_version > parent_version]
        if newer:
            raise TrainInputError(
                f"step {step}: {newer[0].origin} (rollout_id {newer[0].rollout_id!r}) has policy_version "
                f"{newer[0].policy_version}, newer than the parent checkpoint it would update (step {parent_version})"
            )
        if len(rows) < config.updates_per_step:
            raise TrainInputError(
                f"step {step}: {len(rows)} kept samples cannot fill updates_per_step={config.updates_per_step} mini-batches"
            )
        # What this check validated, by content: the workers skip the schema checks for these
        # exact bytes (schemas.trust_validated) and validate any other content they find.
        batches_meta.append({"step": int(step), "shards": [str(Path(s).resolve()) for s in shards],
                             "parent_version": int(parent_version),
                             "validated_sha256": [schemas.validated_sha256(s) for s in tb.shard_files(shards)]})
        parent_version = int(step)
    return batches_meta


def schedule_start(checkpoint_dir: Path, *, config: TrainConfig, resume: bool) -> int:
    """Optimizer updates the parent checkpoint's LR schedule has taken: where this launch's schedule
    starts (engines/train/engine.py: warmup_scheduler), whether or not it resumes the parent's state.

    Refuses (:class:`TrainInputError`, before any worker starts) a step>0 parent whose optimizer
    state ``train.resume_optimizer`` asks for but this step cannot resume (``resume``: pruned, never
    kept, or not vouched for by its digest record), rather than falling back to a fresh optimizer
    unsaid; and a parent written before checkpoints recorded their update count, with no optimizer
    state to read it from, when a warm-up makes the count matter.
    """
    parent = checkpoints.read_info(checkpoint_dir)
    if parent.produced_by != "train":
        return 0  # a step-0 policy (built or imported): its run's first update is next
    if config.resume_optimizer and not resume:
        raise TrainInputError(_cannot_resume(checkpoint_dir, parent.step))
    if parent.optimizer_updates is not None:
        return parent.optimizer_updates
    meta = checkpoint_dir / DS_STATE_DIR / DS_META_FILE
    if meta.is_file():  # written before the count was recorded in the checkpoint: its state's record has it
        return int(json.loads(meta.read_text())["updates_done"])
    if config.warmup_steps == 0:
        return 0  # a flat schedule: every update runs at train.lr, wherever the count stands
    raise TrainInputError(
        f"{checkpoint_dir} (step {parent.step}) was written before checkpoints recorded their optimizer update "
        f"count and has no optimizer state ({DS_STATE_DIR}/) to read it from, so where its LR warm-up stands is "
        f"unknown (train.warmup_steps={config.warmup_steps}); train from a checkpoint that kept its optimizer state, "
        "or set train.warmup_steps=0"
    )


def _cannot_resume(checkpoint_dir: Path, step: int) -> str:
    """The one line that refuses to train from ``checkpoint_dir`` (a local copy of a store's checkpoint
    is named, and looked at, in the store) without the optimizer state asked for."""
    origin = run_store.source_name(checkpoint_dir)
    fix = ("set train.resume_optimizer=false to train from its weights with a fresh optimizer (the LR schedule "
           "continues where it stood)")
    if not run_store.exists(run_store.join(origin, DS_STATE_DIR, DS_META_FILE)):
        return (f"{origin} (step {step}) has no optimizer state ({DS_STATE_DIR}/ pruned by the retention "
                "policy, or not kept: train.keep_optimizer_state was false), and train.resume_optimizer=true asks "
                f"to resume it; {fix}")
    problems = checkpoints.unvouched_optimizer_state(origin) or ["not written by a training step"]
    more = f" and {len(problems) - 1} more" if len(problems) > 1 else ""
    return (f"{origin} (step {step}): its optimizer state is not loaded, since no digest record the pipeline "
            f"wrote vouches for it ({problems[0]}{more}; DeepSpeed's state is pickles, which can run code), and "
            f"train.resume_optimizer=true asks to resume it; {fix}, or train from the checkpoint in its run folder")


def _worker_spec(checkpoint_dir: Path, batches_meta: list[dict[str, Any]], staging: Path, work_dir: Path, *,
                 config: TrainConfig, resume: bool, write_state: bool | None = None,
                 probe_input_ids: list[list[int]] | None = None, probe_path: str | Path | None = None
                 ) -> dict[str, Any]:
    """The JSON spec every worker rank gets (engines/train/spec.py: WorkerSpec); refuses a parent
    whose optimizer state or schedule cannot be continued (:func:`schedule_start`). ``write_state``
    None: the last step's checkpoint holds ds_state/ as the config says (writes_optimizer_state)."""
    if write_state is None:
        write_state = writes_optimizer_state(int(batches_meta[-1]["step"]), config) if batches_meta else True
    ds_state = checkpoint_dir / DS_STATE_DIR
    start_updates = schedule_start(checkpoint_dir, config=config, resume=resume)
    return {
        "train": asdict(config),  # the stage's settings whole: the worker reads what it needs
        "parent_checkpoint": str(checkpoint_dir.resolve()),
        "resume_ds_state": str(ds_state.resolve()) if resume else None,
        "start_updates": start_updates,
        "steps": batches_meta,
        "out_dir": str(staging.resolve()),
        "write_state": write_state,
        "metrics_path": str(work_dir / "metrics.json"),
        "error_path": str(work_dir / "error.txt"),
        "probe_input_ids": probe_input_ids,
        "probe_path": str(probe_path) if probe_path is not None else None,
    }


def train_steps(
    checkpoint_dir: str | Path,
    steps: Sequence[tuple[int, Sequence[str | Path]]],
    out_dir: str | Path,
    *,
    config: TrainConfig,
    probe_input_ids: list[list[int]] | None = None,
    probe_path: str | Path | None = None,
    resume: bool | None = None,
    reuse_decided: bool = False,
    write_state: bool | None = None,
) -> TrainStepResult:
    """Run consecutive training steps in ONE engine launch and publish only the last checkpoint.

    The pipeline calls ``train_step`` (one step); several steps in one engine keep the optimizer
    in memory, which tests compare with steps chained through saved checkpoints.
    ``probe_input_ids`` (equal-length rows) makes the workers save the updated policy's logits
    on them to ``probe_path`` (tests: the export must reload with identical logits).
    ``resume``: whether the first step restores the parent's optimizer state, as
    ``train_step_in_store`` decided it on the checkpoint in the run store (its digest record
    vouches for it: engines/train/checkpoint.py: resumes_optimizer_state); None decides it here on
    ``checkpoint_dir``, a local folder the caller trusts as a train step published it (the digest
    record is not required); either way only a train step's state is resumed, and it is unpickled
    weights-only. ``reuse_decided``: the caller already made the reuse decision (reusable_step) for
    ``out_dir`` (``train_step_in_store``, on the store's names), so it is not made again here.
    ``write_state``: whether the checkpoint holds ds_state/ (None: as the config says).

    A parent written without its optimizer state (train.optimizer_state_every > 1) continues in the
    warm group that holds it in memory; otherwise its state is rebuilt first (engines/train/replay.py).
    """
    if not steps:
        raise TrainStepError("no step to run")
    last_step = int(steps[-1][0])
    checkpoint_dir, out_dir = Path(checkpoint_dir), Path(out_dir)
    t_start = time.perf_counter()
    parent = checkpoints.read_info(checkpoint_dir)  # refuses incomplete checkpoints
    if not reuse_decided:
        batch_sha256 = batch_sha256_of([s for _, shards in steps for s in shards])
        reused = reusable_step(out_dir, parent=checkpoint_dir, step=last_step, config=config,
                               batch_sha256=batch_sha256, code_version=train_code_version())
        if reused is not None:
            return reused
    batches_meta = _check_batches(steps, config, parent.step)
    if resume is None:
        resume = config.resume_optimizer and parent.produced_by == "train" and \
            (checkpoint_dir / DS_STATE_DIR / DS_META_FILE).is_file()
    staging = checkpoints.staging_dir(out_dir)
    work_dir = Path(tempfile.mkdtemp(prefix=f"dapo-train-{last_step}-pid{os.getpid()}-"))
    replayed = 0  # steps replayed to rebuild the parent's optimizer state (recorded in the timings)
    into, train = _replay_place(out_dir, work_dir)
    try:
        if not resume and replay.needs_replay(parent, config):
            if not _held_in_memory(config, parent.checkpoint_id):
                checkpoint_dir, replayed = replay.rebuild(run_store.source_name(checkpoint_dir), config=config,
                                                          into=into, train=train)
            resume = True
        spec = _worker_spec(checkpoint_dir, batches_meta, staging, work_dir, config=config, resume=resume,
                            write_state=write_state, probe_input_ids=probe_input_ids, probe_path=probe_path)
        with train_server.lock() if config.keep_workers_warm else contextlib.nullcontext():
            t_launch = time.perf_counter()
            group = None
            if config.keep_workers_warm:
                worker_metrics, extra, group = _run_warm(spec, work_dir, staging, config=config, step=last_step,
                                                         parent_id=parent.checkpoint_id, resume=resume)
            else:
                _launch(spec, work_dir, num_processes=config.num_processes, timeout_s=config.timeout_s, step=last_step)
                worker_metrics, extra = json.loads((work_dir / "metrics.json").read_text()), {"warm_group": 0.0}
            launch_s = time.perf_counter() - t_launch
            if replayed:
                extra = {**extra, "replayed_steps": float(replayed)}
            result = publish_step(worker_metrics, extra, launch_s, staging=staging, out_dir=out_dir, config=config,
                                  last_step=last_step, parent_id=parent.checkpoint_id, batches_meta=batches_meta,
                                  resume=resume, t_start=t_start)
            if group is not None:
                group.last_checkpoint_id = result.checkpoint_id  # published: the next step may continue
            return result
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(work_dir, ignore_errors=True)
        if into.exists():
            _remove_replayed(into)


def _replay_place(out_dir: Path, work_dir: Path) -> tuple[Path, Any]:
    """Where a replay (engines/train/replay.py) builds its checkpoints, and how it trains each: in this
    process's work folder; or, leading a group on several nodes, in a hidden folder beside the step's output,
    which every node reads (on an object store each replayed step is uploaded, every node its ranks' files:
    the next one's peers fetch their share of its state from there). A killed run's is removed with the
    staging folders (checkpoints.clean_stale_staging)."""
    if node_group.joined() is None:
        return work_dir / "replay", train_steps
    return out_dir.parent / f".{out_dir.name}.staging-replay-{os.getpid()}", _train_shared


def _train_shared(*args: Any, **kwargs: Any) -> TrainStepResult:
    """``train_steps`` of a replayed step on a group of nodes, its checkpoint then uploaded where the store
    names it (the other nodes' ranks uploaded theirs before the lead's marker)."""
    result = train_steps(*args, **kwargs)
    uri = run_store.source_name(result.checkpoint_dir)
    if run_store.is_remote(uri):
        run_store.upload_folder(result.checkpoint_dir, uri, clear=False)
    return result


def _remove_replayed(into: Path) -> None:
    """Remove a replay's checkpoints, here and in the store."""
    uri = run_store.source_name(into)
    shutil.rmtree(into, ignore_errors=True)
    if run_store.is_remote(uri):
        run_store.clear_folder(uri, marker=None)


def train_step(
    checkpoint_dir: str | Path,
    scored_shards: Sequence[str | Path],
    out_dir: str | Path,
    *,
    step: int,
    config: TrainConfig,
    resume: bool | None = None,
    reuse_decided: bool = False,
) -> TrainStepResult:
    """One DAPO step: update the policy in ``checkpoint_dir`` on the kept rows of ``scored_shards``.

    Publishes the next checkpoint at ``out_dir`` (atomic) and returns its id, StepMetrics row and
    timings. Raises ``TrainStepError`` naming the step on bad input or a failed update.
    ``resume``, ``reuse_decided``: as for :func:`train_steps`.
    """
    return train_steps(checkpoint_dir, [(step, list(scored_shards))], out_dir, config=config, resume=resume,
                       reuse_decided=reuse_decided)


def train_step_in_store(
    checkpoint_dir: str,
    scored_shards: Sequence[str],
    out_dir: str,
    *,
    step: int,
    config: TrainConfig,
    hosting: EngineHosting | None = None,
) -> TrainStepResult:
    """``train_step`` where the run store may be an object store (storage/run_store.py).

    The parent checkpoint (with its optimizer state, and without its HF weights when the step
    resumes that state, which restores them) and the batch are fetched into the local mirror; the
    step publishes into the mirror, and the folder is uploaded with its ``dapo_checkpoint.json``
    last. The result names ``out_dir`` as given (the URI). The optimizer state is resumed only when
    the checkpoint's digest record, written when the pipeline published it, vouches for it
    (engines/train/checkpoint.py: resumes_optimizer_state); asked to resume one that it does not
    vouch for, the step is refused (:func:`schedule_start`).

    ``hosting`` (None: the one the environment names): with a Ray address and warm workers, the step runs
    on the train host, which calls this function with a local hosting (engines/train/ray_host.py).
    """
    hosted = _hosted(config, hosting)
    if hosted is not None:
        from engines.train import ray_host

        nodes = node_group.planned_nodes().nodes
        _check_node_group(config, nodes, step)
        call = ray_host.HostedStep(checkpoint_dir, list(scored_shards), out_dir, step, config, engine_key(config),
                                   rank_threads(config.num_processes // nodes), nodes=nodes)
        return ray_host.train_step(train_step_in_store, call, hosted, serve=serve_node_part)
    resume = resumes_optimizer_state(checkpoint_dir, resume_optimizer=config.resume_optimizer)
    shards = run_store.fetch_all(list(scored_shards))
    if not run_store.is_remote(out_dir):
        with outputs.output(out_dir, folder=True):  # records the published folder's digests
            return train_step(run_store.local_path(checkpoint_dir), shards, out_dir, step=step, config=config,
                              resume=resume)
    # Uploaded before the task's result was recorded (killed in between): reuse it if it was made
    # from these inputs by this train code, decided on the store's names (the mirror copies have no
    # pruned record) before the parent is fetched: a reuse reads no weights or optimizer state.
    reused = reusable_step(out_dir, parent=checkpoint_dir, step=step, config=config,
                           batch_sha256=batch_sha256_of(shards), code_version=train_code_version())
    if reused is not None:
        return reused
    parent_local = run_store.fetch(checkpoint_dir, skip=parent_fetch_skip(resume=resume))
    # Leading a group on several nodes, whose peers upload their ranks' files before this upload's marker.
    others_fill = node_group.joined() is not None
    with outputs.output(out_dir, folder=True, others_fill=others_fill) as local:
        result = train_step(parent_local, shards, local, step=step, config=config, resume=resume,
                            reuse_decided=True)  # decided above, on the store's names
    return dataclasses.replace(result, checkpoint_dir=out_dir)


def _check_node_group(config: TrainConfig, nodes: int, step: int) -> None:
    """Refuse, before any work, what a train host group on ``nodes`` nodes cannot run."""
    if nodes == 1:
        return
    if config.num_processes % nodes:
        raise TrainInputError(f"step {step}: train.num_processes={config.num_processes} does not split over the "
                              f"plan's {nodes} train nodes")


def serve_node_part(n: int, key: str, engine_spec: dict[str, Any], request: dict[str, Any], *, out_uri: str,
                    continue_in_memory: bool, timeout_s: float) -> None:
    """A peer's part of request ``n`` of a warm group spanning nodes (engines/train/node_group.py), in the
    process that owns this node's agent: read this node's copies of what the request names (its ranks' share
    of the parent's optimizer state, the batch), run it with the lead's ranks, and on a node that does not
    share the lead's folder, upload its ranks' files to ``out_uri`` (no marker: the lead adds it last)."""
    node = node_group.joined()
    if node is None:
        raise TrainStepError("serve_node_part: this process is not a node of a multi-node group")
    local = node_group.renamed(request, lambda name: str(run_store.local_path(name)))
    if request.get("parent_checkpoint"):
        skip = parent_fetch_skip(resume=request.get("resume_ds_state") is not None,
                                 other_ranks_state=node_group.other_ranks_state(node.world, node.ranks))
        local["parent_checkpoint"] = str(run_store.fetch(request["parent_checkpoint"], skip=skip))
    for entry, named in zip(local.get("steps") or [], request.get("steps") or []):
        entry["shards"] = run_store.fetch_all(named["shards"])
    staging = Path(local["out_dir"])
    own = not staging.exists()  # else the lead's own folder: a filesystem it shares with this node
    if own:
        staging.mkdir(parents=True)
    try:
        env = _worker_env(node.world)
        with train_server.lock():
            group, _started = train_server.acquire(key=key, num_processes=node.world,
                                                   engine_spec={**engine_spec, **local}, env=env, node=node)
            if group.next_request != n:
                train_server.discard(group)
                raise train_server.GroupUnavailable(f"node {node.node_rank}: its group is at request "
                                                    f"{group.next_request}, the lead's at {n}")
            try:
                group.submit(local, continue_in_memory=continue_in_memory, timeout_s=timeout_s)
            except BaseException:
                train_server.discard(group)
                raise
        if own:
            run_store.upload_folder(staging, out_uri, clear=False, include_marker=False)
    finally:
        if own:
            shutil.rmtree(staging, ignore_errors=True)


_TEMP_OWNER = re.compile(r"^dapo-train-.*pid(\d+)-")


def clean_stale_temp_dirs(temp_root: str | Path | None = None) -> list[Path]:
    """Delete ``dapo-train-*`` temp folders whose owner process is gone (a kill -9 leaves them).

    Every such folder's name carries its owner's pid (``...-pid<N>-...``, see ``train_steps``
    and engines/train/server.py); folders of live pids and of unknown owner are left alone.
    Returns the folders removed.
    """
    removed = []
    for path in Path(temp_root or tempfile.gettempdir()).glob("dapo-train-*"):
        match = _TEMP_OWNER.match(path.name)
        if not match or not path.is_dir():
            continue
        try:
            os.kill(int(match.group(1)), 0)
            continue  # alive
        except PermissionError:
            continue  # alive, another user's
        except ProcessLookupError:
            pass
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed
