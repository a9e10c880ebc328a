"""A parent checkpoint written without its optimizer state, rebuilt by training its steps again.

With ``train.optimizer_state_every`` = K > 1 only steps divisible by K write ds_state/
(engines/train/checkpoint.py: writes_optimizer_state). The warm group that trained the parent holds
its state in memory and continues from it (engines/train/launch.py). A cold start (the group was
lost: a kill, a fresh process, another node) instead replays: from the nearest ancestor that has the
state (or the run's step-0 policy, which starts a fresh optimizer as step 1 did), each step since is
trained again on its recorded batch, and its checkpoint id must equal the published one. Equal ids are
equal weights, so the rebuilt state is the one the run had; a different id is refused, since the next
step would then train on another optimizer state than the run's.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engines.train.checkpoint import parent_fetch_skip, resumes_optimizer_state
from engines.train.publish import (
    STATE_KEPT,
    TrainInputError,
    TrainStepError,
    TrainStepResult,
    batch_sha256_of,
    made_from,
    train_code_version,
)
from settings.train import TrainConfig
from storage import checkpoints, run_store
from storage.checkpoints import CheckpointInfo
from storage.run_layout import checkpoint_beside


def needs_replay(parent: CheckpointInfo, config: TrainConfig) -> bool:
    """True when a step from ``parent`` resumes its optimizer state and ``parent`` was published without
    it by design (its record says so: engines/train/publish.py, :data:`STATE_KEPT`)."""
    return config.resume_optimizer and parent.produced_by == "train" and parent.inputs.get(STATE_KEPT) is False


@dataclass(frozen=True)
class ReplayPlan:
    """Where a replay starts and what it trains again."""

    origin: str  # a checkpoint with vouched optimizer state, or the run's step-0 policy (a path or a URI)
    resumes: bool  # whether the origin's state is loaded (False: a step-0 policy, a fresh optimizer)
    steps: list[str]  # the checkpoints to train again, oldest first, ending with the parent


def plan_replay(parent: str) -> ReplayPlan:
    """Walk back from ``parent`` (a path or a URI in a run folder) to the nearest ancestor with state.

    Each ancestor is the checkpoint of its child's parent step in the same run folder, and must carry
    the id the child records as its parent (a folder re-made since is refused, not replayed from)."""
    chain: list[str] = []
    node = parent
    while True:
        info = checkpoints.read_info(node)
        if info.produced_by != "train" or resumes_optimizer_state(node, resume_optimizer=True):
            return ReplayPlan(origin=node, resumes=info.produced_by == "train", steps=chain[::-1])
        chain.append(node)
        assert info.parent_checkpoint_id is not None  # a train step's record names its parent
        try:
            ancestor = checkpoint_beside(node, checkpoints.step_of_id(info.parent_checkpoint_id))
        except ValueError as err:
            raise TrainInputError(f"{err}: its optimizer state was not written (train.optimizer_state_every) and its "
                                  "ancestors cannot be found to rebuild it; set train.resume_optimizer=false to train "
                                  "from its weights with a fresh optimizer") from err
        found = checkpoints.read_info(ancestor).checkpoint_id if checkpoints.is_complete(ancestor) else None
        if found != info.parent_checkpoint_id:
            raise TrainInputError(
                f"{node}: its optimizer state was not written (train.optimizer_state_every) and cannot be rebuilt: "
                f"its parent {info.parent_checkpoint_id} is not at {ancestor} (found {found}); set "
                "train.resume_optimizer=false to train from its weights with a fresh optimizer")
        node = ancestor


def rebuild(parent: str, *, config: TrainConfig, into: Path, train: Callable[..., TrainStepResult]) -> tuple[Path, int]:
    """A local checkpoint equal to ``parent`` (a path or a URI) with its optimizer state, under ``into``, and
    how many steps were replayed to make it.

    ``train`` is engines/train/launch.py: train_steps (passed in: the launch imports this module).
    Every replayed step must have been made by this config and train code from the batch it records
    (engines/train/publish.py: made_from, the reuse rule) and give the published id."""
    plan = plan_replay(parent)
    local = run_store.fetch(plan.origin, skip=parent_fetch_skip(resume=plan.resumes))
    resume = plan.resumes
    into.mkdir(parents=True, exist_ok=True)
    for node in plan.steps:
        info = checkpoints.read_info(node)
        shards = run_store.fetch_all(list(info.inputs["scored_shards"]))
        if info.inputs.get("steps") != [info.step] or not made_from(
                node, config=config, batch_sha256=batch_sha256_of(shards), code_version=train_code_version()):
            raise TrainInputError(
                f"{node}: its optimizer state was not written (train.optimizer_state_every) and cannot be rebuilt "
                "by replay: it was not trained as one step by this config and train code from the batch it records; "
                "set train.resume_optimizer=false to train from its weights with a fresh optimizer")
        print(f"[train] step {info.step}: replaying it from {checkpoints.read_info(local).checkpoint_id} to rebuild "
              "its optimizer state (not written: train.optimizer_state_every)", file=sys.stderr, flush=True)
        out = into / f"step-{info.step:04d}"
        result = train(local, [(info.step, shards)], out, config=config, resume=resume, reuse_decided=True,
                       write_state=True)
        if result.checkpoint_id != info.checkpoint_id:
            raise TrainStepError(
                f"step {info.step}: the replay that rebuilds its optimizer state gave {result.checkpoint_id}, not the "
                f"published {info.checkpoint_id}: training did not reproduce here, so the state would not be the "
                "run's; set train.resume_optimizer=false to train from the weights with a fresh optimizer")
        if local.is_relative_to(into):
            shutil.rmtree(local)  # the previous replayed step: its state is loaded into the next one's
        local, resume = out, True
    return local, len(plan.steps)
