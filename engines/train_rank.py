"""A training step run by the ranks themselves: the multi-node path of the Flyte PyTorch plugin.

Locally and on one node the train task launches its own ``torchrun`` (engines/train_launch.py). With the
plugin's ``Elastic(nnodes, nproc_per_node)`` attached to the train environment
(infra/environments.py, cluster target), the elastic agent on every node starts
``nproc_per_node`` copies of the task body instead, one per rank, with RANK / WORLD_SIZE /
MASTER_ADDR set; the body must then *be* the worker. ``train_step_as_rank`` is that body: every
rank validates the batch, builds the same worker spec (engines/train_launch.py: _worker_spec), joins the
process group and runs the step with the code the torchrun launch runs (engines/train_worker.py:
run_request, engines/train_step.py); rank 0 then publishes the checkpoint, and its result is the task's output (the plugin returns
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
from collections.abc import Sequence
from pathlib import Path

from engines.train_launch import (
    TrainStepError,
    TrainStepResult,
    _check_batches,
    _publish_step,
    _worker_spec,
    published_result,
)
from engines.train_spec import DS_META_FILE, DS_STATE_DIR, WorkerSpec
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


def train_step_as_rank(
    checkpoint_dir: str | Path,
    scored_shards: Sequence[str | Path],
    out_dir: str | Path,
    *,
    step: int,
    config: TrainConfig,
) -> TrainStepResult | None:
    """This rank's part of one DAPO step; rank 0 publishes and returns the result, others None.

    Same update as ``engines.train_launch.train_step`` with ``num_processes`` = the elastic world size.
    """
    import torch.distributed as dist

    from engines.train_dist import init_process
    from engines.train_step import StepRunner
    from engines.train_worker import run_request

    t_start = time.perf_counter()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if world != config.num_processes and rank == 0:
        warnings.warn(f"train.num_processes={config.num_processes} but the elastic job has {world} ranks; "
                      f"training on {world}", RuntimeWarning, stacklevel=2)
    # On an object store every node works in its own mirror (storage/run_store.py): the parent is
    # fetched once per node, and each node uploads its ranks' files before rank 0 adds the marker.
    out_uri, remote = str(out_dir), run_store.is_remote(out_dir)
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    checkpoint_dir, out_dir = run_store.fetch(checkpoint_dir), run_store.local_path(out_uri)
    scored_shards = run_store.fetch_all([str(s) for s in scored_shards])
    parent = checkpoints.read_info(checkpoint_dir)
    if checkpoints.is_complete(out_uri):
        return published_result(out_uri, step=step, parent_id=parent.checkpoint_id) if rank == 0 else None
    batches_meta = _check_batches([(step, list(scored_shards))], config, parent.step)
    resume = config.resume_optimizer and (checkpoint_dir / DS_STATE_DIR / DS_META_FILE).is_file()
    staging, work_dir = _shared_names(out_dir, step)
    spec = WorkerSpec.from_dict(
        _worker_spec(checkpoint_dir, batches_meta, staging, work_dir, config=config, resume=resume))

    # One rank per folder prepares it: rank 0 on a shared filesystem, each node's first rank in
    # node-local mirrors.
    preparer = local_rank == 0 if remote else rank == 0
    init_process()
    try:
        if preparer:
            for folder in (staging, work_dir):
                shutil.rmtree(folder, ignore_errors=True)  # a retried attempt's leftovers
                folder.mkdir(parents=True)
            if remote:
                shutil.rmtree(out_dir, ignore_errors=True)
        if remote and rank == 0:
            run_store.remove(out_uri)  # what a killed attempt uploaded (it has no marker)
        dist.barrier()
        t_launch = time.perf_counter()
        try:
            runner = StepRunner(spec)
            run_request(runner, spec, time.perf_counter() - t_start)
        except Exception as err:
            raise TrainStepError(f"step {step}: training failed on rank {rank}: {type(err).__name__}: {err} "
                                 "(nothing published)") from err
        dist.barrier()  # every rank's shard of the export is written
        if remote:
            if preparer and rank != 0:
                run_store.upload_folder(staging, out_uri, clear=False, include_marker=False)
            dist.barrier()  # every other node's files are in the store
        if rank != 0:
            return None
        worker_metrics = json.loads((work_dir / "metrics.json").read_text())
        result = _publish_step(worker_metrics, {"elastic_ranks": float(world)}, time.perf_counter() - t_launch,
                               staging=staging, out_dir=out_dir, config=config, last_step=step,
                               parent_id=parent.checkpoint_id, batches_meta=batches_meta, resume=resume,
                               t_start=t_start)
        if remote:
            run_store.upload_folder(out_dir, out_uri, clear=False)  # rank 0's node, the marker last
            result = dataclasses.replace(result, checkpoint_dir=out_uri)
        # Other nodes' files are recorded by size only (rank 0 holds no copy to hash).
        digests.record(out_uri, out_dir)
        return result
    finally:
        if preparer:
            shutil.rmtree(staging, ignore_errors=True)
            shutil.rmtree(work_dir, ignore_errors=True)
        if dist.is_initialized():
            dist.destroy_process_group()
