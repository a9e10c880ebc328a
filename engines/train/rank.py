"""A training step run by the ranks themselves: the multi-node path of the Flyte PyTorch plugin.

Locally and on one node the train task launches its own ``torchrun`` (engines/train/launch.py). With the
plugin's ``Elastic(nnodes, nproc_per_node)`` attached to the train environment
(infra/environments.py, cluster target), the elastic agent on every node starts
``nproc_per_node`` copies of the task body instead, one per rank, with RANK / WORLD_SIZE /
MASTER_ADDR set; the body must then *be* the worker. ``train_step_as_rank`` is that body: every
rank validates the batch, builds the same worker spec (engines/train/launch.py: _worker_spec), joins the
process group and runs the step with the code the torchrun launch runs (engines/train/worker.py:
run_request, engines/train/step.py);
rank 0 then publishes the checkpoint (engines/train/publish.py), and its result is the task's output (the plugin returns
rank 0's). The staging and work folders are named from the out folder and the elastic run id,
so every rank on a node agrees on them without talking. On a shared filesystem they sit beside
the out folder, which all nodes mount; on an object store (storage/run_store.py) each node has
them in its own mirror, uploads its ranks' files, and rank 0 uploads the marker last.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engines.train.checkpoint import parent_fetch_skip, resumes_optimizer_state
from engines.train.launch import _check_batches, _worker_spec
from engines.train.node_group import other_ranks_state
from engines.train.publish import (
    TrainInputError,
    TrainStepError,
    TrainStepResult,
    batch_sha256_of,
    publish_step,
    reusable_step,
    train_code_version,
)
from engines.train.spec import WorkerSpec
from settings.train import TrainConfig
from storage import checkpoints, digests, run_store


def running_as_elastic_rank() -> bool:
    """True inside a rank started by a PyTorch elastic agent (torchrun, or the Flyte plugin)."""
    return bool(os.environ.get("TORCHELASTIC_RUN_ID")) and "RANK" in os.environ and "WORLD_SIZE" in os.environ


def _shared_names(out_dir: Path, step: int) -> tuple[Path, Path]:
    """(staging, work) folders every rank derives alike; hidden, so the driver's stale-staging
    cleanup (checkpoints.clean_stale_staging) removes what a killed step leaves."""
    tag = hashlib.sha256(f"{os.environ['TORCHELASTIC_RUN_ID']}|{out_dir.resolve()}|{step}".encode()).hexdigest()[:12]
    return (out_dir.parent / f".{out_dir.name}.staging-rank-{tag}",
            out_dir.parent / f".{out_dir.name}.staging-work-{tag}")


@dataclass(frozen=True)
class _RankStep:
    """One rank's view of the step: which step, where it is staged, and this rank's role."""

    step: int
    config: TrainConfig
    rank: int
    world: int
    remote: bool  # the run store is an object store: every node works in its own mirror
    preparer: bool  # this rank creates and removes the staging and work folders
    out_uri: str  # the out folder as given (a path or a URI)
    out_dir: Path  # its local path (in the mirror on an object store)
    staging: Path
    work_dir: Path
    parent_id: str
    batches_meta: list[dict[str, Any]]
    resume: bool
    t_start: float


def _rank_and_world(config: TrainConfig) -> tuple[int, int]:
    """This process's RANK and WORLD_SIZE; a world size other than ``num_processes`` is trained on, with a warning."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if world != config.num_processes and rank == 0:
        warnings.warn(f"train.num_processes={config.num_processes} but the elastic job has {world} ranks; "
                      f"training on {world}", RuntimeWarning, stacklevel=3)
    return rank, world


def _state_of_other_nodes(rank: int, world: int, local_rank: int) -> tuple[str, ...]:
    """``run_store.fetch`` skip patterns for the parent's optimizer-state files of ranks on other nodes
    (engines/train/node_group.py: other_ranks_state). The node's ranks are torchrun's contiguous block for
    homogeneous nodes (``GROUP_RANK`` x ``LOCAL_WORLD_SIZE``); any other layout, or one node, fetches the
    state whole.
    """
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    first = int(os.environ.get("GROUP_RANK", 0)) * local_world
    if local_world >= world or rank != first + local_rank:
        return ()
    return other_ranks_state(world, range(first, first + local_world))


def _prepare_folders(job: _RankStep) -> None:
    """Empty staging and work folders, and nothing left of a killed attempt's upload."""
    if job.preparer:
        for folder in (job.staging, job.work_dir):
            shutil.rmtree(folder, ignore_errors=True)  # a retried attempt's leftovers
            folder.mkdir(parents=True)
        if job.remote:
            shutil.rmtree(job.out_dir, ignore_errors=True)
    # A step published from other inputs or train code was discarded by rank 0's decision.
    if job.remote and job.rank == 0:
        run_store.remove(job.out_uri)  # what a killed attempt uploaded (it has no marker)


def _train(job: _RankStep, spec: WorkerSpec) -> None:
    """Run the step on this rank (engines/train/worker.py); a failure names the step and rank."""
    from engines.train.step import StepRunner
    from engines.train.worker import run_request

    try:
        runner = StepRunner(spec)
        run_request(runner, spec, time.perf_counter() - job.t_start)
    except Exception as err:
        raise TrainStepError(f"step {job.step}: training failed on rank {job.rank}: {type(err).__name__}: {err} "
                             "(nothing published)") from err


def _upload_node_files(job: _RankStep) -> None:
    """On an object store: each other node's preparer uploads its ranks' files (no marker), then all wait."""
    import torch.distributed as dist

    if job.preparer and job.rank != 0:
        run_store.upload_folder(job.staging, job.out_uri, clear=False, include_marker=False)
    dist.barrier()  # every other node's files are in the store


def _publish(job: _RankStep, t_launch: float) -> TrainStepResult:
    """Rank 0: publish the staged step, upload it with the marker last on an object store, record digests."""
    worker_metrics = json.loads((job.work_dir / "metrics.json").read_text())
    result = publish_step(worker_metrics, {"elastic_ranks": float(job.world)}, time.perf_counter() - t_launch,
                          staging=job.staging, out_dir=job.out_dir, config=job.config, last_step=job.step,
                          parent_id=job.parent_id, batches_meta=job.batches_meta, resume=job.resume,
                          t_start=job.t_start)
    if job.remote:
        run_store.upload_folder(job.out_dir, job.out_uri, clear=False)  # rank 0's node, the marker last
        result = dataclasses.replace(result, checkpoint_dir=job.out_uri)
    # Other nodes' files are recorded by size only (rank 0 holds no copy to hash).
    digests.record(job.out_uri, job.out_dir)
    return result


def _run_and_publish(job: _RankStep, spec: WorkerSpec) -> TrainStepResult | None:
    """Prepare, train on every rank, gather the export; rank 0 publishes and returns the result."""
    import torch.distributed as dist

    _prepare_folders(job)
    dist.barrier()
    t_launch = time.perf_counter()
    _train(job, spec)
    dist.barrier()  # every rank's shard of the export is written
    if job.remote:
        _upload_node_files(job)
    if job.rank != 0:
        return None
    return _publish(job, t_launch)


def _decided_by_rank_0(rank: int, world: int, decide: Callable[[], TrainStepResult | None]) -> TrainStepResult | None:
    """What ``decide()`` returns on rank 0, on every rank: rank 0 alone decides (it reads the store
    and may discard a published folder), and tells the others by a broadcast, so every rank takes
    the same branch. An error rank 0 meets (a pruned parent) is raised on every rank, not left as a
    hang of the others at their next collective. Joins the process group first (one rank: no)."""
    import torch.distributed as dist

    from engines.train.dist import init_process

    if world == 1:
        return decide()
    init_process()
    said: list[Any] = [None]
    if rank == 0:
        try:
            said = [(decide(), None)]
        except Exception as err:  # noqa: BLE001 - every rank raises it below
            said = [(None, err)]
    dist.broadcast_object_list(said, src=0)
    decision, error = said[0]
    if error is not None:
        raise error
    return decision


def train_step_as_rank(
    checkpoint_dir: str | Path,
    scored_shards: Sequence[str | Path],
    out_dir: str | Path,
    *,
    step: int,
    config: TrainConfig,
) -> TrainStepResult | None:
    """This rank's part of one DAPO step; rank 0 publishes and returns the result, others None.

    Same update as ``engines.train.launch.train_step`` with ``num_processes`` = the elastic world size.
    Whether a step published at ``out_dir`` is reused is rank 0's decision
    (engines/train/publish.py: reusable_step, as on the local and object-store paths), made before
    any rank fetches the parent: a reuse reads no weights or optimizer state.
    """
    import torch.distributed as dist

    if config.optimizer_state_every != 1:
        # Fresh pods every step: no warm group holds the state, so every step would replay (engines/train/replay.py).
        raise TrainInputError(f"step {step}: train.optimizer_state_every={config.optimizer_state_every} needs a train "
                              "group that outlives the step (`dapo run` with the train host); the elastic train task "
                              "starts fresh pods each step: set train.optimizer_state_every=1")
    t_start = time.perf_counter()
    rank, world = _rank_and_world(config)
    scored_shards = run_store.fetch_all([str(s) for s in scored_shards])
    try:
        reused = _decided_by_rank_0(rank, world, lambda: reusable_step(
            str(out_dir), parent=checkpoint_dir, step=step, config=config,
            batch_sha256=batch_sha256_of(scored_shards), code_version=train_code_version()))
        if reused is not None:
            return reused if rank == 0 else None
        return _train_as_rank(checkpoint_dir, scored_shards, str(out_dir), step=step, config=config, rank=rank,
                              world=world, t_start=t_start)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _train_as_rank(checkpoint_dir: str | Path, scored_shards: list[str], out_uri: str, *, step: int,
                   config: TrainConfig, rank: int, world: int, t_start: float) -> TrainStepResult | None:
    """Train the step on this rank (nothing published there, or discarded by rank 0's decision)."""
    from engines.train.dist import init_process

    # On an object store every node works in its own mirror (storage/run_store.py): the parent is
    # fetched once per node, and each node uploads its ranks' files before rank 0 adds the marker.
    remote = run_store.is_remote(out_uri)
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    resume = resumes_optimizer_state(checkpoint_dir, resume_optimizer=config.resume_optimizer)
    skip = parent_fetch_skip(resume=resume, other_ranks_state=_state_of_other_nodes(rank, world, local_rank))
    checkpoint_dir, out_dir = run_store.fetch(checkpoint_dir, skip=skip), run_store.local_path(out_uri)
    parent = checkpoints.read_info(checkpoint_dir)
    batches_meta = _check_batches([(step, list(scored_shards))], config, parent.step)
    staging, work_dir = _shared_names(out_dir, step)
    spec = WorkerSpec.from_dict(
        _worker_spec(checkpoint_dir, batches_meta, staging, work_dir, config=config, resume=resume))
    # One rank per folder prepares it: rank 0 on a shared filesystem, each node's first rank in
    # node-local mirrors.
    preparer = local_rank == 0 if remote else rank == 0
    job = _RankStep(step=step, config=config, rank=rank, world=world, remote=remote, preparer=preparer,
                    out_uri=out_uri, out_dir=out_dir, staging=staging, work_dir=work_dir,
                    parent_id=parent.checkpoint_id, batches_meta=batches_meta, resume=resume, t_start=t_start)
    if world == 1:
        init_process()  # a larger world joined it for rank 0's decision
    try:
        return _run_and_publish(job, spec)
    finally:
        if preparer:
            shutil.rmtree(staging, ignore_errors=True)
            shutil.rmtree(work_dir, ignore_errors=True)
