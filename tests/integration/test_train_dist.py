"""engines/train_dist.py: a CPU rank joins its gloo group without compiling any DeepSpeed op.

On a fresh machine DeepSpeed's CPU comm backend JIT-compiled ``deepspeed_shm_comm`` into the
torch extensions cache on the first ``init_distributed`` (~50 s quiet, 5 min on a loaded 2-core
machine: benchmarks/RESULTS.md), charged to the first training step. The rank here starts with
``TORCH_EXTENSIONS_DIR`` pointed at an empty folder (the shared cache is never touched) and must
leave it empty. That training numerics do not depend on the op is checked by
tests/integration/test_train.py (two ranks over gloo give the update of one process).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

JOIN = """
import torch.distributed as dist
from engines.train_dist import all_reduce_scalars, init_process
rank = init_process()
print("rank", rank, "sum", all_reduce_scalars([1.5, 2.0]), flush=True)
dist.destroy_process_group()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_cpu_rank_joins_without_building_the_shm_comm_op(tmp_path: Path) -> None:
    extensions = tmp_path / "torch_extensions"
    extensions.mkdir()
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(extensions), "DS_ACCELERATOR": "cpu", "CUDA_VISIBLE_DEVICES": "",
           "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(_free_port()), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    # 180 s: joining takes seconds; compiling the op took 50-300 s, so a regression fails either way
    proc = subprocess.run([sys.executable, "-c", JOIN], cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "rank 0 sum [1.5, 2.0]" in proc.stdout
    assert sorted(p.name for p in extensions.rglob("*")) == [], "a DeepSpeed op was JIT-compiled on join"
