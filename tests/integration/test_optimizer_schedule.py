"""The optimizer across steps, with real DeepSpeed launches (issue 45).

- The LR warm-up continues across steps whether the parent's optimizer state is resumed or a
  fresh optimizer starts (``train.resume_optimizer: false``): step 2's updates run at the same
  learning rates both ways, and each checkpoint records the updates done so far.
- A step>0 parent without the optimizer state asked for is refused before any worker starts.
- A crafted folder's ``ds_state/`` never runs its pickles: imported as ``bootstrap.source`` its
  state is left out and step 1 trains; vouched for by a forged digest record, it is refused by the
  weights-only unpickler. The pickles create a marker file when run; it must never appear.

Each launch takes ~15-25 s on 2 cores: the module fixture runs the three steps the schedule tests
compare once.
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from train_fixtures import random_batch, write_scored  # noqa: E402

from engines.bootstrap import stage as bs  # noqa: E402
from engines.bootstrap.tiny_policy import build_random_checkpoint  # noqa: E402
from engines.train.engine import warmup_lr_factor  # noqa: E402
from engines.train.launch import train_step, train_step_in_store  # noqa: E402
from engines.train.publish import TrainInputError, TrainStepError, TrainStepResult  # noqa: E402
from settings.train import TrainConfig  # noqa: E402
from storage import checkpoints, digests, outputs  # noqa: E402
from tests.crafted_checkpoints import add_malicious_state  # noqa: E402

# A warm-up of 6 updates (3 steps x 2): step 2's updates (2 and 3) are still inside it.
CONFIG = TrainConfig(num_processes=1, micro_batch_samples=4, updates_per_step=2, lr=3e-3, warmup_steps=3,
                     seed=7, keep_workers_warm=False)


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Step 1 from a random step-0 policy, then step 2 from it twice: resuming its optimizer state,
    and with a fresh optimizer."""
    root = tmp_path_factory.mktemp("schedule")
    ck0 = build_random_checkpoint(root / "ck0", seed=0, num_layers=2, hidden_size=32, num_heads=2)
    vocab = json.loads((ck0 / "config.json").read_text())["vocab_size"]
    shard1 = write_scored(root / "batch1.parquet", random_batch(1, 8, vocab=vocab))
    shard2 = write_scored(root / "batch2.parquet", random_batch(2, 8, vocab=vocab))
    s1 = train_step(ck0, [shard1], root / "s1", step=1, config=CONFIG)
    resumed = train_step(s1.checkpoint_dir, [shard2], root / "s2-resumed", step=2, config=CONFIG)
    fresh = train_step(s1.checkpoint_dir, [shard2], root / "s2-fresh", step=2,
                       config=replace(CONFIG, resume_optimizer=False))
    return {"root": root, "ck0": ck0, "shard1": shard1, "shard2": shard2, "s1": s1, "resumed": resumed, "fresh": fresh}


def test_the_warm_up_continues_whether_or_not_the_optimizer_state_is_resumed(chain: dict) -> None:
    resumed, fresh = chain["resumed"].worker_metrics[0], chain["fresh"].worker_metrics[0]
    assert checkpoints.read_info(chain["resumed"].checkpoint_dir).inputs["resumed_optimizer_state"] is True
    assert checkpoints.read_info(chain["fresh"].checkpoint_dir).inputs["resumed_optimizer_state"] is False
    # Update 3 (0-based) of a 6-update warm-up: lr x 4/6, both ways (a restarted warm-up: lr x 2/6).
    assert fresh["lr"] == resumed["lr"] == pytest.approx(CONFIG.lr * 4 / 6, rel=1e-6)
    expected = [CONFIG.lr * warmup_lr_factor(u, 6) for u in (2, 3)]
    assert fresh["lrs"] == pytest.approx(expected, rel=1e-6) and resumed["lrs"] == pytest.approx(expected, rel=1e-6)
    assert fresh["updates_done"] == resumed["updates_done"] == 4
    # The count travels with each checkpoint: where the next step's schedule starts.
    assert checkpoints.read_info(chain["s1"].checkpoint_dir).optimizer_updates == 2
    assert checkpoints.read_info(chain["resumed"].checkpoint_dir).optimizer_updates == 4
    assert checkpoints.read_info(chain["fresh"].checkpoint_dir).optimizer_updates == 4


def test_a_parent_whose_optimizer_state_is_gone_is_refused_before_any_worker(chain: dict, tmp_path: Path) -> None:
    pruned = tmp_path / "step-0001"
    shutil.copytree(chain["s1"].checkpoint_dir, pruned, ignore=shutil.ignore_patterns(checkpoints.OPTIMIZER_STATE_DIR))
    with pytest.raises(TrainInputError) as refused:
        train_step(pruned, [chain["shard2"]], tmp_path / "step-0002", step=2, config=CONFIG)
    line = str(refused.value)
    assert "\n" not in line and f"{pruned} (step 1) has no optimizer state" in line
    assert "train.resume_optimizer=true" in line and "set train.resume_optimizer=false" in line
    assert not (tmp_path / "step-0002").exists() and not list(tmp_path.glob(".step-0002.staging-*"))


def test_an_imported_folders_optimizer_state_is_never_loaded(chain: dict, tmp_path: Path) -> None:
    # bootstrap.source=<a crafted folder>: the step-0 policy is imported (its digest record written
    # after the import, as the bootstrap task does), then step 1 trains from it.
    marker = tmp_path / "pwned"
    source = tmp_path / "crafted"
    shutil.copytree(chain["ck0"], source)
    (source / checkpoints.METADATA_FILE).unlink()
    add_malicious_state(source, marker)
    step0 = tmp_path / "checkpoints" / "step-0000"
    with outputs.output(str(step0), folder=True):
        bs.bootstrap_policy(step0, bs.BootstrapConfig(source=str(source)))
    try:
        result: TrainStepResult | TrainStepError = train_step_in_store(
            str(step0), [str(chain["shard1"])], str(tmp_path / "checkpoints" / "step-0001"), step=1, config=CONFIG)
    except TrainStepError as err:  # what became of the step once the pickle ran (before the fix)
        result = err
    assert not marker.exists(), "the crafted folder's pickle ran"
    assert not (step0 / checkpoints.OPTIMIZER_STATE_DIR).exists()
    assert isinstance(result, TrainStepResult), result
    assert checkpoints.read_info(result.checkpoint_dir).inputs["resumed_optimizer_state"] is False


def test_a_forged_record_does_not_make_a_pickle_run(chain: dict, tmp_path: Path) -> None:
    # A crafted train checkpoint whose digest record vouches for its crafted ds_state (a run folder
    # someone else wrote): the state is resumed, and the weights-only unpickler refuses it.
    marker = tmp_path / "pwned"
    forged = tmp_path / "step-0001"
    shutil.copytree(chain["s1"].checkpoint_dir, forged, ignore=shutil.ignore_patterns(checkpoints.OPTIMIZER_STATE_DIR))
    add_malicious_state(forged, marker)
    digests.record(forged)
    with pytest.raises(TrainStepError) as failed:
        train_step_in_store(str(forged), [str(chain["shard2"])], str(tmp_path / "step-0002"), step=2, config=CONFIG)
    assert not marker.exists(), "the crafted pickle ran"
    assert f"{forged / checkpoints.OPTIMIZER_STATE_DIR}: refused to load the optimizer state" in str(failed.value)
    assert "(it asks for io.open)" in str(failed.value)  # what it would have called, named
    assert not (tmp_path / "step-0002").exists()
