"""``dapo run --plan``: the shared-GPU memory plan of a local run (infra/sizing.py: plan_shared_gpu),
printed without running, and the same plan refusing a local CUDA run that cannot fit, before any work.

configs/one-gpu.yaml names a model folder (/models/...) and data files (/data/...) that this machine
lacks: the plan reads only the model's config.json, so the tests point ``bootstrap.source`` at the
Qwen2.5-0.5B config.json carried in tests/data/model_configs, and the data paths stay as they are
(a plan-only dry run does not read them)."""

from __future__ import annotations

import subprocess
import sys
import time
from argparse import Namespace
from pathlib import Path

import pytest

from infra import model_shape, sizing
from cli import run as run_command
from workflows import local_run
from workflows.config import load_config

REPO = Path(__file__).resolve().parents[2]
ONE_GPU = REPO / "configs" / "one-gpu.yaml"
QWEN_05B = REPO / "tests" / "data" / "model_configs" / "Qwen2.5-0.5B"
SOURCE = f"bootstrap.source={QWEN_05B}"


def _dapo_run(*argv: str, cwd: Path = REPO) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "cli.main", "run", *argv], cwd=cwd, capture_output=True,
                          text=True, timeout=120)
    return proc, time.perf_counter() - started


def _expected(gpu_gb: float, *overrides: str) -> sizing.SharedGpuPlan:
    """The plan sizing computes for one-gpu.yaml, its fields unpacked here by hand."""
    config = load_config(ONE_GPU, [SOURCE, *overrides])
    rollout, train = config.rollout, config.train
    return sizing.plan_shared_gpu(
        model_shape.load_architecture(QWEN_05B), zero_stage=train.zero_stage,
        micro_batch_samples=train.micro_batch_samples, tokens_per_sequence=rollout.max_model_len,
        samples_per_prompt=rollout.samples_per_prompt, train_processes=train.num_processes,
        gpu_memory_bytes=int(gpu_gb * sizing.GB), gpu_memory_utilization=rollout.gpu_memory_utilization,
        engine_sleeps=rollout.sleep_between_rounds and not config.run.pipelined,
        logprob_chunk_tokens=train.logprob_chunk_tokens, precision=train.precision,
    )


@pytest.mark.parametrize("gpu_gb", [80, 24])
def test_the_one_gpu_config_prints_its_plan_for_80_and_24_gb(gpu_gb: int, tmp_path: Path) -> None:
    proc, _ = _dapo_run("--config", str(ONE_GPU), "--set", SOURCE, "--plan", "--gpu-memory-gb", str(gpu_gb),
                        "--run-root", str(tmp_path / "runs"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert sizing.format_shared_plan(_expected(gpu_gb)) in proc.stdout
    assert f"on one {gpu_gb} GB GPU" in proc.stdout and "engine asleep" in proc.stdout
    assert not (tmp_path / "runs").exists()  # a plan runs nothing and writes nothing


def test_a_shared_gpu_without_sleep_that_exceeds_the_card_is_refused_in_one_line(tmp_path: Path) -> None:
    overrides = ["rollout.sleep_between_rounds=false", "rollout.gpu_memory_utilization=0.6"]
    with pytest.raises(sizing.PlanDoesNotFit) as expected:
        _expected(24, *overrides)
    argv = ["--config", str(ONE_GPU), "--set", SOURCE, *[a for o in overrides for a in ("--set", o)]]
    proc, _ = _dapo_run(*argv, "--plan", "--gpu-memory-gb", "24", "--run-root", str(tmp_path / "runs"))
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"dapo run: {expected.value}"
    assert "vLLM engine awake" in proc.stderr and "rollout.sleep_between_rounds=true" in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_the_1_5b_math_model_does_not_fit_24_gb_and_says_why() -> None:
    """The config's comment: a 1.5B model (Qwen2.5-Math-1.5B's shape) does not fit 24 GB; 80 GB holds it."""
    math_15b = sizing.ModelArchitecture(name="Qwen2.5-Math-1.5B", layers=28, hidden_size=1536, query_heads=12,
                                        kv_heads=2, head_dim=128, intermediate_size=8960, vocab_size=151936,
                                        tied_embeddings=True, qkv_bias=True, nominal_params=1_540_000_000)
    config = load_config(ONE_GPU, [SOURCE])
    kwargs = dict(zero_stage=1, micro_batch_samples=1, tokens_per_sequence=config.rollout.max_model_len,
                  samples_per_prompt=config.rollout.samples_per_prompt, train_processes=1,
                  gpu_memory_utilization=config.rollout.gpu_memory_utilization, engine_sleeps=True,
                  logprob_chunk_tokens=config.train.logprob_chunk_tokens)
    with pytest.raises(sizing.PlanDoesNotFit, match=r"\(optimizer state 18.5 GB\).*a GPU with more memory"):
        sizing.plan_shared_gpu(math_15b, gpu_memory_bytes=24 * sizing.GB, **kwargs)
    assert sizing.plan_shared_gpu(math_15b, gpu_memory_bytes=80 * sizing.GB, **kwargs).peak_bytes <= 72 * sizing.GB


def test_plan_without_a_gpu_or_its_memory_is_refused(tmp_path: Path) -> None:
    proc, _ = _dapo_run("--config", str(ONE_GPU), "--set", SOURCE, "--plan", "--run-root", str(tmp_path / "runs"))
    if proc.returncode == 0:
        pytest.skip("this machine has a CUDA GPU: the plan used its memory")
    assert proc.returncode == 2 and "--gpu-memory-gb" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_the_tiny_policy_needs_no_gpu_plan(tmp_path: Path) -> None:
    proc, _ = _dapo_run("--plan", "--gpu-memory-gb", "24", "--run-root", str(tmp_path / "runs"))
    assert proc.returncode == 0 and "no GPU memory plan" in proc.stdout


def _args(tmp_path: Path, *overrides: str) -> Namespace:
    return Namespace(config=str(ONE_GPU), set=[SOURCE, *overrides], run_root=str(tmp_path / "runs"), verbose=False,
                     plan=False, gpu_memory_gb=0.0)


def test_a_local_cuda_run_that_cannot_fit_is_refused_before_any_work(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """On a CUDA host (faked: a 24 GB GPU) the plan runs first: refused, exit 2, before curation and
    before the run folder exists. The data files exist here (a plan-only check does not need them; a
    run checks them first)."""
    data = tmp_path / "problems.parquet"
    data.write_bytes(b"")
    monkeypatch.setattr(local_run, "local_cuda", lambda: (1, 24 * sizing.GB))
    monkeypatch.setattr(local_run, "check_input_paths", lambda config: None)
    monkeypatch.setattr(local_run, "run_pipeline", lambda *a, **k: pytest.fail("the run started"))
    assert run_command.run_cli(_args(tmp_path, "rollout.gpu_memory_utilization=0.85")) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dapo run: shared GPU during rollout needs ") and "\n" not in err
    assert not (tmp_path / "runs").exists()


def test_a_local_cuda_run_with_more_ranks_than_gpus_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(local_run, "local_cuda", lambda: (1, 80 * sizing.GB))
    monkeypatch.setattr(local_run, "check_input_paths", lambda config: None)
    monkeypatch.setattr(local_run, "run_pipeline", lambda *a, **k: pytest.fail("the run started"))
    assert run_command.run_cli(_args(tmp_path, "train.num_processes=2")) == 2
    assert "train.num_processes=2" in capsys.readouterr().err


def test_no_plan_is_checked_without_cuda(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU machine (the tests' own) plans nothing on a run: the memory is the host's."""
    monkeypatch.setattr(local_run, "local_cuda", lambda: (0, 0))
    config = load_config(ONE_GPU, [SOURCE, "rollout.gpu_memory_utilization=0.99"])
    assert local_run.check_local_gpu_plan(config) is None


def test_the_figures_in_the_config_comments_are_the_plans() -> None:
    """configs/one-gpu.yaml quotes each dry run's peak: the figures must be what sizing computes."""
    import re

    quoted = re.findall(r"--gpu-memory-gb (\d+) +# ([\d.]+) GB peak of ([\d.]+) usable", ONE_GPU.read_text())
    assert sorted(int(gb) for gb, _, _ in quoted) == [24, 80]
    for gb, peak, usable in quoted:
        plan = _expected(int(gb))
        assert (f"{plan.peak_bytes / sizing.GB:.1f}", f"{plan.usable_bytes / sizing.GB:.1f}") == (peak, usable)


def test_pipelined_steps_count_the_engine_awake_while_the_ranks_train() -> None:
    """Pipelined, step N+1's rounds generate while step N trains: the engine cannot sleep then."""
    synchronous = local_run.shared_gpu_plan(load_config(ONE_GPU, [SOURCE]), 80 * sizing.GB)
    pipelined = local_run.shared_gpu_plan(load_config(ONE_GPU, [SOURCE, "run.pipelined=true"]), 80 * sizing.GB)
    assert synchronous.engine_sleeps and not pipelined.engine_sleeps
    assert any(t.name.startswith("vLLM engine awake") for t in pipelined.train_terms)
    assert not any(t.name.startswith("vLLM engine awake") for t in synchronous.train_terms)


def test_the_plan_follows_train_precision(tmp_path: Path) -> None:
    # fp32 weights and activations are twice bf16's: the printed plan must be fp32's (before: bf16's).
    proc, _ = _dapo_run("--config", str(ONE_GPU), "--set", SOURCE, "--set", "train.precision=fp32", "--plan",
                        "--gpu-memory-gb", "80", "--run-root", str(tmp_path / "runs"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    fp32 = _expected(80, "train.precision=fp32")
    assert fp32 != _expected(80) and sizing.format_shared_plan(fp32) in proc.stdout
