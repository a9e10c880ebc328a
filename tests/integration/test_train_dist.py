"""engines/train_dist.py: a CPU rank joins its gloo group without compiling any DeepSpeed op.

On a fresh machine DeepSpeed's CPU comm backend JIT-compiled ``deepspeed_shm_comm`` into the
torch extensions cache on the first ``init_distributed`` (~50 s quiet, 5 min on a loaded 2-core
machine: benchmarks/RESULTS.md), charged to the first training step. The rank here starts with
``TORCH_EXTENSIONS_DIR`` pointed at an empty folder (the shared cache is never touched) and must
leave it empty. That training numerics do not depend on the op is checked by
tests/integration/test_train.py (two ranks over gloo give the update of one process).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from train_fixtures import run_single_rank  # noqa: E402

JOIN = """
import torch.distributed as dist
from engines.train_dist import all_reduce_scalars, init_process
rank = init_process()
print("rank", rank, "sum", all_reduce_scalars([1.5, 2.0]), flush=True)
dist.destroy_process_group()
"""


def test_a_cpu_rank_joins_without_building_the_shm_comm_op(tmp_path: Path) -> None:
    extensions = tmp_path / "torch_extensions"
    extensions.mkdir()
    # 180 s: joining takes seconds; compiling the op took 50-300 s, so a regression fails either way
    stdout = run_single_rank(JOIN, timeout_s=180, env={"TORCH_EXTENSIONS_DIR": str(extensions)})
    assert "rank 0 sum [1.5, 2.0]" in stdout
    assert sorted(p.name for p in extensions.rglob("*")) == [], "a DeepSpeed op was JIT-compiled on join"


BUILD_AFTER_PRELOAD = """
import json, sys
from engines.train_dist import init_process
from engines.train_engine import build_engine
from engines.train_spec import WorkerSpec
from engines.train_worker import _preload
from settings.train import TrainConfig
init_process()
_preload()
before = set(sys.modules)
spec = WorkerSpec(train=TrainConfig(), parent_checkpoint=sys.argv[1], resume_ds_state=None, steps=[],
                  out_dir="", metrics_path="", error_path="")
build_engine(spec, world_size=1)
print("NEW " + json.dumps(sorted(set(sys.modules) - before)), flush=True)
"""


def test_the_first_engine_build_after_the_preload_imports_no_compiler(tmp_path: Path) -> None:
    # A warm group imports before its first request (engines/train_worker.py: _preload) so that
    # the first step's engine build does not: deepspeed.initialize's ZeRO optimizer check imported
    # DeepSpeed's Muon optimizer, whose torch.compile decorators pull in torch._inductor and
    # torch._dynamo (1.2 of the first step's 1.5 s engine build on this 2-core machine).
    from engines.tiny_policy import build_random_checkpoint

    parent = build_random_checkpoint(tmp_path / "ck0", seed=0, num_layers=1, hidden_size=16, num_heads=2)
    stdout = run_single_rank(BUILD_AFTER_PRELOAD, str(parent), timeout_s=300)
    new = json.loads(next(line for line in stdout.splitlines() if line.startswith("NEW "))[4:])
    compiler = [m for m in new if m.startswith(("torch._inductor", "torch._dynamo", "deepspeed.runtime.zero.muon"))]
    assert compiler == [], f"imported by the first engine build: {compiler[:10]} ({len(compiler)})"
    assert len(new) < 100, new  # the model's own modules (here Qwen2's), not a library


JOIN_WITHOUT_MLFLOW = """
import sys
import torch.distributed as dist
from engines.train_dist import init_process
init_process()
print("deepspeed imported mlflow:", "mlflow" in sys.modules, flush=True)
import mlflow  # still importable afterwards (tracking.mlflow runs in the driver, not here)
print("mlflow importable:", mlflow.__name__ == "mlflow", flush=True)
dist.destroy_process_group()
"""


def test_a_rank_joins_without_importing_mlflow_which_stays_importable(tmp_path: Path) -> None:
    # DeepSpeed's autotuner imports mlflow whenever it is installed: ~1.3-2 s of every rank's start.
    import importlib.util

    if importlib.util.find_spec("mlflow") is None:
        pytest.skip("the mlflow client is not installed (scripts/setup.sh installs mlflow-skinny)")
    stdout = run_single_rank(JOIN_WITHOUT_MLFLOW, timeout_s=180)
    assert "deepspeed imported mlflow: False" in stdout, stdout
    assert "mlflow importable: True" in stdout, stdout
