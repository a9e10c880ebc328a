"""``train.optimizer_state_every``: only every K-th step writes its optimizer state, and nothing changes.

A run folder's steps 1-4 trained three ways on the tiny Qwen2 (engines/train/replay.py):
- every step writes its state (K = 1): the reference ids;
- K = 2 on the warm group: steps 1 and 3 publish no ds_state/, the group continues from memory;
- then the group is lost (stopped, as a kill or a fresh process would leave it) and step 4 starts cold
  from step 3, which has no state: step 3 is replayed from step 2's state, its id checked, and step 4
  gives the reference id.
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from train_fixtures import optimizer_state, random_batch, same_state, write_scored  # noqa: E402

from engines.bootstrap.tiny_policy import build_random_checkpoint
from engines.train import replay
from engines.train import server as train_server
from engines.train.launch import train_step_in_store
from engines.train.publish import STATE_KEPT, TrainInputError, TrainStepError, TrainStepResult
from engines.train.rank import train_step_as_rank
from engines.train.spec import DS_STATE_DIR
from settings.train import TrainConfig
from storage import checkpoints
from storage.run_layout import RunLayout

CONFIG = TrainConfig(num_processes=1, micro_batch_samples=4, updates_per_step=2, lr=3e-3, warmup_steps=2, seed=7)
EVERY_2 = replace(CONFIG, optimizer_state_every=2)
STEPS = (1, 2, 3, 4)


def _chain(run: RunLayout, shards: dict[int, str], config: TrainConfig, steps: tuple[int, ...]) -> dict[int, TrainStepResult]:
    """Train ``steps`` in order, each from the previous step's checkpoint in ``run``, as the pipeline does."""
    out = {}
    for step in steps:
        out[step] = train_step_in_store(run.checkpoint(step - 1), [shards[step]], run.checkpoint(step), step=step,
                                        config=config)
    return out


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("state-every")
    ck0 = build_random_checkpoint(root / "ck0", seed=0, num_layers=2, hidden_size=32, num_heads=2)
    vocab = json.loads((ck0 / "config.json").read_text())["vocab_size"]
    shards = {s: str(write_scored(root / f"batch{s}.parquet", random_batch(s, 8, vocab=vocab))) for s in STEPS}
    runs = {name: RunLayout(str(root / name)) for name in ("every", "k2")}
    for run in runs.values():
        Path(run.checkpoints_dir).mkdir(parents=True)
        shutil.copytree(ck0, run.checkpoint(0))
    train_server.stop_active()
    out: dict = {"runs": runs, "shards": shards}
    out["every"] = _chain(runs["every"], shards, CONFIG, STEPS)
    out["k2"] = _chain(runs["k2"], shards, EVERY_2, (1, 2, 3))
    out["k2_history"] = list(train_server.active_group().history)
    train_server.stop_active()  # the group that held step 3's state is gone
    out["k2"] |= _chain(runs["k2"], shards, EVERY_2, (4,))
    out["k2_history_after"] = list(train_server.active_group().history)
    return out


def test_only_every_kth_step_writes_its_state_and_the_warm_group_continues_from_memory(trained: dict) -> None:
    k2 = trained["runs"]["k2"]
    has_state = {s: (Path(k2.checkpoint(s)) / DS_STATE_DIR).is_dir() for s in STEPS}
    assert has_state == {1: False, 2: True, 3: False, 4: True}
    recorded = {s: checkpoints.read_info(k2.checkpoint(s)).inputs[STATE_KEPT] for s in STEPS}
    assert recorded == has_state
    assert STATE_KEPT not in checkpoints.read_info(trained["runs"]["every"].checkpoint(1)).inputs  # K = 1: as before
    assert trained["k2_history"][-3:] == ["reloaded", "continued", "continued"]  # one group: K shapes no engine
    for step in (1, 2, 3):
        assert trained["k2"][step].checkpoint_id == trained["every"][step].checkpoint_id, step


def test_a_cold_start_replays_from_the_last_written_state_and_gives_the_same_ids(trained: dict) -> None:
    # Step 4 after the group was lost: a new group loads step 2's state, replays step 3 (continuing in
    # memory), checks its id, then trains step 4 in memory.
    assert trained["k2_history_after"] == ["reloaded", "continued"]
    assert trained["k2"][4].checkpoint_id == trained["every"][4].checkpoint_id
    assert trained["k2"][4].timings["replayed_steps"] == 1.0  # recorded, for a train host's caller to say
    assert "replayed_steps" not in trained["k2"][3].timings  # continued in memory: nothing replayed
    every, k2 = trained["runs"]["every"], trained["runs"]["k2"]
    assert same_state(optimizer_state(every.checkpoint(4)), optimizer_state(k2.checkpoint(4))) == []
    assert checkpoints.read_info(k2.checkpoint(4)).parent_checkpoint_id == trained["every"][3].checkpoint_id


def test_the_replay_plan_walks_back_to_the_nearest_written_state(trained: dict) -> None:
    k2 = trained["runs"]["k2"]
    plan = replay.plan_replay(k2.checkpoint(3))
    assert (plan.origin, plan.resumes, plan.steps) == (k2.checkpoint(2), True, [k2.checkpoint(3)])
    plan = replay.plan_replay(k2.checkpoint(1))  # no state before: from the step-0 policy, a fresh optimizer
    assert (plan.origin, plan.resumes, plan.steps) == (k2.checkpoint(0), False, [k2.checkpoint(1)])


def test_a_checkpoint_without_state_outside_a_run_folder_is_refused_by_name(trained: dict, tmp_path: Path) -> None:
    loose = shutil.copytree(trained["runs"]["k2"].checkpoint(3), tmp_path / "loose")
    with pytest.raises(TrainInputError, match=r"loose: not a checkpoint in a run folder .* cannot be found"):
        replay.plan_replay(str(loose))


def test_a_replay_that_does_not_reproduce_the_published_id_is_refused(trained: dict, tmp_path: Path) -> None:
    k2 = trained["runs"]["k2"]

    def other_weights(parent, steps, out, **_kwargs) -> TrainStepResult:
        return TrainStepResult(str(out), "train-0003-0000000000000000", {}, {}, [])

    with pytest.raises(TrainStepError, match=r"step 3: the replay .* gave train-0003-0000000000000000, not the "
                                             r"published train-0003-"):
        replay.rebuild(k2.checkpoint(3), config=EVERY_2, into=tmp_path / "replay", train=other_weights)


def test_a_replay_of_a_step_made_by_another_config_is_refused(trained: dict, tmp_path: Path) -> None:
    k2 = trained["runs"]["k2"]

    def never(*_args, **_kwargs) -> TrainStepResult:
        raise AssertionError("nothing may train")

    with pytest.raises(TrainInputError, match=r"step-0003: its optimizer state was not written .* not trained as one "
                                              r"step by this config"):
        replay.rebuild(k2.checkpoint(3), config=replace(EVERY_2, lr=1e-3), into=tmp_path / "replay", train=never)


def test_the_elastic_train_task_refuses_a_state_written_every_k_steps(trained: dict) -> None:
    k2 = trained["runs"]["k2"]
    with pytest.raises(TrainInputError, match=r"train.optimizer_state_every=2 needs a train group that outlives"):
        train_step_as_rank(k2.checkpoint(4), [trained["shards"][1]], k2.checkpoint(5), step=5, config=EVERY_2)
