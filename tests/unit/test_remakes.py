"""A cached call whose outputs were re-made returns the re-made result on every later call.

``call_verified`` (workflows/verified_calls.py) makes a damaged output again; the result the
re-made call returned must be what every later call (a resume) gets back, never the first result
the cache still holds for the old key (storage/remakes.py). Checked with a real cached Flyte task
run locally (remake_flyte_main.py, in a process of its own), and with the fake cached task of
test_digests.py on a folder and on an in-memory object store.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage import digests, outputs, remakes, run_store
from workflows.verified_calls import call_verified
from cli.verify import verify_run

from .test_digests import _FakeCachedTask, _publish_checkpoint

REPO = Path(__file__).resolve().parents[2]


def test_a_resume_after_a_remake_returns_the_remade_result_from_the_flyte_cache(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(Path(__file__).with_name("remake_flyte_main.py")), str(tmp_path / "run")],
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    calls = json.loads(done.stdout.strip().splitlines()[-1])
    assert calls == [
        {"returned": "made-1", "file": "made-1"},
        {"returned": "made-1", "file": "made-1"},  # a cache hit, the file intact
        {"returned": "made-2", "file": "made-2"},  # the file was damaged: made again
        {"returned": "made-2", "file": "made-2"},  # a resume: a cache hit of the re-made call, not of the first
    ]
    assert (tmp_path / "run" / "steps" / "body-runs.txt").read_text() == "2"


@pytest.fixture(params=["local", "memory"])
def root(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "local":
        return str(tmp_path / "run")
    monkeypatch.setenv(run_store.MIRROR_ENV, str(tmp_path / "mirror"))
    return f"memory://dapo-test/run-{uuid.uuid4().hex[:8]}"


def _write(out: str, text: str) -> str:
    with outputs.output(out) as local:
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_text(text)
    return text


def test_every_remake_gets_a_cache_entry_of_its_own_and_resumes_hit_the_latest(root: str) -> None:
    shard = run_store.join(root, "steps", "step-0001", "batch.parquet")
    runs = iter(range(1, 100))
    task = _FakeCachedTask(lambda out: _write(out, f"rows {next(runs)}"))
    call = lambda: asyncio.run(call_verified(task, [shard], shard, upstream=[]))  # noqa: E731
    assert call() == "rows 1" and call() == "rows 1"
    for remade in (2, 3):
        run_store.remove(shard)
        assert call() == f"rows {remade}"
        assert call() == f"rows {remade}" == run_store.read_text(shard)  # the resume
    assert task.body_runs == 3 and len(task.cache) == 3  # the first call and two re-makes, each its own key
    assert run_store.exists(remakes.record_path(shard))


def test_a_remade_checkpoints_record_is_no_output_the_run_folder_still_verifies(root: str) -> None:
    ckpt = run_store.join(root, "checkpoints", "step-0001")
    task = _FakeCachedTask(lambda out: (_publish_checkpoint(out, b"weights"), out)[1])
    asyncio.run(call_verified(task, [ckpt], ckpt))
    run_store.remove(run_store.join(ckpt, "model.safetensors"))
    asyncio.run(call_verified(task, [ckpt], ckpt))
    assert task.body_runs == 2 and run_store.exists(remakes.record_path(ckpt))
    before = digests.upstream_digest([ckpt])
    assert verify_run(root) == ([], 2)  # the record beside checkpoints/step-0001 needs no digest record
    assert digests.upstream_digest([ckpt]) == before  # nor is it part of what downstream calls are keyed on


def test_a_remake_under_one_upstream_does_not_change_the_key_under_another(root: str) -> None:
    shard = run_store.join(root, "score.parquet")
    key = remakes.cache_key([shard], "upstream-a")
    assert key == "upstream-a" and remakes.cache_key([], "upstream-a") == "upstream-a"
    first = remakes.record_remake([shard], "upstream-a")
    second = remakes.record_remake([shard], "upstream-a")
    assert len({key, first, second}) == 3 and remakes.cache_key([shard], "upstream-a") == second
    assert second.startswith("upstream-a|remade-2-")
    assert remakes.cache_key([shard], "upstream-b") == "upstream-b"  # an upstream never re-made
    assert remakes.cache_key([shard], "upstream-a") == second  # kept beside the other


def test_a_damaged_remake_record_is_an_error_naming_it(root: str) -> None:
    shard = run_store.join(root, "score.parquet")
    remakes.record_remake([shard], "upstream-a")
    run_store.write_text(remakes.record_path(shard), "{not json")
    with pytest.raises(remakes.RemakeRecordError, match=r"score\.parquet\.remade\.json"):
        remakes.cache_key([shard], "upstream-a")



@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["up-a", "up-b", "up-c"]), max_size=12))
def test_keys_never_repeat_and_a_resume_computes_the_latest_for_its_upstream(remade: list[str]) -> None:
    # Any order of re-makes under a few upstream digests: every re-make's key is new (it cannot hit an
    # older entry), and each upstream's key is its last re-make's (or the plain digest, never re-made).
    with tempfile.TemporaryDirectory() as folder:
        shard = str(Path(folder) / "scored.parquet")
        keys = [remakes.cache_key([shard], up) for up in ("up-a", "up-b", "up-c")]
        latest = dict(zip(("up-a", "up-b", "up-c"), keys))
        for up in remade:
            latest[up] = remakes.record_remake([shard], up)
            keys.append(latest[up])
        assert len(set(keys)) == len(keys)
        assert {up: remakes.cache_key([shard], up) for up in latest} == latest
