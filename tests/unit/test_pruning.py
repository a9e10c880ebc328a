"""storage/pruning.py on a fake run folder: pruned checkpoints stay verified, cached and traceable.

Checkpoints 0..5 are published through ``outputs.output`` as the train task does (weights,
``ds_state/`` shards, lineage records), on a local folder and on fsspec's in-memory object store;
then the retention policy K=1, M=2 prunes them as the driver does after step 5.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import asdict
from pathlib import Path

import pytest

from storage import checkpoints, digests, outputs, pruning, run_store
from storage.run_layout import RunLayout
from cli.lineage import checkpoint_lineage
from cli.verify import pruned_outputs, verify_run

from .test_digests import _FakeCachedTask

STEPS = range(0, 6)
WEIGHTS = "model.safetensors"
OPTIMIZER = ("ds_state/global_step1/zero_pp_rank_0_mp_rank_00_optim_states.pt", "ds_state/latest")
RECORDS = (checkpoints.METADATA_FILE, "config.json", "train_metrics.parquet")


@pytest.fixture(params=["local", "memory"])
def root(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "local":
        return str(tmp_path / "run")
    monkeypatch.setenv(run_store.MIRROR_ENV, str(tmp_path / "mirror"))
    return f"memory://dapo-test/run-{uuid.uuid4().hex[:8]}"


def _publish(layout: RunLayout, step: int) -> str:
    out = layout.checkpoint(step)
    with outputs.output(out, folder=True) as local:
        local.mkdir(parents=True, exist_ok=True)
        (local / WEIGHTS).write_bytes(f"weights {step}".encode() * 10)
        (local / "config.json").write_text("{}")
        if step:
            (local / "train_metrics.parquet").write_bytes(b"metrics")
            for name in OPTIMIZER:
                (local / name).parent.mkdir(parents=True, exist_ok=True)
                (local / name).write_bytes(f"adam {step}".encode() * 60)
        info = checkpoints.CheckpointInfo(
            checkpoint_id=f"train-{step:04d}-abc", step=step, parent_checkpoint_id=f"train-{step - 1:04d}-abc" if step else None,
            produced_by="train" if step else "bootstrap")
        (local / checkpoints.METADATA_FILE).write_text(json.dumps(asdict(info)))
    return out


def _run(root: str) -> RunLayout:
    layout = RunLayout(root)
    run_store.write_text(layout.run_record, "{}")
    for step in STEPS:
        _publish(layout, step)
    run_store.write_text(layout.summary, json.dumps({"final_checkpoint": layout.checkpoint(5)}))
    return layout


def _exists(layout: RunLayout, step: int, name: str) -> bool:
    return run_store.exists(run_store.join(layout.checkpoint(step), name))


def test_retention_prunes_what_the_policy_drops_and_nothing_else(root: str) -> None:
    layout = _run(root)
    pruned = pruning.apply_retention({s: layout.checkpoint(s) for s in STEPS}, latest=5,
                                     keep_optimizer_last=1, keep_weights_every=2)
    # K=1, M=2: whole = 0, 5; weights only = 2, 4; nothing of 1, 3
    assert [_exists(layout, s, WEIGHTS) for s in STEPS] == [True, False, True, False, True, True]
    assert [_exists(layout, s, OPTIMIZER[0]) for s in STEPS] == [False, False, False, False, False, True]
    assert all(_exists(layout, s, name) for s in STEPS for name in RECORDS if s or name != "train_metrics.parquet")
    assert sorted(pruned) == sorted([run_store.join(layout.checkpoint(s), n) for s in (1, 2, 3, 4) for n in OPTIMIZER]
                                    + [run_store.join(layout.checkpoint(s), WEIGHTS) for s in (1, 3)])
    # each pruned checkpoint records what went, by the digest record's names, with sizes
    record = json.loads(run_store.read_text(pruning.pruned_record_path(layout.checkpoint(3))))
    assert sorted(record["files"]) == sorted(f"step-0003/{n}" for n in (WEIGHTS, *OPTIMIZER))
    assert record["files"]["step-0003/model.safetensors"]["bytes"] == len(b"weights 3") * 10
    # applying it again (a re-run replays every step) prunes nothing more
    assert pruning.apply_retention({s: layout.checkpoint(s) for s in STEPS}, latest=5,
                                   keep_optimizer_last=1, keep_weights_every=2) == []


def test_generating_from_a_checkpoint_whose_weights_were_pruned_fails_naming_it_and_what_to_do(root: str) -> None:
    from engines.rollout.stage import generate_rollouts
    from settings.rollout import RolloutConfig

    layout = _run(root)
    pruning.apply_retention({s: layout.checkpoint(s) for s in STEPS}, latest=5, keep_optimizer_last=1, keep_weights_every=2)
    # K=1, M=2: step 2 kept its weights (optimizer state pruned), step 3 lost both.
    pruning.require_weights(layout.checkpoint(2))
    pruning.require_weights(layout.checkpoint(5))
    with pytest.raises(pruning.PrunedWeightsError, match=r"step-0003: pruned by the retention policy: weights, optimizer "
                                                         r"state .*step-0003\.pruned\.json.*another --run-root"):
        pruning.require_weights(layout.checkpoint(3))
    # What `dapo serve` and `dapo ask` meet, before a server or an engine starts.
    from workflows.policy_source import resolve_policy

    with pytest.raises(pruning.PrunedWeightsError, match=r"step-0003"):
        resolve_policy(layout.checkpoint(3))
    # What a rollout or evaluation that must run again meets, before any engine is built.
    with pytest.raises(pruning.PrunedWeightsError, match=r"step-0003"):
        generate_rollouts(layout.checkpoint(3), [{"problem_id": "p", "prompt": "1+1="}], RolloutConfig(), seed=0,
                          policy_version=3, generation_round=0)


def test_a_published_step_whose_parent_was_pruned_is_reused_not_refused(tmp_path: Path) -> None:
    # A resume that misses the train task's cache (its entry lost) replays step 4: its checkpoint is
    # published, made from the same config and batch (no train code version recorded: reused by any,
    # tests/unit/test_train_code_version.py), so it is reused; the parent's pruned weights are not needed.
    import pyarrow as pa

    import schemas
    from engines.train.launch import train_step_in_store
    from engines.train.publish import METRICS_FILE, TIMINGS_FILE, batch_sha256_of
    from settings.train import TrainConfig

    layout = _run(str(tmp_path / "run"))
    pruning.apply_retention({s: layout.checkpoint(s) for s in STEPS}, latest=5, keep_optimizer_last=1, keep_weights_every=2)
    batch = tmp_path / "batch.parquet"
    batch.write_bytes(b"the step's batch")
    config = TrainConfig()
    out = Path(layout.checkpoint(4))
    info = checkpoints.read_info(out)
    info.inputs.update(config=json.loads(json.dumps(asdict(config))), batch_sha256=batch_sha256_of([batch]))
    (out / checkpoints.METADATA_FILE).write_text(json.dumps(asdict(info)))
    row = {f.name: 0 if pa.types.is_integer(f.type) else 0.5 if pa.types.is_floating(f.type) else "x"
           for f in schemas.arrow_schema(schemas.StepMetrics)}
    schemas.write_shard([{**row, "step": 4}], out / METRICS_FILE, schemas.StepMetrics)
    (out / TIMINGS_FILE).write_text("{}")
    result = train_step_in_store(layout.checkpoint(3), [str(batch)], str(out), step=4, config=config)
    assert result.checkpoint_id == "train-0004-abc"
    # Training from it again (nothing published) is refused, naming it.
    with pytest.raises(pruning.PrunedWeightsError, match="step-0003"):
        train_step_in_store(layout.checkpoint(3), [str(batch)], str(tmp_path / "elsewhere"), step=4, config=config)


def test_publishing_a_pruned_checkpoint_again_unchanged_keeps_its_records_and_new_content_drops_the_pruned_one(
        root: str) -> None:
    # A replayed train task that reuses its published step publishes the folder again (outputs.output):
    # its digest record, hence the upstream digest every later cached call is keyed on, must not change,
    # or the next step's rollout misses the cache and needs the pruned weights.
    layout = _run(root)
    pruning.apply_retention({s: layout.checkpoint(s) for s in STEPS}, latest=5, keep_optimizer_last=1, keep_weights_every=2)
    path = layout.checkpoint(3)
    if not run_store.is_remote(path):  # in an object store the train task reuses a step without publishing it
        before = (run_store.read_text(digests.record_path(path)), digests.upstream_digest([path]))
        with outputs.output(path, folder=True):
            pass  # reused as it is
        assert (run_store.read_text(digests.record_path(path)), digests.upstream_digest([path])) == before
        assert pruning.pruned_files(path)
    # The step trained again instead (other inputs): whole new content, and the pruned record is gone.
    with outputs.output(path, folder=True) as local:
        local.mkdir(parents=True, exist_ok=True)
        (local / WEIGHTS).write_bytes(b"new weights")
    assert not pruning.pruned_files(path) and pruning.check(path) == []
    pruning.require_weights(path)


def test_pruned_sizes_are_given_in_a_unit_they_reach() -> None:
    # the main job's pruned checkpoints are ~13 MB, the paper's 458.7 GB: neither reads "0.0 GB" or "0.0 TB"
    assert [pruning.size_text(n) for n in (0, 810, 12_700_000, 458_700_000_000, 2_600_000_000_000)] == [
        "0 bytes", "810 bytes", "12.7 MB", "458.7 GB", "2.6 TB"]


def test_pruned_checkpoints_verify_as_pruned_not_missing(root: str) -> None:
    layout = _run(root)
    # step 0: weights, config, metadata; steps 1-5: + metrics and 2 optimizer files -> 3 + 5 * 6 = 33
    assert verify_run(layout.root) == ([], 33) and pruned_outputs(layout.root) == []
    pruning.apply_retention({s: layout.checkpoint(s) for s in STEPS}, latest=5, keep_optimizer_last=1, keep_weights_every=2)
    assert verify_run(layout.root) == ([], 33 - 10)
    assert pruned_outputs(layout.root) == [
        f"{layout.checkpoint(1)}: pruned by the retention policy: weights, optimizer state (3 files, 810 bytes)",
        f"{layout.checkpoint(2)}: pruned by the retention policy: optimizer state (2 files, 720 bytes)",
        f"{layout.checkpoint(3)}: pruned by the retention policy: weights, optimizer state (3 files, 810 bytes)",
        f"{layout.checkpoint(4)}: pruned by the retention policy: optimizer state (2 files, 720 bytes)",
    ]
    # a kept file that is deleted is still a problem
    run_store.remove(run_store.join(layout.checkpoint(4), WEIGHTS))
    problems, _ = verify_run(layout.root)
    assert problems == [f"{run_store.join(layout.checkpoint(4), WEIGHTS)}: missing"]


def test_pruned_checkpoints_stay_cache_hits_and_their_digests_unchanged(root: str) -> None:
    layout = _run(root)
    paths = [layout.checkpoint(s) for s in STEPS]
    before = [digests.upstream_digest([p]) for p in paths]
    task = _FakeCachedTask(lambda out: out)  # publishes nothing: a re-make would fail the check
    for path in paths:
        asyncio.run(pruning_call(task, path))
    pruning.apply_retention(dict(zip(STEPS, paths)), latest=5, keep_optimizer_last=1, keep_weights_every=2)
    for path in paths:
        assert asyncio.run(pruning_call(task, path)) == path
    assert task.body_runs == len(paths)  # only the first calls ran the body: every later one a cache hit
    assert [digests.upstream_digest([p]) for p in paths] == before  # downstream cache keys unchanged


async def pruning_call(task: _FakeCachedTask, path: str) -> str:
    from workflows.verified_calls import call_verified

    return await call_verified(task, [path], path)


def test_lineage_reads_pruned_checkpoints(tmp_path: Path) -> None:
    layout = _run(str(tmp_path / "run"))
    pruning.apply_retention({s: layout.checkpoint(s) for s in STEPS}, latest=5, keep_optimizer_last=1, keep_weights_every=2)
    chain = checkpoint_lineage(layout, "3")["ancestry"]
    assert [c["step"] for c in chain] == [3, 2, 1, 0]
    # `dapo lineage --checkpoint`: its id, step-N (padded or not) or the step number
    for name in ("step-3", "step-0003", "3", chain[0]["checkpoint_id"]):
        assert checkpoint_lineage(layout, name)["ancestry"] == chain, name


def test_dapo_verify_prints_pruned_checkpoints_and_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from cli.main import main

    layout = _run(str(tmp_path / "run"))
    pruning.apply_retention({s: layout.checkpoint(s) for s in STEPS}, latest=5, keep_optimizer_last=1, keep_weights_every=2)
    assert main(["verify", str(tmp_path / "run")]) == 0
    out = capsys.readouterr()
    assert f"{layout.checkpoint(1)}: pruned by the retention policy: weights, optimizer state" in out.out
    assert "23 recorded file(s) checked, 4 checkpoint(s) pruned by the retention policy, intact" in out.err


def test_the_driver_checks_each_old_checkpoint_once_not_every_step(root: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # A checkpoint that left the last K never changes plan again, so pruning after step N must
    # not read the records of every older checkpoint again: that grew with the run (17 ms a step
    # at step 150 of the main job; on an object store, requests for each of 1,000 checkpoints).
    layout = RunLayout(root)
    run_store.write_text(layout.run_record, "{}")
    calls: list[str] = []
    real = pruning.prune_checkpoint
    monkeypatch.setattr(pruning, "prune_checkpoint", lambda path, keep: calls.append(path) or real(path, keep))
    paths: dict[int, str] = {}
    settled: set[int] = set()
    for step in STEPS:  # the driver's loop: publish step N, then prune
        paths[step] = _publish(layout, step)
        pruning.apply_retention(paths, latest=step, keep_optimizer_last=1, keep_weights_every=2, settled=settled)
    # K=1: steps 1..4 each left the window once; each is pruned once (step 0 and 5 stay whole).
    assert sorted(calls) == sorted(layout.checkpoint(s) for s in range(1, 5))
    assert settled == {1, 2, 3, 4}
    assert not _exists(layout, 3, WEIGHTS) and _exists(layout, 4, WEIGHTS)
    assert not any(_exists(layout, s, OPTIMIZER[0]) for s in range(1, 5)) and _exists(layout, 5, OPTIMIZER[0])
    # A fresh driver (resume, another K/M) starts with nothing settled and checks every one once.
    calls.clear()
    assert pruning.apply_retention(paths, latest=5, keep_optimizer_last=1, keep_weights_every=2, settled=set()) == []
    assert len(calls) == 4
