"""The main job with the optimizer state written every K steps, killed mid-run: does it end at the recorded ids?

    .venv/bin/python benchmarks/state_every_resume.py            # kill -9 the whole `dapo run` tree in step 38's training, run it again
    .venv/bin/python benchmarks/state_every_resume.py --hosted   # on long-lived Ray actors: kill -9 the train host
                                                                 # after step 23, the engine actors after step 33

Both compare every checkpoint id with a finished run (default ``runs/tiny-cpu``, the recorded seed 0) and exit 1 on
a difference. With ``--hosted`` the driver runs on: the next train task starts a new host, which replays the steps
since the last written state (engines/train/replay.py; the task says so in the run's log), and the next rollout or
evaluation call starts new engine actors, which load the weights from the checkpoint's files (the new host holds
them in memory only from its first step on: engines/rollout/host_weights.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from local_ray import logical_gpu_nodes

REPO = Path(__file__).resolve().parents[1]


def _ids(run: Path) -> list[str]:
    return [json.loads((p / "dapo_checkpoint.json").read_text())["checkpoint_id"]
            for p in sorted((run / "checkpoints").glob("step-????"))]


def _start(args: argparse.Namespace, env: dict[str, str]) -> subprocess.Popen[bytes]:
    command = [str(REPO / ".venv" / "bin" / "dapo"), "run", "--config", str(REPO / "configs" / "tiny-cpu.yaml"),
               "--run-root", str(args.root), "--set", "run.name=resumed",
               "--set", f"train.optimizer_state_every={args.every}"]
    return subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def _wait_for(path_glob: str, run: Path, proc: subprocess.Popen[bytes]) -> None:
    while not list(run.glob(path_glob)):
        if proc.poll() is not None:
            raise SystemExit(f"the run ended before {path_glob} appeared")
        time.sleep(0.02)


def plain(args: argparse.Namespace, run: Path) -> None:
    """kill -9 the whole tree (driver, workers) once step ``args.step``'s training has begun; run it again."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS" and not k.startswith("DAPO_ENGINES_")}
    proc = _start(args, env)
    _wait_for(f"checkpoints/.step-{args.step:04d}.staging-*", run, proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    print(f"killed during step {args.step}'s training; run again", flush=True)
    if _start(args, env).wait() != 0:
        raise SystemExit("the re-run failed")


def _kill_actors(kind: str) -> list[int]:
    """kill -9 every process of this machine whose title names the Ray actor class ``kind``; their pids."""
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True, check=True).stdout
    pids = [int(line.split()[0]) for line in ps.splitlines() if kind in line]
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    return pids


def hosted(args: argparse.Namespace, run: Path) -> None:
    """On a two-node local Ray cluster: kill -9 the train host actor once step ``args.step`` is published, and
    the engine actors once step ``args.step + 10`` is."""
    with logical_gpu_nodes(2) as address:
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        proc = _start(args, {**env, "DAPO_ENGINES_RAY_ADDRESS": address})
        _wait_for(f"checkpoints/step-{args.step:04d}/dapo_checkpoint.json", run, proc)
        print(f"killed the train host {_kill_actors('TrainHost')} after step {args.step}", flush=True)
        _wait_for(f"checkpoints/step-{args.step + 10:04d}/dapo_checkpoint.json", run, proc)
        engines = _kill_actors("_EngineActor")
        if not engines:
            raise SystemExit(f"no engine actor process found after step {args.step + 10}")
        print(f"killed the engine actor(s) {engines} after step {args.step + 10}", flush=True)
        if proc.wait() != 0:
            raise SystemExit("the run failed after the actors were killed")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hosted", action="store_true", help="long-lived Ray actors; kill the train host, then the engines")
    parser.add_argument("--every", type=int, default=5, help="train.optimizer_state_every")
    parser.add_argument("--step", type=int, help="the step to kill in (plain, default 38) or after (hosted, default 23)")
    parser.add_argument("--root", type=Path, default=Path("/tmp/dapo-state-every"), help="run root (emptied first)")
    parser.add_argument("--reference", type=Path, default=REPO / "runs" / "tiny-cpu", help="a finished run to compare")
    args = parser.parse_args()
    args.step = args.step or (23 if args.hosted else 38)
    shutil.rmtree(args.root, ignore_errors=True)
    run = args.root / "resumed"
    started = time.perf_counter()
    (hosted if args.hosted else plain)(args, run)
    want, got = _ids(args.reference), _ids(run)
    differ = [i for i, (a, b) in enumerate(zip(want, got)) if a != b]
    print(f"{len(got)} checkpoint ids against {len(want)} in {args.reference}: "
          f"{'all equal' if want == got else f'differ at steps {differ[:5]}'} ({time.perf_counter() - started:.0f} s)")
    return 0 if want == got else 1


if __name__ == "__main__":
    sys.exit(main())
