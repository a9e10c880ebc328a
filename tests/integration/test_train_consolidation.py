"""engines/train/checkpoint.py: full_fp32_state, the weights the HF export writes after a step.

Plain fp32 under ZeRO 1/2 reads the module's own parameters, which DeepSpeed refills from the
optimizer's fp32 master partitions after every update: bit-equal to the master, with no
collective. bf16 and ZeRO-3 must gather the master copy (one collective per parameter). Each case
runs in a rank of its own (a gloo group of one) and reports how many collectives the
consolidation called and whether every tensor equals DeepSpeed's own full fp32 parameter.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from train_fixtures import run_single_rank  # noqa: E402

CONSOLIDATE = """
import json, sys
import torch
import torch.distributed as dist
from engines.train.checkpoint import full_fp32_state
from engines.train.dist import init_process
from engines.train.engine import build_engine
from engines.train.spec import WorkerSpec
from settings.train import TrainConfig

rank = init_process()
from deepspeed.utils import safe_get_full_fp32_param
train = TrainConfig(precision=sys.argv[2], zero_stage=int(sys.argv[3]), lr=1e-2)
spec = WorkerSpec(train=train, parent_checkpoint=sys.argv[1], resume_ds_state=None, steps=[],
                  out_dir="", metrics_path="", error_path="")
engine, _ = build_engine(spec, world_size=1)
before = {n: p.detach().float().clone() for n, p in engine.module.named_parameters()}
ids = torch.randint(0, 16, (2, 8))
engine.backward(engine(input_ids=ids, labels=ids).loss)
engine.step()

calls = []
for name in ("all_reduce", "all_gather", "all_gather_into_tensor", "broadcast", "reduce_scatter_tensor"):
    original = getattr(dist, name)
    def counted(*args, _original=original, _name=name, **kwargs):
        calls.append(_name)
        return _original(*args, **kwargs)
    setattr(dist, name, counted)
state = full_fp32_state(engine, rank=rank)
collectives = len(calls)
reference = {n: safe_get_full_fp32_param(p) for n, p in engine.module.named_parameters()}
reference = {n: (r if r is not None else p.detach()).float() for (n, r), p in zip(reference.items(), engine.module.parameters())}
print("RESULT " + json.dumps({
    "collectives": collectives,
    "names_match": sorted(state) == sorted(reference),
    "equal_to_master": all(torch.equal(state[n], reference[n]) for n in reference),
    "dtype_fp32": all(t.dtype == torch.float32 for t in state.values()),
    "updated": any(not torch.equal(state[n], before[n]) for n in before),
}), flush=True)
"""


@pytest.fixture(scope="module")
def parent(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from engines.bootstrap.tiny_policy import build_random_checkpoint

    return build_random_checkpoint(tmp_path_factory.mktemp("ck0") / "ck0", seed=0, num_layers=1, hidden_size=16,
                                   num_heads=2)


def _consolidate(parent: Path, precision: str, zero_stage: int) -> dict:
    stdout = run_single_rank(CONSOLIDATE, str(parent), precision, str(zero_stage), timeout_s=300)
    return json.loads(next(line for line in stdout.splitlines() if line.startswith("RESULT "))[7:])


@pytest.mark.parametrize("zero_stage", [1, 2])
def test_fp32_zero_1_and_2_read_the_updated_weights_without_a_collective(parent: Path, zero_stage: int) -> None:
    result = _consolidate(parent, "fp32", zero_stage)
    assert result["updated"], "the update changed no weight: the check below would prove nothing"
    assert result["names_match"] and result["dtype_fp32"]
    assert result["equal_to_master"], "the module's weights differ from DeepSpeed's fp32 master"
    assert result["collectives"] == 0, f"{result['collectives']} collectives to read weights the module holds"


def test_bf16_gathers_the_fp32_master(parent: Path) -> None:
    result = _consolidate(parent, "bf16", 1)
    assert result["updated"] and result["names_match"] and result["dtype_fp32"]
    assert result["equal_to_master"], "bf16 exported the module's rounded weights, not the fp32 master"
    assert result["collectives"] > 0
