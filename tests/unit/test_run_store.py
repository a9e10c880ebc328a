"""The run store on an object store: paths, atomic uploads, marker-last folders, the mirror.

Runs each case on fsspec's in-memory store and on a local S3 server (moto, through the Flyte
SDK's obstore filesystem, as on a cluster); the S3 cases skip when moto is not installed.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage import checkpoints, outputs, run_store


@pytest.fixture(params=["memory", "s3"])
def root(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh run root in the store under test."""
    if request.param == "s3":
        request.getfixturevalue("s3_env")
        return f"s3://dapo-test/runs-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv(run_store.MIRROR_ENV, str(tmp_path / "mirror"))
    return f"memory://dapo-test/runs-{uuid.uuid4().hex[:8]}"


def test_paths_and_uris_are_told_apart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(run_store.MIRROR_ENV, str(tmp_path))
    assert run_store.join("s3://b/runs/", "r1", "x.parquet") == "s3://b/runs/r1/x.parquet"
    assert run_store.join("runs", "r1") == str(Path("runs", "r1"))
    assert not run_store.is_remote("/data/runs") and not run_store.is_remote("file:///data/runs")
    assert run_store.local_path("file:///data/x") == Path("/data/x")
    assert run_store.local_path("s3://b/runs/x") == tmp_path / "s3" / "b" / "runs" / "x"
    assert run_store.source_name(tmp_path / "s3" / "b" / "runs" / "x") == "s3://b/runs/x"


def test_the_folder_marker_is_the_checkpoint_metadata_file() -> None:
    from storage import checkpoints

    assert run_store.FOLDER_MARKER == checkpoints.METADATA_FILE


def test_local_paths_pass_through(tmp_path: Path) -> None:
    target = tmp_path / "a" / "x.txt"
    with outputs.output(str(target)) as local:
        assert local == target  # stage code writes in place; its own temp-then-rename applies
        local.parent.mkdir(parents=True)
        local.write_text("1")
    assert run_store.fetch(str(target)) == target
    assert run_store.glob(str(tmp_path), "a/*.txt") == [str(target)]


def test_text_round_trip_and_listing(root: str) -> None:
    run_store.write_text(run_store.join(root, "steps", "a.json"), '{"a": 1}')
    run_store.write_text(run_store.join(root, "steps", "b.json"), '{"b": 2}')
    assert run_store.read_text(run_store.join(root, "steps", "b.json")) == '{"b": 2}'
    assert run_store.glob(root, "steps/*.json") == [run_store.join(root, "steps", n) for n in ("a.json", "b.json")]
    assert run_store.exists(run_store.join(root, "steps", "a.json"))
    assert not run_store.exists(run_store.join(root, "steps", "c.json"))
    with pytest.raises(FileNotFoundError, match="c.json"):
        run_store.read_text(run_store.join(root, "steps", "c.json"))


def test_file_output_is_uploaded_only_after_the_block(root: str) -> None:
    uri = run_store.join(root, "x.parquet")
    with pytest.raises(RuntimeError, match="stage failed"):
        with outputs.output(uri) as local:
            local.write_bytes(b"half")
            raise RuntimeError("stage failed")
    assert not run_store.exists(uri)  # nothing half-written reaches the store
    with outputs.output(uri) as local:
        local.write_bytes(b"whole")
    assert run_store.read_bytes(uri) == b"whole"


def _write_checkpoint(folder: Path, weights: bytes) -> None:
    (folder / "ds_state").mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(weights)
    (folder / "ds_state" / "rank0.pt").write_bytes(b"optim")
    (folder / run_store.FOLDER_MARKER).write_text('{"checkpoint_id": "%s"}' % weights.decode())


def test_folder_upload_puts_the_marker_last_and_clears_leftovers(root: str, monkeypatch: pytest.MonkeyPatch) -> None:
    uri = run_store.join(root, "checkpoints", "step-0001")
    run_store.write_text(run_store.join(uri, "stale-from-killed-attempt.bin"), "x")
    uploaded: list[str] = []
    real_upload = run_store.upload_file
    monkeypatch.setattr(run_store, "upload_file", lambda local, u: (uploaded.append(u), real_upload(local, u)))
    with outputs.output(uri, folder=True) as local:
        _write_checkpoint(local, b"w1")
    assert uploaded[-1] == run_store.join(uri, run_store.FOLDER_MARKER)
    assert sorted(uploaded) == sorted(run_store.join(uri, n) for n in
                                      ("model.safetensors", "ds_state/rank0.pt", run_store.FOLDER_MARKER))
    assert not run_store.exists(run_store.join(uri, "stale-from-killed-attempt.bin"))


def _published(root: str, name: str, weights: bytes) -> str:
    """A checkpoint folder ``name`` written through this node's mirror into the store."""
    uri = run_store.join(root, "checkpoints", name)
    with outputs.output(uri, folder=True) as local:
        _write_checkpoint(local, weights)
    return uri


def _downloads(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The keys of every download from now on, one list per download: a folder's, or the files a
    fetch adds to a partial copy."""
    downloads: list[list[str]] = []
    folder, files = run_store._download_folder, run_store._download_files
    monkeypatch.setattr(run_store, "_download_folder", lambda u, l, k: (downloads.append(list(k)), folder(u, l, k)))
    monkeypatch.setattr(run_store, "_download_files", lambda l, k: (downloads.append(list(k.values())), files(l, k)))
    return downloads


def test_fetch_downloads_a_checkpoint_once_per_marker(root: str, monkeypatch: pytest.MonkeyPatch) -> None:
    uri = _published(root, "step-0001", b"w1")
    downloads = _downloads(monkeypatch)
    mirror = run_store.local_path(uri)
    assert run_store.fetch(uri) == mirror and downloads == []  # the writer's mirror copy is current
    other = Path(str(run_store.mirror_root()) + "-other-node")
    monkeypatch.setenv(run_store.MIRROR_ENV, str(other))  # another node: an empty mirror
    fetched = run_store.fetch(uri)
    assert fetched.is_relative_to(other) and len(downloads) == 1
    assert (fetched / "model.safetensors").read_bytes() == b"w1" and (fetched / "ds_state" / "rank0.pt").is_file()
    run_store.fetch(uri)
    assert len(downloads) == 1  # same marker: no second download
    run_store.write_text(run_store.join(uri, "model.safetensors"), "w2")
    run_store.write_text(run_store.join(uri, run_store.FOLDER_MARKER), '{"checkpoint_id": "w2"}')
    assert (run_store.fetch(uri) / "model.safetensors").read_bytes() == b"w2" and len(downloads) == 2


def _files(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def test_rollout_fetches_a_checkpoint_without_its_optimizer_state(root: str, monkeypatch: pytest.MonkeyPatch) -> None:
    uri = _published(root, "step-0001", b"w1")
    downloads = _downloads(monkeypatch)
    monkeypatch.setenv(run_store.MIRROR_ENV, str(run_store.mirror_root()) + "-engine-node")  # an empty mirror
    policy = checkpoints.fetch_policy(uri)
    assert _files(policy) == [run_store.FOLDER_MARKER, "model.safetensors"]
    assert len(downloads) == 1 and not any("/ds_state/" in key for key in downloads[0]) and len(downloads[0]) == 2
    assert checkpoints.fetch_policy(uri) == policy and len(downloads) == 1  # a second round: nothing fetched
    # A training step on the same node needs the optimizer state: the fetch adds it to the copy, and
    # nothing else: the weights a rollout on the node may be reading stay the same file.
    weights = (policy / "model.safetensors").stat().st_ino
    whole = run_store.fetch(uri)
    assert whole == policy and _files(whole) == [run_store.FOLDER_MARKER, "ds_state/rank0.pt", "model.safetensors"]
    assert downloads[1:] == [[run_store.join(uri, "ds_state", "rank0.pt")]]
    assert (whole / "model.safetensors").stat().st_ino == weights
    assert checkpoints.fetch_policy(uri) == whole and len(downloads) == 2  # the whole copy serves a rollout
    assert run_store.fetch(uri) == whole and len(downloads) == 2  # and a training step


def test_a_copy_left_by_an_earlier_version_is_fetched_again(root: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Its note held skip patterns, not names: what it lacks is not known, so it serves no fetch.
    uri = _published(root, "step-0001", b"w1")
    monkeypatch.setenv(run_store.MIRROR_ENV, str(run_store.mirror_root()) + "-old-node")
    policy = checkpoints.fetch_policy(uri)
    (policy.parent / ".step-0001.missing.json").unlink()
    (policy.parent / ".step-0001.skipped.json").write_text('["ds_state/*"]')
    downloads = _downloads(monkeypatch)
    assert (run_store.fetch(uri) / "ds_state" / "rank0.pt").is_file() and len(downloads) == 1
    assert not (policy.parent / ".step-0001.skipped.json").exists()


def test_a_step_written_again_on_the_node_leaves_a_whole_copy(root: str, monkeypatch: pytest.MonkeyPatch) -> None:
    uri = _published(root, "step-0002", b"w1")
    shutil.rmtree(run_store.local_path(uri))  # this node no longer holds it
    assert _files(checkpoints.fetch_policy(uri)) == [run_store.FOLDER_MARKER, "model.safetensors"]
    _published(root, "step-0002", b"w1")  # a re-run of the step on this node writes it again
    downloads = _downloads(monkeypatch)
    assert (run_store.fetch(uri) / "ds_state" / "rank0.pt").is_file() and downloads == []  # the writer's copy serves


def test_fetch_names_what_is_missing(root: str) -> None:
    with pytest.raises(FileNotFoundError, match="checkpoints/step-0009"):
        run_store.fetch(run_store.join(root, "checkpoints", "step-0009"))


def test_download_tree_can_skip_weights(root: str, tmp_path: Path) -> None:
    uri = run_store.join(root, "checkpoints", "step-0001")
    with outputs.output(uri, folder=True) as local:
        _write_checkpoint(local, b"w1")
    dest = run_store.download_tree(root, tmp_path / "records", exclude_suffixes=(".safetensors", ".pt"))
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()) == [
        "checkpoints/step-0001.sha256.json", f"checkpoints/step-0001/{run_store.FOLDER_MARKER}"
    ]  # the folder's digest record (storage/digests.py) is a record too


_FILES = ["model.safetensors", "config.json", "tokenizer.json", "ds_state/latest", "ds_state/step1/mp_rank_00_model_states.pt",
          "ds_state/step1/zero_pp_rank_0_mp_rank_00_optim_states.pt",
          "ds_state/step1/zero_pp_rank_1_mp_rank_00_optim_states.pt",
          "ds_state/step1/zero_pp_rank_10_mp_rank_00_optim_states.pt"]
_SKIPS = [(), ("ds_state/*",), ("*.safetensors",), ("*.json",), ("ds_state/*/*zero_pp_rank_1_mp_rank_*",),
          ("ds_state/*/*zero_pp_rank_0_mp_rank_*", "ds_state/*/*zero_pp_rank_10_mp_rank_*")]


@settings(max_examples=40, deadline=None)
@given(files=st.sets(st.sampled_from(_FILES), min_size=1), fetches=st.lists(st.sampled_from(_SKIPS), min_size=1, max_size=6))
def test_every_fetch_holds_what_it_did_not_skip_and_downloads_only_when_it_must(files: set[str],
                                                                               fetches: list[tuple[str, ...]]) -> None:
    # A fresh node fetches one checkpoint again and again, each time skipping other files: after each
    # fetch the mirror holds every file the fetch did not skip, with the store's bytes, and nothing the
    # store lacks; it downloads the folder once, then only the files a fetch reads and the copy lacks,
    # and never removes one.
    import fnmatch
    import os
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        old = os.environ.get(run_store.MIRROR_ENV)
        os.environ[run_store.MIRROR_ENV] = scratch
        folder, add = run_store._download_folder, run_store._download_files
        try:
            uri = f"memory://dapo-test/prop-{uuid.uuid4().hex[:8]}/checkpoints/step-0001"
            every = files | {run_store.FOLDER_MARKER}
            for name in sorted(every):
                run_store.write_text(run_store.join(uri, name), f"bytes of {name}")
            got: list[set[str]] = []  # the names each download brought
            name_of = lambda key: key[len(uri) + 1:]  # noqa: E731
            run_store._download_folder = lambda u, l, k: (got.append({name_of(x) for x in k}), folder(u, l, k))  # type: ignore[assignment]
            run_store._download_files = lambda l, k: (got.append({name_of(x) for x in k.values()}), add(l, k))  # type: ignore[assignment]
            missing: set[str] | None = None  # what the copy lacks; None: no copy yet
            for skip in fetches:
                local = run_store.fetch(uri, skip=skip)
                held = set(_files(local))
                wanted = {f for f in files if not any(fnmatch.fnmatchcase(f, p) for p in skip)} | {run_store.FOLDER_MARKER}
                assert wanted <= held <= every
                assert all((local / f).read_text() == f"bytes of {f}" for f in held)
                need = wanted if missing is None else missing & wanted
                assert got == ([need] if need else [])
                missing = (every - wanted) if missing is None else missing - need
                assert held == every - missing  # nothing removed
                got.clear()
        finally:
            run_store._download_folder, run_store._download_files = folder, add  # type: ignore[assignment]
            if old is None:
                os.environ.pop(run_store.MIRROR_ENV, None)
            else:
                os.environ[run_store.MIRROR_ENV] = old


def test_a_rollout_nodes_mirror_keeps_the_latest_checkpoints_only(root: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # An engine node outlives the steps and fetches every step's checkpoint: its mirror keeps the
    # MIRRORED_CHECKPOINTS most recently fetched (65.5 GB each at paper scale), not all of them.
    uris = [_published(root, f"step-{i:04d}", f"w{i}".encode()) for i in range(6)]
    monkeypatch.setenv(run_store.MIRROR_ENV, str(run_store.mirror_root()) + "-engine-node")
    folder = run_store.local_path(uris[0]).parent
    (folder / ".step-0009.fetch-1234").mkdir(parents=True)  # a download under way: hidden, with its marker
    (folder / ".step-0009.fetch-1234" / run_store.FOLDER_MARKER).write_text("{}")
    kept = checkpoints.MIRRORED_CHECKPOINTS
    for i in range(4):
        checkpoints.fetch_policy(uris[i])
    assert sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")) == \
        [f"step-{i:04d}" for i in range(4 - kept, 4)]
    checkpoints.fetch_policy(uris[1])  # fetched again: the most recent now
    checkpoints.fetch_policy(uris[4])
    assert sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")) == \
        ["step-0001", "step-0003", "step-0004"]
    assert (folder / ".step-0009.fetch-1234" / run_store.FOLDER_MARKER).is_file()  # never touched
    assert (checkpoints.fetch_policy(uris[0]) / "model.safetensors").read_bytes() == b"w0"  # evicted: fetched again
    local_run = Path(str(run_store.mirror_root())) / "local-run" / "checkpoints"
    for i in range(5):
        _write_checkpoint(local_run / f"step-{i:04d}", b"w")
        checkpoints.fetch_policy(local_run / f"step-{i:04d}")
    assert len(list(local_run.iterdir())) == 5  # a run folder on a filesystem is never pruned by this
