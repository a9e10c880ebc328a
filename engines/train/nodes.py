"""A training step on N local "nodes": the multi-node elastic job of a cluster, started on this machine.

On a cluster the Flyte PyTorch plugin starts one elastic agent per training pod, and each agent starts
the task body once per rank (engines/train/rank.py: ``train_step_as_rank``). When the deployment plan
(infra/environments.py: ``cluster_settings``, the ``DAPO_CLUSTER_PLAN`` variable) asks for
``train_nodes`` > 1 and the train task is not such a rank itself (a local target), this module plays the
plugin's part: it starts ``train_nodes`` elastic agents of ``train_nproc_per_node`` ranks each on
loopback, every agent with its own mirror folder (storage/run_store.py: ``MIRROR_ENV``) as on separate
pods, so on an object store the nodes share nothing but the store. The ranks run the very rank body the
cluster runs; rank 0's published result comes back through a file. One code path: the local and cluster
topologies differ by the plan, a parameter, not by a copy of the step.

``python -m engines.train.nodes ARGS.json`` is the rank entry point the agents start.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from engines.train.dist import free_port
from engines.train.launch import _worker_env
from engines.train.node_group import NodeLayout
from engines.train.publish import TrainStepError, TrainStepResult
from settings.train import TrainConfig
from storage import run_store

RESULT_FILE = "result.json"  # rank 0's TrainStepResult, written by the rank entry point
STOP_GRACE_S = 10.0  # an agent told to stop (SIGTERM) stops its ranks within this, else it is killed


def _agent_command(layout: NodeLayout, node: int, port: int, work: Path) -> list[str]:
    """One node's elastic agent (torchrun, static rendezvous on loopback) running this module's ranks."""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(layout.nodes), "--node_rank", str(node),
            "--nproc_per_node", str(layout.nproc_per_node), "--master_addr", "127.0.0.1", "--master_port", str(port),
            "--max_restarts", "0",
            f"--log-dir={work / f'torchelastic-{node}'}",  # else a torchelastic_* folder in the system temp
            "-m", "engines.train.nodes", str(work / "args.json")]


def _agent_env(layout: NodeLayout, node: int, work: Path) -> dict[str, str]:
    """The rank environment of the local launch (engines/train/launch.py: _worker_env, the same threads
    per rank), with this node's own mirror folder: what one pod of its own would have."""
    env = _worker_env(layout.nodes * layout.nproc_per_node)
    env[run_store.MIRROR_ENV] = str(work / f"node-{node}-mirror")
    return env


def _wait_for_agents(agents: list[subprocess.Popen[bytes]]) -> int | None:
    """Wait for every agent; returns the index of the first that failed (None: all exit 0). That
    failure stops the others (their ranks would wait for its ranks at the next collective until the
    process group's timeout); an interrupted wait (Ctrl-C, an error) leaves no agent behind."""
    first_failed = None
    try:
        while first_failed is None and any(agent.poll() is None for agent in agents):
            time.sleep(0.1)
            first_failed = next((i for i, agent in enumerate(agents) if agent.poll() not in (None, 0)), None)
        if first_failed is None:
            first_failed = next((i for i, agent in enumerate(agents) if agent.returncode != 0), None)
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.terminate()  # the agent stops its ranks
                try:
                    agent.wait(timeout=STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    agent.kill()
                    agent.wait()
    return first_failed


def _run_agents(layout: NodeLayout, work: Path, step: int) -> None:
    """Start every node's agent and wait for all; a failed agent is a TrainStepError quoting its log's tail."""
    port = free_port()
    logs = [work / f"agent-{node}.log" for node in range(layout.nodes)]
    agents = []
    for node, log in enumerate(logs):
        with open(log, "wb") as out:  # the agent holds its own copy of the descriptor
            agents.append(subprocess.Popen(_agent_command(layout, node, port, work), stdout=out,
                                           stderr=subprocess.STDOUT, env=_agent_env(layout, node, work)))
    failed = _wait_for_agents(agents)
    if failed is not None:
        tail = logs[failed].read_text(errors="replace")[-3000:]
        raise TrainStepError(f"step {step}: training node {failed} of {layout.nodes} failed "
                             f"(exit {agents[failed].returncode}); nothing published by this launch. "
                             f"Its log ends:\n{tail}")


def train_step_on_nodes(
    checkpoint_dir: str,
    scored_shards: Sequence[str],
    out_dir: str,
    *,
    step: int,
    config: TrainConfig,
    layout: NodeLayout,
) -> TrainStepResult:
    """One DAPO step trained by ``layout.nodes`` local elastic agents (engines/train/rank.py on every
    rank); returns rank 0's published result, the checkpoint named as ``out_dir`` was given."""
    # The pid in the name: a kill -9 leaves the folder, and the next run's cleanup knows whose it was
    # (engines/train/launch.py: clean_stale_temp_dirs).
    with tempfile.TemporaryDirectory(prefix=f"dapo-train-nodes-pid{os.getpid()}-") as tmp:
        work = Path(tmp)
        args = {"checkpoint": str(checkpoint_dir), "shards": [str(s) for s in scored_shards], "out": str(out_dir),
                "step": step, "config": asdict(config), "result_path": str(work / RESULT_FILE)}
        (work / "args.json").write_text(json.dumps(args))
        _run_agents(layout, work, step)
        return TrainStepResult(**json.loads((work / RESULT_FILE).read_text()))


def main(argv: list[str]) -> int:
    """One rank: run ``train_step_as_rank`` on the arguments at ``argv[0]``; rank 0 writes the result."""
    import torch

    from engines.train.rank import running_as_elastic_rank, train_step_as_rank

    torch.set_flush_denormal(True)
    if len(argv) != 1 or not running_as_elastic_rank():
        print("usage: torchrun ... -m engines.train.nodes ARGS.json (started by train_step_on_nodes)", file=sys.stderr)
        return 2
    args = json.loads(Path(argv[0]).read_text())
    result = train_step_as_rank(args["checkpoint"], args["shards"], args["out"], step=args["step"],
                                config=TrainConfig(**args["config"]))
    if result is not None:
        tmp = Path(f"{args['result_path']}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(asdict(result), default=str))
        tmp.replace(args["result_path"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
