"""A training step's published checkpoint: its StepMetrics row, timings and lineage, the atomic
publish, and the reuse of a step that was already published.

The launch (engines/train/launch.py, or every elastic rank: engines/train/rank.py) leaves the
trained policy in a hidden staging folder; :func:`publish_step` gives it an id, writes the
StepMetrics row (``train_metrics.parquet``) and finer timings (``train_timings.json``) beside the
weights, records what it was made from (config, batch sha256, the train stage's code version,
optimizer resume) and publishes by rename (storage/checkpoints.py). A re-run of a step whose output
is already published reuses it when :func:`made_from` says it came from the same config, batch and
train code: training is not bit-reproducible across launches, so the published checkpoint stays the
step's one result. :func:`reusable_step` is that decision, the one the local launch, the
object-store task and the elastic ranks all make."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from infra import versioning
from settings.train import TrainConfig
from storage import checkpoints, digests, pruning, run_store

METRICS_FILE = "train_metrics.parquet"  # the step's StepMetrics row, beside the weights
TIMINGS_FILE = "train_timings.json"  # finer timings in seconds
STATE_KEPT = "optimizer_state_kept"  # in a record's inputs: whether ds_state/ was written (_state_kept)


class TrainStepError(RuntimeError):
    """A training step failed; nothing was published."""


class NodeGroupLost(TrainStepError):
    """A warm group spanning several nodes lost a node's agent or owner before it ran the step: its train host
    group is replaced and the step runs once more (engines/train/ray_host.py); nothing was published."""


class TrainInputError(TrainStepError):
    """The step's input was refused before any worker started (a bad batch, a sample newer than the
    parent, too few samples for the mini-batches); nothing was published."""


@dataclass(frozen=True)
class TrainedStep:
    """What the train task returns: the published checkpoint of one step.

    Its StepMetrics row is the checkpoint's ``train_metrics.parquet`` (:data:`METRICS_FILE`),
    its timings ``train_timings.json``: open them from the Flyte UI's output or the run folder.
    """

    checkpoint_dir: str  # a path or an object-store URI
    checkpoint_id: str
    step: int


@dataclass(frozen=True)
class TrainStepResult:
    """What a published training step produced."""

    checkpoint_dir: str  # the new, published checkpoint folder
    checkpoint_id: str
    metrics: dict[str, Any]  # the StepMetrics row (NaN for what training does not know)
    timings: dict[str, float]  # finer timings in seconds: load, old log-probs, updates, save/export, ...
    worker_metrics: list[dict[str, Any]]  # everything the workers reported, one dict per step run


def _step_metrics_row(step: int, checkpoint_id: str, parent_id: str, worker: dict[str, Any], time_train_s: float) -> dict[str, Any]:
    """The StepMetrics row of a step: every statistic the workers report (``by="worker"`` in
    schemas/models.py), as its column's type, and the step's training time. Rollout/score metrics
    are NaN and their counts 0: the driver, which knows them, fills them in when it merges the
    stages' metrics."""
    from schemas import STEP_FIELDS, StepStats
    from schemas.models import BY_WORKER

    measured = {f.name: f.python_type(worker[f.name]) for f in STEP_FIELDS if f.by == BY_WORKER}
    return StepStats.blank(step, checkpoint_id, parent_id, **measured, time_train_s=time_train_s).row()


def _write_metrics(row: dict[str, Any], path: Path) -> None:
    """Write the one-row StepMetrics shard at ``path`` (validated, atomic). Built as an Arrow table
    of the columns' types, not a list of dicts: that path would store NaN (a metric training does
    not know) as null, and the file would differ from the ones run folders already hold."""
    import pyarrow as pa

    import schemas

    table = pa.table({f.name: pa.array([row[f.name]], type=f.type) for f in schemas.arrow_schema(schemas.StepMetrics)})
    schemas.write_shard(table, path, schemas.StepMetrics)


def finished_result(out_dir: Path, *, step: int, parent_id: str) -> TrainStepResult:
    """A re-run of a step that was already published (e.g. a retry after the publish): reuse it.

    Training is not bit-reproducible across launches, so publishing again could give another id;
    the published checkpoint stays the one and only result of this step. A different step or
    parent at ``out_dir`` is an error (two runs must never share an output folder).
    """
    import schemas

    info = checkpoints.read_info(out_dir)
    if info.step != step or info.parent_checkpoint_id != parent_id or info.produced_by != "train":
        raise TrainStepError(
            f"step {step}: {out_dir} already holds {info.checkpoint_id} (step {info.step}, parent "
            f"{info.parent_checkpoint_id}), not this step's output"
        )
    row = schemas.read_shard(out_dir / METRICS_FILE, schemas.StepMetrics).to_pylist()[0]
    timings = json.loads((out_dir / TIMINGS_FILE).read_text())
    return TrainStepResult(str(out_dir), info.checkpoint_id, row, timings, worker_metrics=[])


def batch_sha256_of(shards: Sequence[str | Path]) -> str:
    """One sha256 over the batch shards' bytes, in order (what a published step was trained on)."""
    digest = hashlib.sha256()
    for shard in shards:
        digest.update(digests.known_file_sha256(Path(shard)).encode())
    return digest.hexdigest()


@functools.lru_cache(maxsize=1)
def train_code_version() -> str:
    """The train stage's code version: the train task's cache version (tasks/train.py, infra/versioning.py),
    computed as the task computes it, once per process (the code it runs). Recorded in each published
    step's inputs and compared by :func:`made_from`."""
    return versioning.code_version("train", versioning.PROJECT_ROOT, "tasks.train")


def made_from(out_dir: str | Path, *, config: TrainConfig, batch_sha256: str, code_version: str) -> bool:
    """True when the checkpoint published at ``out_dir`` was trained with ``config`` on that batch by
    the train code of version ``code_version`` (:func:`train_code_version`).

    A re-run of a step reuses its published checkpoint only then; another config, other batch
    content (an upstream stage re-made its shards) or other train code (a fixed loss) means the
    folder holds another step's result. A step published before the version was recorded has none:
    its code is unknown and it is reused, so run folders of older code stay resumable.
    """
    inputs = checkpoints.read_info(out_dir).inputs
    recorded_code = inputs.get("train_code_version")
    recorded = {k: v for k, v in (inputs.get("config") or {}).items() if k not in _STORED_ONLY}
    return (recorded == json.loads(json.dumps(recorded_config(config))) and inputs.get("batch_sha256") == batch_sha256
            and recorded_code in (None, code_version))


# Train settings that decide what is stored, never what is computed: not recorded, not compared, so
# records written before they existed still match and a resume may change them.
_STORED_ONLY = ("optimizer_state_every",)


def recorded_config(config: TrainConfig) -> dict[str, Any]:
    """The train config a checkpoint records and a re-run compares (:func:`made_from`): all but :data:`_STORED_ONLY`."""
    return {k: v for k, v in asdict(config).items() if k not in _STORED_ONLY}


def _state_kept(config: TrainConfig, staging: Path) -> dict[str, bool]:
    """The record's word on whether this checkpoint holds ds_state/ (:data:`STATE_KEPT`), said only when
    not every step writes it (train.optimizer_state_every > 1): a cold start from one without it
    rebuilds the state by replay (engines/train/replay.py); records of runs without it stay as they were."""
    if config.optimizer_state_every == 1:
        return {}
    return {STATE_KEPT: (staging / checkpoints.OPTIMIZER_STATE_DIR).is_dir()}


def discard_published(out_dir: str | Path, why: str) -> None:
    """Say why the checkpoint at ``out_dir`` is not reused, and forget its recorded digests."""
    print(f"[train] {out_dir}: {why}; training the step again", file=sys.stderr, flush=True)
    digests.forget(str(out_dir))


# What a reused step's result is read from: besides the marker (read by made_from), never its
# weights or optimizer state (at paper scale 65.5 GB and 393 GB a step).
RESULT_FILES = (METRICS_FILE, TIMINGS_FILE)


def published_result(out_dir: str, *, step: int, parent_id: str) -> TrainStepResult:
    """``finished_result`` of the checkpoint published at ``out_dir`` (a path, or a URI of which
    only :data:`RESULT_FILES` and the marker are fetched into the mirror), named as given."""
    done = finished_result(run_store.fetch(out_dir, only=RESULT_FILES), step=step, parent_id=parent_id)
    return dataclasses.replace(done, checkpoint_dir=str(out_dir))


def reusable_step(out_dir: str | Path, *, parent: str | Path, step: int, config: TrainConfig, batch_sha256: str,
                  code_version: str) -> TrainStepResult | None:
    """The one decision whether the step published at ``out_dir`` (a path or a URI) is this step's
    result: the local launch, the object-store task and rank 0 of an elastic job all call it.

    Reused (its result returned) when it is complete and :func:`made_from` says it came from this
    config, batch and train code; only its marker and :data:`RESULT_FILES` are read. Otherwise the
    step must train, so the parent (``parent``, a path or a URI: the store holds its pruned record)
    must still have its weights (``pruning.PrunedWeightsError`` otherwise, raised before anything is
    discarded, so the published step stays for the code that made it); then a published folder is
    discarded and None returned. A published step is reused even when its parent was pruned since.
    """
    published = checkpoints.is_complete(out_dir)
    if published and made_from(out_dir, config=config, batch_sha256=batch_sha256, code_version=code_version):
        return published_result(str(out_dir), step=step, parent_id=checkpoints.read_info(parent).checkpoint_id)
    pruning.require_weights(parent)
    if published:
        discard_published(out_dir, "published from another config, batch or train code")
    return None


def publish_step(worker_metrics: list[dict[str, Any]], extra: dict[str, float], launch_s: float, *, staging: Path,
                 out_dir: Path, config: TrainConfig, last_step: int, parent_id: str,
                 batches_meta: list[dict[str, Any]], resume: bool, t_start: float) -> TrainStepResult:
    """Id, StepMetrics row, timings and lineage of the staged step, then the atomic publish."""
    t_publish = time.perf_counter()
    checkpoint_id = checkpoints.make_checkpoint_id("train", last_step, staging)
    timings = {k: float(v) for m in worker_metrics for k, v in m["timings"].items()}
    timings.update(extra)
    timings["launch_s"] = launch_s
    timings["launch_overhead_s"] = launch_s - sum(
        timings.get(k, 0.0) for k in ("load_s", "batch_s", "old_log_probs_s", "updates_s", "save_export_s")
    )
    row = _step_metrics_row(last_step, checkpoint_id, parent_id, worker_metrics[-1],
                            time_train_s=time.perf_counter() - t_start)
    _write_metrics(row, staging / METRICS_FILE)
    info = checkpoints.CheckpointInfo(
        checkpoint_id=checkpoint_id,
        step=last_step,
        parent_checkpoint_id=parent_id,
        produced_by="train",
        inputs={
            # As named in the run store (a URI when the shard was fetched into the mirror).
            "scored_shards": [run_store.source_name(s) for b in batches_meta for s in b["shards"]],
            "steps": [b["step"] for b in batches_meta],
            "config": recorded_config(config),
            "batch_sha256": batch_sha256_of([s for b in batches_meta for s in b["shards"]]),
            "train_code_version": train_code_version(),  # compared by made_from on a re-run
            "resumed_optimizer_state": resume,
            **_state_kept(config, staging),
        },
        # Where the LR schedule stands (the parent's count plus this launch's updates): the next step
        # starts its schedule there even with a fresh optimizer (engines/train/launch.py: schedule_start).
        optimizer_updates=int(worker_metrics[-1]["updates_done"]),
    )
    timings["publish_s"] = time.perf_counter() - t_publish
    timings["time_train_s"] = time.perf_counter() - t_start
    (staging / TIMINGS_FILE).write_text(json.dumps(timings, indent=2, sort_keys=True) + "\n")
    published = checkpoints.publish(staging, out_dir, info)
    return TrainStepResult(str(published), checkpoint_id, row, timings, worker_metrics)
