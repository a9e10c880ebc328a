"""``dapo serve`` and ``dapo ask`` name a checkpoint by its id only when its weights are the ones the id
and the digest record name (workflows/policy_source.py: ``check_weights``).

Before, with step 3's weights copied over step 4's, both answered as ``train-0004-...`` from step 3's
weights. The checkpoints here are tiny random policies published through ``storage.outputs.output``
(so each has its digest record, as a run's have), in a run folder on a path and in an object store.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

import pytest

from engines.bootstrap import tiny_policy
from storage import checkpoints, digests, outputs, run_store
from storage.run_layout import RunLayout
from cli.main import main
from workflows.config import load_config
from workflows.exit_codes import BAD_INPUT
from workflows.policy_source import WeightsMismatchError, resolve_policy

REPO = Path(__file__).resolve().parents[2]
WEIGHTS = "model.safetensors"


def _publish(path: str, seed: int) -> None:
    with outputs.output(path, folder=True) as local:
        tiny_policy.build_random_checkpoint(local, seed=seed, num_layers=1, hidden_size=16, num_heads=2)


def _run_folder(root: str) -> RunLayout:
    """A run folder with two published checkpoints (steps 3 and 4, other weights) and its run.json."""
    layout = RunLayout(root)
    run_store.write_text(layout.run_record, json.dumps({"config": load_config(REPO / "configs" / "tiny-cpu.yaml").to_dict()}))
    _publish(layout.checkpoint(3), seed=3)
    _publish(layout.checkpoint(4), seed=4)
    return layout


def _copy_weights(layout: RunLayout, source_step: int, target_step: int) -> None:
    shutil.copyfile(Path(layout.checkpoint(source_step)) / WEIGHTS, Path(layout.checkpoint(target_step)) / WEIGHTS)


def test_an_intact_checkpoint_resolves_to_its_own_id(tmp_path: Path) -> None:
    layout = _run_folder(str(tmp_path / "run"))
    policy = resolve_policy(layout.root)
    assert policy.checkpoint_id == checkpoints.read_info(layout.checkpoint(4)).checkpoint_id
    assert policy.step == 0  # build_random_checkpoint records step 0; the folder's name says 4


def test_weights_copied_over_another_checkpoint_are_refused(tmp_path: Path) -> None:
    layout = _run_folder(str(tmp_path / "run"))
    _copy_weights(layout, 3, 4)
    with pytest.raises(WeightsMismatchError) as caught:
        resolve_policy(layout.root)
    message = str(caught.value)
    assert f"{layout.checkpoint(4)}/{WEIGHTS}" in message
    assert checkpoints.read_info(layout.checkpoint(4)).checkpoint_id in message
    assert "\n" not in message


def test_weights_changed_where_no_digest_record_covers_them_are_refused_by_the_id(tmp_path: Path) -> None:
    # A checkpoint outside a run folder has no digest record; its id still names its weights' digest.
    one = tiny_policy.build_random_checkpoint(tmp_path / "one", seed=1, num_layers=1, hidden_size=16, num_heads=2)
    two = tiny_policy.build_random_checkpoint(tmp_path / "two", seed=2, num_layers=1, hidden_size=16, num_heads=2)
    assert not run_store.exists(digests.record_path(two))
    assert resolve_policy(str(two)).checkpoint_id == checkpoints.read_info(two).checkpoint_id  # intact: allowed
    shutil.copyfile(one / WEIGHTS, two / WEIGHTS)
    with pytest.raises(WeightsMismatchError, match=checkpoints.read_info(two).checkpoint_id):
        resolve_policy(str(two))


def test_a_checkpoint_id_without_a_weights_digest_is_served_as_it_is(tmp_path: Path) -> None:
    # A hand-made dapo_checkpoint.json may name the model anything: nothing to check it against.
    folder = tiny_policy.build_random_checkpoint(tmp_path / "mine", seed=1, num_layers=1, hidden_size=16, num_heads=2)
    info = json.loads((folder / checkpoints.METADATA_FILE).read_text())
    (folder / checkpoints.METADATA_FILE).write_text(json.dumps({**info, "checkpoint_id": "my-model"}))
    assert resolve_policy(str(folder)).checkpoint_id == "my-model"


@pytest.mark.parametrize("command", [["ask", "{run}", "3+4"], ["serve", "{run}", "--port", "{port}"]])
def test_ask_and_serve_exit_2_naming_the_checkpoint_and_the_file(command: list[str], tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    layout = _run_folder(str(tmp_path / "run"))
    _copy_weights(layout, 3, 4)
    code = main([arg.format(run=layout.root, port=_free_port()) for arg in command])
    err = capsys.readouterr().err
    assert code == BAD_INPUT, err[-2000:]
    assert f"{layout.checkpoint(4)}/{WEIGHTS}" in err and "Traceback" not in err, err[-2000:]


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def store_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(run_store.MIRROR_ENV, str(tmp_path / "mirror"))
    return f"memory://dapo-test/run-{uuid.uuid4().hex[:8]}"


def test_in_an_object_store_weights_of_another_size_are_refused_before_download(
        store_root: str, monkeypatch: pytest.MonkeyPatch) -> None:
    layout = _run_folder(store_root)
    weights = run_store.join(layout.checkpoint(4), WEIGHTS)
    run_store.upload_file(_local_copy(weights, extra=b"\0" * 8), weights)

    def download(folder: str) -> None:
        raise AssertionError(f"{folder} was downloaded before its weights' sizes were checked")

    monkeypatch.setattr(checkpoints, "fetch_policy", download)
    with pytest.raises(WeightsMismatchError, match=rf"{WEIGHTS}: .*bytes"):
        resolve_policy(layout.root)


def test_in_an_object_store_weights_of_the_same_size_are_refused_by_the_id(store_root: str) -> None:
    layout = _run_folder(store_root)
    step3 = _local_copy(run_store.join(layout.checkpoint(3), WEIGHTS))
    run_store.upload_file(step3, run_store.join(layout.checkpoint(4), WEIGHTS))
    shutil.rmtree(run_store.local_path(layout.root))  # a node that has not fetched them yet
    with pytest.raises(WeightsMismatchError, match=checkpoints.read_info(layout.checkpoint(4)).checkpoint_id):
        resolve_policy(layout.root)
    assert resolve_policy(layout.checkpoint(3)).step == 0  # the intact one still resolves


def _local_copy(uri: str, extra: bytes = b"") -> Path:
    local = Path(os.environ[run_store.MIRROR_ENV]).parent / f"copy-{uuid.uuid4().hex[:8]}"
    local.write_bytes(run_store.read_bytes(uri) + extra)
    return local
