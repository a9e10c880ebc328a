"""Digest records of published outputs, the driver's re-make of damaged cached outputs, `dapo verify`.

Files and folders are published through ``outputs.output`` (as every task does), on a local
folder and on fsspec's in-memory object store; damage is done by hand: a deleted file, a
truncated shard, four flipped bytes (same size), a deleted checkpoint folder.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from storage import digests, outputs, run_store
from workflows.verified_calls import DamagedOutputError, call_verified
from cli.verify import verify_run


@pytest.fixture(params=["local", "memory"])
def root(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "local":
        return str(tmp_path / "run")
    monkeypatch.setenv(run_store.MIRROR_ENV, str(tmp_path / "mirror"))
    return f"memory://dapo-test/run-{uuid.uuid4().hex[:8]}"


def _flip(path: str, offset: int = 3) -> None:
    data = bytearray(run_store.read_bytes(path))
    data[offset:offset + 4] = bytes(b ^ 0xFF for b in data[offset:offset + 4])
    if run_store.is_remote(path):
        run_store._fs(path).pipe_file(path, bytes(data))
    else:
        Path(path).write_bytes(bytes(data))


def _sha(path: str) -> str:
    """The first 16 hex digits of the sha256 recorded for the file ``path``."""
    name = path.rpartition("/")[2]
    return json.loads(run_store.read_text(digests.record_path(path)))["files"][name]["sha256"][:16]


def _publish_checkpoint(uri: str, weights: bytes) -> None:
    with outputs.output(uri, folder=True) as local:
        local.mkdir(parents=True, exist_ok=True)
        (local / "model.safetensors").write_bytes(weights)
        (local / run_store.FOLDER_MARKER).write_text('{"checkpoint_id": "x"}')


def test_output_records_sha256_and_size_of_every_file(root: str) -> None:
    shard = run_store.join(root, "steps", "batch.parquet")
    with outputs.output(shard) as local:
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_bytes(b"0123456789")
    ckpt = run_store.join(root, "checkpoints", "step-0001")
    _publish_checkpoint(ckpt, b"weights")
    rec = json.loads(run_store.read_text(digests.record_path(shard)))
    # sha256("0123456789"), worked out with `printf 0123456789 | sha256sum`
    assert rec["files"] == {"batch.parquet": {"bytes": 10, "sha256":
                            "84d89877f0d4041efb6bf91a16f0248f2fd573e6af05c19f96bedb9f882f7882"}}
    rec = json.loads(run_store.read_text(digests.record_path(ckpt)))
    assert sorted(rec["files"]) == ["step-0001/dapo_checkpoint.json", "step-0001/model.safetensors"]
    assert digests.check(shard) == [] and digests.check(ckpt, deep=True) == []


def test_check_names_missing_truncated_and_flipped_files(root: str) -> None:
    shard = run_store.join(root, "round-00.parquet")
    with outputs.output(shard) as local:
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_bytes(bytes(range(64)))
    _flip(shard)
    assert digests.check(shard, deep=True) == [f"{shard}: damaged (sha256 differs from the recorded {_sha(shard)}...)"]
    run_store.write_text(shard, "short")
    assert digests.check(shard) == [f"{shard}: damaged (5 bytes, 64 recorded)"]
    ckpt = run_store.join(root, "checkpoints", "step-0002")
    _publish_checkpoint(ckpt, b"weights")
    run_store.remove(run_store.join(ckpt, "model.safetensors"))
    assert digests.check(ckpt) == [f"{run_store.join(ckpt, 'model.safetensors')}: missing"]
    run_store.remove(digests.record_path(ckpt))
    assert "no digest record" in digests.check(ckpt)[0]


class _FakeCachedTask:
    """A cached task as the driver sees it: ``aio`` answers from its cache once it has an entry
    (the body does not run), ``override(cache="disable")`` always runs the body."""

    name = "tests.fake_stage"

    def __init__(self, body: Any) -> None:
        self.body = body
        self.cache: dict[tuple[Any, ...], Any] = {}
        self.body_runs = 0

    async def aio(self, *args: Any) -> Any:
        if args not in self.cache:
            self.cache[args] = self._run(*args)
        return self.cache[args]

    def override(self, *, cache: str) -> Any:
        assert cache == "disable"
        outer = self

        class _Uncached:
            async def aio(self, *args: Any) -> Any:
                return outer._run(*args)
        return _Uncached()

    def _run(self, *args: Any) -> Any:
        self.body_runs += 1
        return self.body(*args[:-1])  # the last input is the upstream digest: cache key only


def test_a_deleted_or_damaged_cached_checkpoint_is_made_again(root: str) -> None:
    ckpt = run_store.join(root, "checkpoints", "step-0001")
    task = _FakeCachedTask(lambda out: (_publish_checkpoint(out, b"weights"), out)[1])
    assert asyncio.run(call_verified(task, [ckpt], ckpt)) == ckpt
    assert task.body_runs == 1
    assert asyncio.run(call_verified(task, [ckpt], ckpt)) == ckpt  # intact: a plain cache hit
    assert task.body_runs == 1
    run_store.remove(ckpt)  # the whole folder
    assert asyncio.run(call_verified(task, [ckpt], ckpt)) == ckpt
    assert task.body_runs == 2 and digests.check(ckpt, deep=True) == []
    weights = run_store.join(ckpt, "model.safetensors")
    run_store.write_text(weights, "weig")  # truncated
    asyncio.run(call_verified(task, [ckpt], ckpt))
    assert task.body_runs == 3 and run_store.read_bytes(weights) == b"weights"
    _flip(weights, 0)  # same size: the driver hashes local files (an object store is checked by size)
    asyncio.run(call_verified(task, [ckpt], ckpt))
    assert task.body_runs == (4 if not run_store.is_remote(root) else 3)


def test_what_a_call_just_wrote_is_not_hashed_again_and_what_a_cache_hit_points_to_is(
        root: str, monkeypatch: pytest.MonkeyPatch) -> None:
    ckpt = run_store.join(root, "checkpoints", "step-0001")
    task = _FakeCachedTask(lambda out: (_publish_checkpoint(out, b"weights"), out)[1])
    hashed: list[str] = []
    actual = digests._actual_sha256
    monkeypatch.setattr(digests, "_actual_sha256", lambda path: (hashed.append(path), actual(path))[1])
    asyncio.run(call_verified(task, [ckpt], ckpt))
    assert task.body_runs == 1 and hashed == []  # its record was written from the bytes just hashed
    asyncio.run(call_verified(task, [ckpt], ckpt))  # a cache hit: the old record, its files not modified since
    assert task.body_runs == 1
    # A cache hit hashes only the local files modified since their record was written (the same clock
    # tick counts: storage/digests.py: modified_since_record); sizes are compared for all.
    weights = run_store.join(ckpt, "model.safetensors")
    if not run_store.is_remote(root):
        import os

        recorded_at = Path(digests.record_path(ckpt)).stat().st_mtime_ns
        for name in ("dapo_checkpoint.json", "model.safetensors"):
            os.utime(run_store.join(ckpt, name), ns=(recorded_at - 10**9, recorded_at - 10**9))
        hashed.clear()
        asyncio.run(call_verified(task, [ckpt], ckpt))
        assert hashed == []
        os.utime(weights, ns=(recorded_at, recorded_at))  # written again, in the record's tick
    asyncio.run(call_verified(task, [ckpt], ckpt))
    assert task.body_runs == 1
    assert hashed == ([] if run_store.is_remote(root) else [weights])


def test_an_output_that_cannot_be_made_again_is_an_error_naming_it(root: str) -> None:
    shard = run_store.join(root, "batch.parquet")

    def body(out: str) -> str:
        if not run_store.exists(out):  # makes it only the first time
            with outputs.output(out) as local:
                local.parent.mkdir(parents=True, exist_ok=True)
                local.write_bytes(b"rows")
        return out

    task = _FakeCachedTask(body)
    asyncio.run(call_verified(task, [shard], shard))
    run_store.remove(digests.record_path(shard))
    run_store.write_text(shard, "rows")  # replaced behind the pipeline's back: no record
    task.body = lambda out: out  # the stage now writes nothing
    with pytest.raises(DamagedOutputError, match=r"batch\.parquet: missing"):
        asyncio.run(call_verified(task, [shard], shard))


def _synthetic_run(root: str) -> tuple[str, str]:
    run_store.write_text(run_store.join(root, "run.json"), "{}")
    shard = run_store.join(root, "steps", "step-0001", "batch.parquet")
    with outputs.output(shard) as local:
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_bytes(bytes(range(200)))
    ckpt = run_store.join(root, "checkpoints", "step-0001")
    _publish_checkpoint(ckpt, b"weights")
    run_store.write_text(run_store.join(root, "summary.json"), json.dumps({"final_checkpoint": ckpt}))
    return shard, ckpt


def test_verify_reports_each_damaged_or_missing_file(root: str) -> None:
    shard, ckpt = _synthetic_run(root)
    assert verify_run(root) == ([], 3)
    _flip(shard, 100)
    run_store.remove(run_store.join(ckpt, "model.safetensors"))
    problems, _ = verify_run(root)
    assert problems == [f"{run_store.join(ckpt, 'model.safetensors')}: missing",
                        f"{shard}: damaged (sha256 differs from the recorded {_sha(shard)}...)"]
    # Deleting an output together with its record does not make the run look intact.
    digests.forget(ckpt)
    extra = run_store.join(root, "steps", "step-0001", "surplus.parquet")
    run_store.write_text(extra, "unrecorded")
    problems, _ = verify_run(root)
    assert f"{extra}: no digest record covers it" in problems
    assert f"{ckpt}: the final checkpoint summary.json names is missing or incomplete" in problems


def test_dapo_verify_exits_1_naming_the_damaged_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from cli.main import main

    shard, _ = _synthetic_run(str(tmp_path / "run"))
    assert main(["verify", str(tmp_path / "run")]) == 0
    Path(shard).write_bytes(b"truncated")
    assert main(["verify", "run", "--run-root", str(tmp_path)]) == 1
    assert f"{shard}: damaged (9 bytes, 200 recorded)" in capsys.readouterr().out


def _write(out: str, content: bytes) -> str:
    with outputs.output(out) as local:
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_bytes(content)
    return out


def test_downstream_calls_run_again_when_upstream_content_changes_and_only_then(root: str) -> None:
    """Cache keys hold paths; the upstream digest input adds what the upstream outputs hold."""
    scored, batch = run_store.join(root, "scored.parquet"), run_store.join(root, "batch.parquet")
    content = {"scored": b"rewards v1"}
    upstream = _FakeCachedTask(lambda out: _write(out, content["scored"]))
    downstream = _FakeCachedTask(lambda src, out: _write(out, run_store.read_bytes(src) + b" batched"))

    def run_chain() -> None:
        asyncio.run(call_verified(upstream, [scored], scored))
        asyncio.run(call_verified(downstream, [batch], scored, batch, upstream=[scored]))

    run_chain()
    run_chain()  # nothing changed: both cache hits
    assert (upstream.body_runs, downstream.body_runs) == (1, 1)
    # The upstream stage re-ran with the same result (e.g. a comment edit changed its version).
    asyncio.run(call_verified(upstream.override(cache="disable"), [scored], scored))
    run_chain()
    assert downstream.body_runs == 1
    # The upstream stage re-ran and wrote something else into the same path.
    content["scored"] = b"rewards v2"
    asyncio.run(call_verified(upstream.override(cache="disable"), [scored], scored))
    run_chain()
    assert downstream.body_runs == 2 and run_store.read_bytes(batch) == b"rewards v2 batched"


def test_the_upstream_digest_follows_content_not_paths(root: str, tmp_path) -> None:
    a = _write(run_store.join(root, "a.parquet"), b"x")
    before = digests.upstream_digest([a])
    assert digests.upstream_digest([a]) == before
    _write(a, b"y")
    assert digests.upstream_digest([a]) != before
    data = tmp_path / "problems.jsonl"  # a user's data file: no record, its own bytes count
    data.write_text("1")
    first = digests.upstream_digest([str(data), "synthetic:n=10"])
    data.write_text("2")
    assert digests.upstream_digest([str(data), "synthetic:n=10"]) != first


def test_a_model_folder_to_import_counts_by_its_files_not_its_name(tmp_path: Path) -> None:
    """A local folder without a record (a model to import) changes the digest when a file in it is
    rewritten or added; before, only its name counted and an edited model was served from cache."""
    folder = tmp_path / "model"
    (folder / "sub").mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"weights v1")
    first = digests.upstream_digest([str(folder)])
    assert digests.upstream_digest([str(folder)]) == first
    (folder / "model.safetensors").write_bytes(b"weights v2")
    second = digests.upstream_digest([str(folder)])
    assert second != first
    (folder / "sub" / "extra.json").write_text("{}")
    assert digests.upstream_digest([str(folder)]) != second


def test_every_stage_task_takes_the_upstream_digest_last() -> None:
    """call_verified appends the digest as the last argument: each stage task must accept it there."""
    import inspect

    from tasks.batch import assemble_batch
    from tasks.bootstrap import bootstrap
    from tasks.curate import curate
    from tasks.evaluate import evaluate
    from tasks.rollout import rollout
    from tasks.score import score
    from tasks.train import train

    for task in (curate, bootstrap, rollout, score, assemble_batch, train, evaluate):
        assert list(inspect.signature(task.func).parameters)[-1] == "upstream_digest", task.name


def test_file_sha256s_hashes_big_files_at_once_and_gives_what_one_at_a_time_gives(tmp_path: Path) -> None:
    import hashlib
    import os

    sizes = [3 << 20, 10, (1 << 20) + 7, 0, 2 << 20, 1 << 20]
    paths = []
    for i, size in enumerate(sizes):
        paths.append(tmp_path / f"f{i}")
        paths[-1].write_bytes(os.urandom(size))
    assert digests.file_sha256s(paths) == [hashlib.sha256(p.read_bytes()).hexdigest() for p in paths]
    assert digests.file_sha256s(paths[::-1]) == [hashlib.sha256(p.read_bytes()).hexdigest() for p in paths[::-1]]
    assert digests.file_sha256s([]) == []


def test_a_checkpoints_weights_are_read_once_for_its_id_and_its_record(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The id's digest and the record's sha256 come from one read (a paper-scale policy's 65 GB
    were read twice a step), and the id stays sha256 over the weight files' names and bytes."""
    import builtins
    import hashlib
    import io
    import os

    from storage import checkpoints

    folder = tmp_path / "step-0001"
    folder.mkdir()
    weights = folder / "model.safetensors"
    weights.write_bytes(os.urandom((2 << 20) + 5))
    (folder / "config.json").write_text("{}")
    reads: list[str] = []
    real_open = io.open

    def counting_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if "r" in mode and Path(file).name == weights.name:
            reads.append(str(file))
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(io, "open", counting_open)
    monkeypatch.setattr(builtins, "open", counting_open)
    checkpoint_id = checkpoints.make_checkpoint_id("train", 1, folder)
    entry = digests.record(str(folder))
    monkeypatch.undo()

    want = hashlib.sha256(b"model.safetensors" + weights.read_bytes()).hexdigest()[:16]
    assert checkpoint_id == f"train-0001-{want}"
    assert entry is not None
    assert entry["files"]["step-0001/model.safetensors"]["sha256"] == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert len(reads) == 1, reads


def test_a_file_rewritten_since_it_was_hashed_is_hashed_again(tmp_path: Path) -> None:
    import hashlib
    import os

    path = tmp_path / "round-00.parquet"
    path.write_bytes(b"a" * 1000)
    assert digests.known_file_sha256(path) == hashlib.sha256(b"a" * 1000).hexdigest()
    stamp = path.stat().st_mtime_ns
    path.write_bytes(b"b" * 1000)  # same size, same inode
    os.utime(path, ns=(stamp + 1_000_000_000, stamp + 1_000_000_000))  # even where mtimes are coarse
    assert digests.known_file_sha256(path) == hashlib.sha256(b"b" * 1000).hexdigest()
    replacement = tmp_path / "new"
    replacement.write_bytes(b"c" * 1000)
    os.replace(replacement, path)  # another inode
    assert digests.known_file_sha256(path) == hashlib.sha256(b"c" * 1000).hexdigest()


def test_a_deep_check_reads_the_bytes_even_of_a_file_that_looks_unchanged(tmp_path: Path) -> None:
    """Remembered sha256s serve records and cache keys only: damage that keeps the size and the
    modification time (bytes flipped, then the time put back) is still found."""
    import os

    path = str(tmp_path / "round-00.parquet")
    with outputs.output(path) as local:
        local.write_bytes(os.urandom(4096))
    stamp = Path(path).stat().st_mtime_ns
    _flip(path)
    os.utime(path, ns=(stamp, stamp))
    assert digests.check(path, deep=True) == [f"{path}: damaged (sha256 differs from the recorded {_sha(path)}...)"]
