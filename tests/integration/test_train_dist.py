"""engines/train/dist.py: a CPU rank joins its gloo group without compiling any DeepSpeed op.

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
from engines.train.dist import all_reduce_scalars, init_process
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
from engines.train.dist import init_process
from engines.train.engine import build_engine
from engines.train.spec import WorkerSpec
from engines.train.worker import _preload
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
    # A warm group imports before its first request (engines/train/worker.py: _preload) so that
    # the first step's engine build does not: deepspeed.initialize's ZeRO optimizer check imported
    # DeepSpeed's Muon optimizer, whose torch.compile decorators pull in torch._inductor and
    # torch._dynamo (1.2 of the first step's 1.5 s engine build on this 2-core machine).
    from engines.bootstrap.tiny_policy import build_random_checkpoint

    parent = build_random_checkpoint(tmp_path / "ck0", seed=0, num_layers=1, hidden_size=16, num_heads=2)
    stdout = run_single_rank(BUILD_AFTER_PRELOAD, str(parent), timeout_s=300)
    new = json.loads(next(line for line in stdout.splitlines() if line.startswith("NEW "))[4:])
    compiler = [m for m in new if m.startswith(("torch._inductor", "torch._dynamo", "deepspeed.runtime.zero.muon"))]
    assert compiler == [], f"imported by the first engine build: {compiler[:10]} ({len(compiler)})"
    assert len(new) < 100, new  # the model's own modules (here Qwen2's), not a library


JOIN_WITHOUT_MLFLOW = """
import sys
import torch.distributed as dist
from engines.train.dist import init_process
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


# ----------------------------------------------------------------------------- the one-node rendezvous

HOLD = """
import pathlib, sys, time
import torch.distributed as dist
from engines.train.dist import all_reduce_scalars, init_process
rank = init_process()
total = all_reduce_scalars([1.0])
pathlib.Path(sys.argv[1], f"ready-{rank}").write_text(str(total))
while not pathlib.Path(sys.argv[1], "done").exists():
    time.sleep(0.05)
dist.destroy_process_group()
"""


def _listening(pids: list[int]) -> list[str]:
    """``host:port`` of every TCP socket the processes ``pids`` listen on (Linux /proc)."""
    import os

    inodes = set()
    for pid in pids:
        try:
            links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            continue  # exited meanwhile
        inodes.update(link[len("socket:["):-1] for link in links if link.startswith("socket:["))
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                found.append(_address(fields[1]))
    return found


def _address(hex_address: str) -> str:
    import ipaddress

    host, port = hex_address.split(":")
    raw = bytes.fromhex(host)
    # /proc prints the address as 32-bit words in host (little-endian) order
    ordered = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return f"{ipaddress.ip_address(ordered)}:{int(port, 16)}"


def test_single_node_launch_names_the_loopback_address() -> None:
    from engines.train.dist import LOOPBACK, single_node_launch

    command = single_node_launch(2)
    assert LOOPBACK == "127.0.0.1"
    assert "--rdzv-endpoint=127.0.0.1:0" in command and "--local-addr=127.0.0.1" in command
    assert "--standalone" not in command  # its rendezvous is "localhost:0" on the wildcard address
    assert "--rdzv-endpoint=10.0.0.5:0" in single_node_launch(2, host="10.0.0.5")  # a parameter, not a constant


def test_a_one_node_group_listens_on_the_loopback_address_only(tmp_path: Path) -> None:
    # torchrun --standalone's rendezvous store and its agent's store for the ranks listened on the
    # wildcard address (`*:port`): reachable from any machine on the network during a step.
    import os
    import subprocess
    import time

    from engines.runtime.processes import process_tree
    from engines.train.dist import single_node_launch
    from engines.train.server import REPO_ROOT

    script = tmp_path / "hold.py"
    script.write_text(HOLD)
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(REPO_ROOT)}
    with (tmp_path / "log.txt").open("wb") as log:
        proc = subprocess.Popen([*single_node_launch(2), f"--log-dir={tmp_path / 'torchelastic'}", str(script), str(tmp_path)],
                                cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while not all((tmp_path / f"ready-{rank}").exists() for rank in (0, 1)):
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "log.txt").read_text()[-3000:]
            time.sleep(0.1)
        assert (tmp_path / "ready-1").read_text() == "[2.0]"  # the two ranks formed one group
        listening = _listening(process_tree(proc.pid))
        (tmp_path / "done").write_text("")
        assert proc.wait(timeout=60) == 0, (tmp_path / "log.txt").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    assert listening, "no listening socket found (the rendezvous store listens during the step)"
    assert [a for a in listening if not a.startswith(("127.0.0.1:", "::1:", "::ffff:127.0.0.1:"))] == [], listening


def test_a_loopback_group_keeps_nccl_and_gloo_on_the_loopback_interface(monkeypatch: pytest.MonkeyPatch) -> None:
    # On an H200 machine NCCL's bootstrap listened on the machine's network address (192.0.2.2:*)
    # for a one-node group until NCCL_SOCKET_IFNAME named the loopback interface.
    import os

    from engines.train.dist import keep_collectives_on_loopback

    for variable in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
        monkeypatch.delenv(variable, raising=False)
    keep_collectives_on_loopback("10.0.0.5")  # a cluster address: its interfaces are the cluster's business
    assert "NCCL_SOCKET_IFNAME" not in os.environ and "GLOO_SOCKET_IFNAME" not in os.environ
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth7")  # the user's choice wins
    keep_collectives_on_loopback("127.0.0.1")
    assert (os.environ["NCCL_SOCKET_IFNAME"], os.environ["GLOO_SOCKET_IFNAME"]) == ("lo", "eth7")
