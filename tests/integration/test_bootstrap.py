"""The bootstrap stage: tiny policy from Problem shards or synthetic problems, and model import."""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import pytest

import schemas
from dapo_core.answers import problem_id
from engines import policy_bootstrap as bs
from engines import tiny_policy
from readers.synthetic import make_problem
from storage import checkpoints
from workflows.commands import bootstrap as bootstrap_cli

FAST = dict(num_layers=1, hidden_size=64, batch_size=16, eval_every_steps=5, eval_problems=8, cpu_threads=1)


def _problem_shard(path: Path, split: str, n: int, seed: int) -> Path:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        text, answer = make_problem(rng, min_terms=2, max_terms=2, max_operand=9)
        rows.append({"problem_id": problem_id(f"{split}{i}{text}"), "source": "synthetic", "source_row": i,
                     "problem": text, "answer": answer, "original_answer": str(answer),
                     "prompt": tiny_policy.render_prompt(text), "split": split, "answer_rule": "integer"})
    return schemas.write_shard(rows, path, schemas.Problem)


def test_tiny_policy_from_shards_records_lineage(tmp_path: Path) -> None:
    train = _problem_shard(tmp_path / "train-00000.parquet", "train", 32, 0)
    test = _problem_shard(tmp_path / "test-00000.parquet", "test", 8, 1)
    # band [0, 1]: stops at the first check (step 5), so this stays fast.
    config = bs.BootstrapConfig(**FAST, max_steps=20, target_accuracy_low=0.0, target_accuracy_high=1.0)
    out = bs.bootstrap_policy(tmp_path / "ckpt-0", config, [str(train)], [str(test)])
    info = checkpoints.read_info(out)
    assert info.step == 0 and info.produced_by == "bootstrap" and info.checkpoint_id.startswith("bootstrap-0000-")
    assert info.inputs["train_shards"] == ["train-00000.parquet"]
    assert info.inputs["warmup"]["steps"] == 5 and info.inputs["warmup"]["stop_reason"] == "in_band"
    assert info.inputs["train_examples"] == 32 and info.inputs["heldout_problems"] == 8
    # the same config and inputs again: the published checkpoint is reused, not retrained
    mtime = (out / "model.safetensors").stat().st_mtime_ns
    assert bs.bootstrap_policy(tmp_path / "ckpt-0", config, [str(train)], [str(test)]) == out
    assert (out / "model.safetensors").stat().st_mtime_ns == mtime


def test_warm_up_outside_band_is_an_error(tmp_path: Path) -> None:
    config = bs.BootstrapConfig(**FAST, max_steps=5, target_accuracy_low=0.99, target_accuracy_high=1.0,
                                synthetic_train_problems=64)
    with pytest.raises(bs.BootstrapError, match="outside"):
        bs.bootstrap_policy(tmp_path / "ckpt", config)
    assert not (tmp_path / "ckpt").exists()


def test_import_local_model_copy_and_link(tmp_path: Path) -> None:
    source = tiny_policy.build_random_checkpoint(tmp_path / "hf-model", seed=3)
    (source / checkpoints.METADATA_FILE).unlink()  # a plain HF folder, as downloaded elsewhere
    copied = bs.bootstrap_policy(tmp_path / "copy", bs.BootstrapConfig(source=str(source)))
    linked = bs.bootstrap_policy(tmp_path / "link", bs.BootstrapConfig(source=str(source), link_import=True))
    a, b = checkpoints.read_info(copied), checkpoints.read_info(linked)
    assert a.produced_by == b.produced_by == "import" and a.step == 0
    assert a.checkpoint_id == b.checkpoint_id  # same weights, same id
    assert (linked / "model.safetensors").is_symlink() and not (copied / "model.safetensors").is_symlink()
    assert a.inputs["source"] == str(source.resolve())


def test_import_rejects_non_model_folder(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(bs.BootstrapError, match="config.json"):
        bs.bootstrap_policy(tmp_path / "out", bs.BootstrapConfig(source=str(tmp_path / "empty")))


def test_cli_reports_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    bootstrap_cli.add_arguments(parser)
    args = parser.parse_args(["--out", str(tmp_path / "x"), "--set", "no_such_field=1"])
    assert bootstrap_cli.run_cli(args) == 1
    assert "no_such_field" in capsys.readouterr().err


@pytest.mark.slow
def test_default_warm_up_lands_in_band(tmp_path: Path) -> None:
    # The default difficulty (2 terms, operands <= 20) and lr reach 20-50 % held-out greedy
    # accuracy well before max_steps (measured ~150-175 steps, 35 s on 1 thread).
    out = bs.bootstrap_policy(tmp_path / "ckpt", bs.BootstrapConfig(cpu_threads=1))
    warmup = checkpoints.read_info(out).inputs["warmup"]
    assert warmup["stop_reason"] == "in_band"
    assert 0.2 <= warmup["heldout_accuracy"] <= 0.5
