"""The training stage on a CUDA GPU: torchrun, NCCL and DeepSpeed on the device, one rank.

Every other training test runs the DeepSpeed workers on the CPU over gloo. With a GPU,
engines/train/launch.py gives the workers ``DS_ACCELERATOR=cuda``, and each rank picks its GPU
(``torch.cuda.set_device``), joins an NCCL group and computes on ``rank_device()``
(engines/train/dist.py): a path the CPU suite never runs. Here it runs with world size 1 on the
tiny Qwen2 of tests/integration/test_train.py, whose reference step and helpers it reuses:

- an fp32 ZeRO-1 step on the GPU matches the plain-torch reference step computed on the CPU;
- its published checkpoint is complete, with the optimizer state DeepSpeed saved from the GPU;
- the workers compute fp32 matmuls in full fp32 (no TF32), which the tolerances above assume;
- a bf16 step exports a loadable bf16 checkpoint whose update is the fp32 step's, up to rounding;
- ZeRO-3 gives ZeRO-1's update;
- two steps on the warm worker group equal two cold launches bitwise (last: with ``-x`` a
  failure there hides none of the comparisons above).

Each configuration launches once (module-scoped fixtures, one launch per other test): five torchrun
launches and one import probe. Run from the checkout's root on a machine with a CUDA build of torch
and requirements.txt's DeepSpeed, transformers and pandera:

    python -m pytest tests/gpu -v -x --timeout 400 -p no:cacheprovider

Without a GPU every test skips, and the module imports nothing heavier than torch.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason="needs a CUDA GPU (run on a GPU machine: see the module docstring)"),
    pytest.mark.slow,
]

REPO = Path(__file__).resolve().parents[2]

if torch.cuda.is_available():
    # Seconds of imports (transformers, pandera, the engines): not paid where every test skips.
    sys.path.insert(0, str(REPO / "tests" / "integration"))
    from test_train import ATOL, CONFIG, _max_diff, _reference_step, _weights
    from train_fixtures import assert_published_whole, optimizer_state, random_batch, same_state, write_scored

    from engines.train import server as train_server
    from engines.bootstrap.tiny_policy import build_random_checkpoint
    from engines.train.launch import _worker_env, train_step
    from engines.train.spec import DS_STATE_DIR
    from settings.train import TrainConfig

LAUNCH_TIMEOUT_S = 300.0  # inside pytest's --timeout, so a hung launch fails with the workers' log tail
# GPU vs CPU, fp32 both (no TF32: see the probe below), so summation order only: test_train.py's
# bound for DeepSpeed vs the reference, ~6% of a typical update (~1.7e-3 per weight). On the CPU
# the two agree to the bit; here cuBLAS and the attention kernels sum in other orders.
REFERENCE_ATOL = 1e-4


def _config(**changes: Any) -> TrainConfig:
    """test_train.py's CONFIG (1 rank, fp32, ZeRO-1, warm workers) with ``changes``."""
    return replace(CONFIG, timeout_s=LAUNCH_TIMEOUT_S, **changes)


def _saved_devices(path: Path) -> set[str]:
    """The devices the tensors of a ``torch.save`` file were on when saved ("cuda:0", "cpu"), read
    without moving any there."""
    seen: set[str] = set()

    def record(storage: Any, location: str) -> Any:
        seen.add(location)
        return storage

    torch.load(path, map_location=record, weights_only=False)
    return seen


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """test_train.py's step-0 checkpoint and its two batches (step 1: 9 kept samples, one of them
    overlong-filtered, plus 2 rows dynamic sampling dropped; step 2: 8 samples)."""
    root = tmp_path_factory.mktemp("gpu-train")
    ck0 = build_random_checkpoint(root / "ck0", seed=0, num_layers=2, hidden_size=32, num_heads=2)
    vocab = json.loads((ck0 / "config.json").read_text())["vocab_size"]
    dropped = random_batch(9, 2, vocab=vocab, prefix="dropped")
    for row in dropped:
        row.update(kept=False, filter_reason="all_wrong", correct=False, rule_reward=-1.0, reward=-1.0, advantage=0.0)
    shard1 = write_scored(root / "batch1.parquet", random_batch(1, 9, vocab=vocab, masked=(3,)) + dropped)
    shard2 = write_scored(root / "batch2.parquet", random_batch(2, 8, vocab=vocab))
    return {"root": root, "ck0": ck0, "shard1": shard1, "shard2": shard2}


@pytest.fixture(scope="module")
def warm(inputs: dict[str, Any]) -> dict[str, Any]:
    """Steps 1 and 2 on the warm worker group (the default path): one launch, stopped after."""
    root, config = inputs["root"], _config()
    train_server.stop_active()  # the first step must start the group
    try:
        w1 = train_step(inputs["ck0"], [inputs["shard1"]], root / "w1", step=1, config=config)
        w2 = train_step(w1.checkpoint_dir, [inputs["shard2"]], root / "w2", step=2, config=config)
        group = train_server.active_group()
        history = list(group.history) if group is not None else []
    finally:
        train_server.stop_active()
    return {"w1": w1, "w2": w2, "history": history}


@pytest.fixture(scope="module")
def cold(inputs: dict[str, Any]) -> dict[str, Any]:
    """The same two steps, one launch each (``keep_workers_warm=False``)."""
    root, config = inputs["root"], _config(keep_workers_warm=False)
    c1 = train_step(inputs["ck0"], [inputs["shard1"]], root / "c1", step=1, config=config)
    c2 = train_step(c1.checkpoint_dir, [inputs["shard2"]], root / "c2", step=2, config=config)
    return {"c1": c1, "c2": c2}


def test_fp32_step_on_the_gpu_matches_the_plain_torch_reference(inputs: dict[str, Any], warm: dict[str, Any]) -> None:
    ref, norms = _reference_step(inputs["ck0"], inputs["shard1"], config=_config(), step=1)  # on the CPU
    metrics = warm["w1"].worker_metrics[0]
    assert (metrics["world_size"], metrics["updates"]) == (1, 2)
    assert metrics["grad_norms"] == pytest.approx(norms, rel=1e-4)
    got = _weights(warm["w1"].checkpoint_dir)
    assert _max_diff({k: got[k] for k in ref}, ref) < REFERENCE_ATOL
    assert _max_diff({k: got[k] for k in ref}, _weights(inputs["ck0"])) > 1e-3  # it did move


def test_the_step_publishes_a_complete_checkpoint_and_the_optimizer_state_from_the_gpu(
        inputs: dict[str, Any], warm: dict[str, Any]) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    w1 = warm["w1"]
    folder = assert_published_whole(w1.checkpoint_dir, w1.checkpoint_id, inputs["ck0"], step=1)
    assert (w1.metrics["samples"], w1.metrics["masked_samples"]) == (9, 1)

    state = optimizer_state(folder)
    (optim_file,) = [name for name in state if name.endswith("optim_states.pt")]  # one rank
    optim = state[optim_file]
    assert float(optim["base"]["state"][0]["step"]) == 2.0 and state["lr_scheduler"]["last_epoch"] == 2
    assert bool(optim["base"]["state"][0]["exp_avg_sq"].gt(0).any())
    # The saved fp32 master weights are the published ones, flattened in the model's parameter order.
    with torch.device("meta"):
        names = [n for n, _ in AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder)).named_parameters()]
    weights = _weights(folder)
    flat = torch.cat([weights[n].flatten() for n in names])
    (master,) = optim["fp32"]
    assert master.numel() >= flat.numel() and torch.equal(master[: flat.numel()], flat)
    # DeepSpeed saved the optimizer partitions from the GPU: the step ran there.
    tag = (folder / DS_STATE_DIR / "latest").read_text().strip()
    assert "cuda:0" in _saved_devices(folder / DS_STATE_DIR / tag / optim_file)


_TF32_PROBE = """
import json
import torch
from engines.train.dist import import_deepspeed
import_deepspeed()  # what a worker imports before it builds its engine
import engines.train.worker  # noqa: F401
from transformers import AutoModelForCausalLM  # noqa: F401
from transformers.models.qwen2 import modeling_qwen2  # noqa: F401


def read(get):
    try:
        return get()
    except RuntimeError as err:  # torch refuses to answer when the legacy and new TF32 APIs were mixed
        return f"error: {err}"


print("TF32", json.dumps({"allow_tf32": read(lambda: torch.backends.cuda.matmul.allow_tf32),
                          "matmul_precision": read(torch.get_float32_matmul_precision)}))
"""


def test_workers_compute_fp32_matmuls_without_tf32() -> None:
    """The fp32 tolerances assume cuBLAS computes fp32 matmuls in fp32. TF32 (10-bit mantissa) is
    torch's default off, and neither the product, DeepSpeed nor transformers' model code turns it on;
    a process with a worker's environment (which could set TORCH_ALLOW_TF32_CUBLAS_OVERRIDE) and
    its imports must see it off."""
    proc = subprocess.run([sys.executable, "-c", _TF32_PROBE], cwd=REPO, env=_worker_env(1), capture_output=True,
                          text=True, timeout=LAUNCH_TIMEOUT_S)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("TF32 ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert json.loads(lines[0].split(" ", 1)[1]) == {"allow_tf32": False, "matmul_precision": "highest"}


def test_bf16_step_exports_a_loadable_bf16_checkpoint_close_to_the_fp32_step(
        inputs: dict[str, Any], warm: dict[str, Any], tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    config = _config(precision="bf16", keep_workers_warm=False)
    res = train_step(inputs["ck0"], [inputs["shard1"]], tmp_path / "bf16", step=1, config=config)
    assert all(v.dtype == torch.bfloat16 for v in _weights(res.checkpoint_dir).values())
    assert AutoModelForCausalLM.from_pretrained(res.checkpoint_dir).dtype == torch.bfloat16
    # bf16 rounding only (test_train.py's bounds: ~0.997 and ~0.08 on the CPU): the update is
    # ~2e-3 per weight, so the error is measured against it; a zeroed update gives cosine 0 and
    # relative error 1, a sign-flipped one cosine -1.
    w0 = _weights(inputs["ck0"])
    delta_fp32 = torch.cat([(w.float() - w0[k]).flatten() for k, w in _weights(warm["w1"].checkpoint_dir).items()])
    delta_bf16 = torch.cat([(w.float() - w0[k]).flatten() for k, w in _weights(res.checkpoint_dir).items()])
    assert float(torch.nn.functional.cosine_similarity(delta_bf16, delta_fp32, dim=0)) > 0.95
    assert float((delta_bf16 - delta_fp32).norm()) < 0.25 * float(delta_fp32.norm())


def test_zero3_on_one_rank_gives_the_zero1_update(inputs: dict[str, Any], warm: dict[str, Any], tmp_path: Path) -> None:
    config = _config(zero_stage=3, keep_workers_warm=False)
    res = train_step(inputs["ck0"], [inputs["shard1"]], tmp_path / "zero3", step=1, config=config)
    assert res.worker_metrics[0]["grad_norms"] == pytest.approx(warm["w1"].worker_metrics[0]["grad_norms"], rel=1e-5)
    assert _max_diff(_weights(warm["w1"].checkpoint_dir), _weights(res.checkpoint_dir)) < ATOL


def test_two_warm_steps_equal_two_cold_steps_bitwise(warm: dict[str, Any], cold: dict[str, Any]) -> None:
    """As on the CPU (test_train.py: test_warm_steps_equal_cold_steps_bitwise): the same kernels on
    the same shapes, so a step continued in memory and one rebuilt from disk agree to the bit."""
    assert warm["history"] == ["reloaded", "continued"]
    assert (warm["w1"].timings["warm_group"], warm["w2"].timings["continued_in_memory"]) == (1.0, 1.0)
    for step in (1, 2):
        w, c = warm[f"w{step}"], cold[f"c{step}"]
        assert c.timings["warm_group"] == 0.0
        max_diff = _max_diff(_weights(w.checkpoint_dir), _weights(c.checkpoint_dir))
        assert max_diff == 0.0, f"step {step}: warm and cold weights differ by up to {max_diff:.3g}"
        assert w.checkpoint_id == c.checkpoint_id  # the id digests the weight bytes
        assert w.worker_metrics[0]["grad_norms"] == c.worker_metrics[0]["grad_norms"], step
        assert same_state(optimizer_state(w.checkpoint_dir), optimizer_state(c.checkpoint_dir)) == [], step
