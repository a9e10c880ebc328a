"""Optimizer state and the LR schedule across steps (issue 45): what a step trusts, and where it starts.

- An import (``bootstrap.source``) takes weights, config and tokenizer only: never a folder's
  ``ds_state/``, whose pickles DeepSpeed would unpickle at step 1.
- A step resumes a checkpoint's optimizer state only when the checkpoint's digest record vouches
  for it; ``dapo train`` on an unrecorded one refuses in one line (exit 2) before any worker.
- Every load of DeepSpeed's state goes through torch's weights-only unpickler.
- Where the LR warm-up starts: the parent's recorded update count, whether or not its optimizer
  state is resumed; a step>0 parent whose state is asked for but missing is refused.

The pickles here are real attacks: their ``__reduce__`` creates a marker file; it must never appear.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engines.bootstrap import stage as bs
from engines.bootstrap.tiny_policy import build_random_checkpoint
from settings.checks import FieldError
from settings.train import TrainConfig
from storage import checkpoints, digests
from tests.crafted_checkpoints import MarkerPayload, add_malicious_state, as_train_checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from train_fixtures import random_batch, write_scored  # noqa: E402


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny published step-0 checkpoint to copy from."""
    return build_random_checkpoint(tmp_path_factory.mktemp("model") / "ck0", seed=0, num_layers=1, hidden_size=32,
                                   num_heads=2)


def _copy(model: Path, to: Path) -> Path:
    shutil.copytree(model, to)
    return to


# --------------------------------------------------------------------------- import


@pytest.mark.parametrize("link", [False, True])
def test_an_import_takes_weights_config_and_tokenizer_only(model: Path, tmp_path: Path, link: bool) -> None:
    source = _copy(model, tmp_path / "downloaded")
    (source / checkpoints.METADATA_FILE).unlink()  # a plain HF folder
    marker = tmp_path / "pwned"
    add_malicious_state(source, marker)
    torch.save({"w": MarkerPayload(marker)}, source / "pytorch_model.bin")  # pickled weights: never taken either
    (source / "modeling_evil.py").write_text("raise SystemExit('remote code')\n")
    out = bs.bootstrap_policy(tmp_path / "step-0000", bs.BootstrapConfig(source=str(source), link_import=link))
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [checkpoints.METADATA_FILE, "config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
         "tokenizer_config.json"])
    assert not marker.exists()


# --------------------------------------------------------------------------- unpickling


def test_the_payload_runs_under_a_full_unpickle_and_never_under_the_weights_only_one(tmp_path: Path) -> None:
    from engines.train.checkpoint import weights_only_unpickling

    state = add_malicious_state(tmp_path / "ck", tmp_path / "pwned")
    payload = state / "step000001" / "mp_rank_00_model_states.pt"
    with weights_only_unpickling(), pytest.raises(Exception, match="Weights only load failed"):
        torch.load(payload, weights_only=False)  # what DeepSpeed asks for
    assert not (tmp_path / "pwned").exists()
    torch.load(payload, weights_only=False)  # the attack is real: a plain load runs it
    assert (tmp_path / "pwned").exists()


def test_the_weights_only_unpickler_loads_deepspeeds_own_records(tmp_path: Path) -> None:
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    from engines.train.checkpoint import weights_only_unpickling

    saved = {"loss_scaler": LossScaler(1.0), "zero_stage": ZeroStageEnum.optimizer_states,
             "address": fragment_address(numel=4, start=0), "moments": [torch.ones(3)]}
    torch.save(saved, tmp_path / "optim_states.pt", _use_new_zipfile_serialization=False)
    with weights_only_unpickling():
        loaded = torch.load(tmp_path / "optim_states.pt", weights_only=False)
    assert loaded["zero_stage"] is ZeroStageEnum.optimizer_states and loaded["address"] == saved["address"]
    assert loaded["loss_scaler"].cur_scale == 1.0 and torch.equal(loaded["moments"][0], torch.ones(3))
    assert "TORCH_FORCE_WEIGHTS_ONLY_LOAD" not in os.environ  # left as it was


# --------------------------------------------------------------------------- the digest record


def test_only_state_that_the_digest_record_vouches_for_is_resumed(model: Path, tmp_path: Path) -> None:
    from engines.train.checkpoint import resumes_optimizer_state

    ck = as_train_checkpoint(_copy(model, tmp_path / "step-0001"))
    add_malicious_state(ck, tmp_path / "pwned")
    assert checkpoints.unvouched_optimizer_state(ck) == [f"{ck}: no digest record ({ck}.sha256.json) vouches for its ds_state/"]
    assert not resumes_optimizer_state(ck, resume_optimizer=True)
    digests.record(ck)  # as the pipeline records what it publishes
    assert checkpoints.unvouched_optimizer_state(ck) == []
    assert resumes_optimizer_state(ck, resume_optimizer=True)
    assert not resumes_optimizer_state(ck, resume_optimizer=False)
    # Tampered after the record: the same size, other bytes; and a file the record does not name.
    optim = ck / "ds_state" / "step000001" / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    data = bytearray(optim.read_bytes())
    data[-1] ^= 1
    optim.write_bytes(bytes(data))
    (ck / "ds_state" / "step000001" / "extra.pt").write_bytes(b"x")
    problems = checkpoints.unvouched_optimizer_state(ck)
    assert problems == [f"{optim.parent / 'extra.pt'}: not in the digest record {ck}.sha256.json",
                        f"{optim}: sha256 differs from the one recorded in {ck}.sha256.json"]
    assert not resumes_optimizer_state(ck, resume_optimizer=True)
    assert not (tmp_path / "pwned").exists()


def test_a_step0_policy_never_resumes_optimizer_state_even_recorded(model: Path, tmp_path: Path) -> None:
    # A run folder imported before imports left ds_state/ out holds one, vouched for by its record.
    from engines.train.checkpoint import resumes_optimizer_state

    ck = _copy(model, tmp_path / "step-0000")
    add_malicious_state(ck, tmp_path / "pwned")
    digests.record(ck)
    assert not resumes_optimizer_state(ck, resume_optimizer=True)


def _dapo_train(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    from cli import train as train_cli

    parser = argparse.ArgumentParser()
    train_cli.add_arguments(parser)
    rc = train_cli.run_cli(parser.parse_args(argv))
    return rc, capsys.readouterr().err


def test_dapo_train_on_an_unrecorded_checkpoint_refuses_to_resume_its_state(
        model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "pwned"
    ck = as_train_checkpoint(_copy(model, tmp_path / "downloaded-step-0001"), optimizer_updates=2)
    add_malicious_state(ck, marker)
    vocab = json.loads((ck / "config.json").read_text())["vocab_size"]
    shard = write_scored(tmp_path / "batch.parquet", random_batch(2, 4, vocab=vocab))
    rc, err = _dapo_train([str(ck), str(shard), "--out", str(tmp_path / "out"), "--step", "2"], capsys)
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and str(ck) in lines[0] and "train.resume_optimizer=false" in lines[0], err
    assert "no digest record" in lines[0]
    assert not marker.exists() and not (tmp_path / "out").exists()
    assert not list(tmp_path.glob(".out.staging-*"))


# --------------------------------------------------------------------------- where the schedule starts


def _launch_parent(model: Path, folder: Path, *, optimizer_updates: int | None, state: bool) -> Path:
    ck = as_train_checkpoint(_copy(model, folder), step=3, optimizer_updates=optimizer_updates)
    if state:
        add_malicious_state(ck, folder.parent / "pwned", updates_done=6, step=3)
    return ck


WARM = TrainConfig(updates_per_step=2, warmup_steps=5)


def test_the_schedule_starts_at_the_parents_recorded_update_count(model: Path, tmp_path: Path) -> None:
    from engines.train.launch import schedule_start

    fresh = replace(WARM, resume_optimizer=False)
    assert schedule_start(model, config=WARM, resume=False) == 0  # a step-0 policy
    recorded = _launch_parent(model, tmp_path / "recorded", optimizer_updates=6, state=False)
    assert schedule_start(recorded, config=fresh, resume=False) == 6
    # Written before the count was recorded: its optimizer state's record holds it.
    legacy = _launch_parent(model, tmp_path / "legacy", optimizer_updates=None, state=True)
    assert schedule_start(legacy, config=fresh, resume=False) == 6
    assert not (tmp_path / "pwned").exists()  # read from the JSON beside the pickles


def test_an_unknown_count_is_refused_only_where_a_warm_up_needs_it(model: Path, tmp_path: Path) -> None:
    from engines.train.launch import TrainInputError, schedule_start

    legacy = _launch_parent(model, tmp_path / "legacy", optimizer_updates=None, state=False)
    with pytest.raises(TrainInputError, match=rf"{legacy} \(step 3\) was written before .*\(train.warmup_steps=5\)"):
        schedule_start(legacy, config=replace(WARM, resume_optimizer=False), resume=False)
    assert schedule_start(legacy, config=replace(WARM, resume_optimizer=False, warmup_steps=0), resume=False) == 0


def test_a_parent_without_the_state_asked_for_is_refused_in_one_line(model: Path, tmp_path: Path) -> None:
    from engines.train.launch import TrainInputError, schedule_start

    pruned = _launch_parent(model, tmp_path / "step-0003", optimizer_updates=6, state=False)
    with pytest.raises(TrainInputError) as refused:
        schedule_start(pruned, config=WARM, resume=False)
    line = str(refused.value)
    assert "\n" not in line and str(pruned) in line and "has no optimizer state" in line
    assert "train.resume_optimizer=true" in line and "train.resume_optimizer=false" in line
    unrecorded = _launch_parent(model, tmp_path / "other" / "step-0003", optimizer_updates=6, state=True)
    with pytest.raises(TrainInputError, match="no digest record"):
        schedule_start(unrecorded, config=WARM, resume=False)


def test_keeping_no_optimizer_state_while_resuming_it_is_refused_when_the_config_is_built() -> None:
    with pytest.raises(FieldError, match="keep_optimizer_state=False leaves nothing to resume: set resume_optimizer=false"):
        TrainConfig(keep_optimizer_state=False)
    assert TrainConfig(keep_optimizer_state=False, resume_optimizer=False).optimizer_updates_per_step == 1


@settings(max_examples=60, deadline=None)
@given(warmup=st.integers(0, 12), start=st.integers(0, 30), more=st.integers(1, 8))
def test_a_schedule_started_at_n_updates_goes_on_as_one_stepped_n_times(warmup: int, start: int, more: int) -> None:
    from engines.train.engine import warmup_lr_factor, warmup_scheduler

    def lrs(updates_done: int, steps: int, skip: int) -> list[float]:
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.5)
        sched = warmup_scheduler(opt, warmup_updates=warmup, updates_done=updates_done)
        seen = []
        for i in range(skip + steps):
            if i >= skip:
                seen.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
        return seen

    continued = lrs(0, more, skip=start)
    started = lrs(start, more, skip=0)
    assert started == continued == [0.5 * warmup_lr_factor(u, warmup) for u in range(start, start + more)]
