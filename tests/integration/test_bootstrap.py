"""The bootstrap stage: tiny policy from Problem shards or synthetic problems, and model import."""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import pytest

import schemas
from dapo_core.answers import problem_id
from engines.bootstrap import stage as bs
from engines.bootstrap import tiny_policy
from readers.synthetic import make_problem
from storage import checkpoints, run_store
from cli import bootstrap as bootstrap_cli

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


def test_the_early_tokenizer_check_refuses_a_source_the_import_would_refuse(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # The driver reads the source's tokenizer and context right after curation; a folder that is missing
    # or holds no model was a FileNotFoundError traceback there (exit 1) instead of the import's one line.
    with pytest.raises(bs.BootstrapError, match=f"bootstrap source {tmp_path / 'none'}: not a folder"):
        bs.policy_tokenizer_folder(str(tmp_path / "none"), tmp_path)
    source = tiny_policy.build_random_checkpoint(tmp_path / "hf-model", seed=3)
    (source / "model.safetensors").unlink()
    with pytest.raises(bs.BootstrapError, match="no \\*.safetensors weights"):
        bs.policy_tokenizer_folder(str(source), tmp_path)
    monkeypatch.setenv(run_store.MIRROR_ENV, str(tmp_path / "mirror"))
    with pytest.raises(bs.BootstrapError, match="bootstrap source memory://dapo-test/no-model: no config.json"):
        bs.policy_tokenizer_folder("memory://dapo-test/no-model", tmp_path / "scratch")


def test_the_warm_up_problems_are_recorded_and_survive_an_import(tmp_path: Path) -> None:
    """A tiny policy lists the problems it was warmed up on; importing the published folder (as a
    shipped policy is imported) keeps that lineage, so warmup_problem_ids reads it from either."""
    train = _problem_shard(tmp_path / "train-00000.parquet", "train", 32, 0)
    test = _problem_shard(tmp_path / "test-00000.parquet", "test", 8, 1)
    config = bs.BootstrapConfig(**FAST, max_steps=20, target_accuracy_low=0.0, target_accuracy_high=1.0)
    made = bs.bootstrap_policy(tmp_path / "made", config, [str(train)], [str(test)])
    expected = set(schemas.read_shard(train, schemas.Problem).column("problem_id").to_pylist())
    assert bs.warmup_problem_ids(made) == expected
    imported = bs.bootstrap_policy(tmp_path / "imported", bs.BootstrapConfig(source=str(made)))
    info = checkpoints.read_info(imported)
    assert info.produced_by == "import"
    assert info.inputs["source_checkpoint"]["checkpoint_id"] == checkpoints.read_info(made).checkpoint_id
    assert bs.warmup_problem_ids(imported) == expected
    plain = tiny_policy.build_random_checkpoint(tmp_path / "hf-model", seed=3)
    (plain / checkpoints.METADATA_FILE).unlink()  # a model of unknown training data
    assert bs.warmup_problem_ids(bs.bootstrap_policy(tmp_path / "plain", bs.BootstrapConfig(source=str(plain)))) is None


def test_a_held_out_set_the_step0_policy_was_warmed_up_on_is_refused(tmp_path: Path) -> None:
    from workflows.driver import HeldOutSeenError, check_heldout_unseen

    train = _problem_shard(tmp_path / "train-00000.parquet", "train", 32, 0)
    test = _problem_shard(tmp_path / "test-00000.parquet", "test", 8, 1)
    config = bs.BootstrapConfig(**FAST, max_steps=20, target_accuracy_low=0.0, target_accuracy_high=1.0)
    made = bs.bootstrap_policy(tmp_path / "made", config, [str(train)], [str(test)])
    check_heldout_unseen(str(made), [str(test)])  # unseen: no error
    first = schemas.read_shard(train, schemas.Problem).to_pylist()[0]
    with pytest.raises(HeldOutSeenError, match=rf"warmed up on 32 of the 32 held-out problems.*{first['problem_id']}"):
        check_heldout_unseen(str(made), [str(train)])


def test_a_shipped_policy_is_named_and_an_unknown_name_lists_the_shipped_ones(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shipped = tmp_path / "policies"
    tiny_policy.build_random_checkpoint(shipped / "toy", seed=3)
    monkeypatch.setattr(bs, "SHIPPED_DIR", shipped)
    assert bs.resolve_source("shipped:toy") == str(shipped / "toy")
    assert bs.resolve_source("tiny") == "tiny" and bs.resolve_source("/some/folder") == "/some/folder"
    assert bs.source_folders("shipped:toy") == [str(shipped / "toy")] and bs.source_folders("tiny") == []
    out = bs.bootstrap_policy(tmp_path / "ckpt", bs.BootstrapConfig(source="shipped:toy"))
    assert checkpoints.read_info(out).inputs["source"] == str((shipped / "toy").resolve())
    with pytest.raises(bs.BootstrapError, match=r"no shipped policy 'nope'.*shipped:toy"):
        bs.resolve_source("shipped:nope")


def test_the_repository_ships_the_default_configs_step0_policy() -> None:
    """configs/tiny-cpu.yaml names a shipped policy: it must exist in the checkout and be complete."""
    from workflows.config import load_config

    source = load_config(Path(__file__).resolve().parents[2] / "configs" / "tiny-cpu.yaml").bootstrap.source
    assert source.startswith(bs.SHIPPED_PREFIX)
    folder = Path(bs.resolve_source(source))
    info = checkpoints.read_info(folder)
    assert info.step == 0 and bs.warmup_problem_ids(folder)
    assert checkpoints.weights_digest(folder) == info.checkpoint_id.rsplit("-", 1)[1]


def test_import_rejects_non_model_folder(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(bs.BootstrapError, match="config.json"):
        bs.bootstrap_policy(tmp_path / "out", bs.BootstrapConfig(source=str(tmp_path / "empty")))


def test_cli_reports_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    bootstrap_cli.add_arguments(parser)
    args = parser.parse_args(["--out", str(tmp_path / "x"), "--set", "no_such_field=1"])
    assert bootstrap_cli.run_cli(args) == 2
    assert "no_such_field" in capsys.readouterr().err


@pytest.mark.slow
def test_default_warm_up_lands_in_band(tmp_path: Path) -> None:
    # The default difficulty (2 terms, operands <= 20) and lr reach 20-50 % held-out greedy
    # accuracy well before max_steps (measured ~150-175 steps, 35 s on 1 thread).
    out = bs.bootstrap_policy(tmp_path / "ckpt", bs.BootstrapConfig(cpu_threads=1))
    warmup = checkpoints.read_info(out).inputs["warmup"]
    assert warmup["stop_reason"] == "in_band"
    assert 0.2 <= warmup["heldout_accuracy"] <= 0.5
