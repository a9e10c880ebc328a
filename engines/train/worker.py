"""The process entry point of a DeepSpeed training launch: ``python -m engines.train.worker SPEC.json``.

``engines/train/launch.py`` writes a ``WorkerSpec`` (engines/train/spec.py) and launches this under
``torchrun``, one process group per step. Per process: load the parent checkpoint into a DeepSpeed
engine, run each step of the spec (engines/train/step.py), save and export into the staging folder.
Any failure raises with the step named; each failing rank writes it to ``error_path``.rankR. A
finished rank ends with ``os._exit`` (``exit_without_teardown``): teardown sometimes aborted. In
serve mode (``serve_dir`` set; engines/train/server.py) the ranks stay alive and take further steps
from a file mailbox, continuing in memory only when the parent is the checkpoint they published.

Design notes (phases, mailbox, exactness, watchdogs): docs/WARM_ENGINES.md,
"Training worker processes (engines/train/worker.py)".
"""

from __future__ import annotations

import gc
import importlib
import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist

import schemas
from engines.train import mailbox_wake
from engines.train.dist import all_reduce_scalars, init_process
from engines.train.spec import WorkerSpec
from engines.train.step import StepRunner
from storage.run_store import write_text


def run_request(runner: StepRunner, spec: WorkerSpec, load_s: float,
                extra: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Run the steps of ``spec`` on ``runner``, probe, save; rank 0 writes the metrics JSON
    (one dict per step, ``extra`` added to each) atomically to ``spec.metrics_path``."""
    results = []
    for entry in spec.steps:
        schemas.trust_validated(entry.get("validated_sha256", []), schemas.ScoredRollout)  # the launch checked them
        results.append(runner.run_step(int(entry["step"]), list(entry["shards"]), int(entry["parent_version"])))
    if spec.probe_input_ids is not None:
        logits = runner.probe(spec.probe_input_ids)
        if runner.rank == 0 and spec.probe_path:
            torch.save(logits, spec.probe_path)
    save_timings = runner.save(int(spec.steps[-1]["step"]))
    release_cached_gpu_memory()  # before the step is reported done: the engine may wake right after
    for r in results:  # on every rank: another node's owner reads its own node's (engines/train/node_group.py)
        r.update(extra or {})
    if runner.rank == 0:
        results[0]["timings"]["load_s"] = load_s
        results[-1]["timings"].update(save_timings)  # ds_save_s, export_s (overlapping) and save_export_s
        write_text(spec.metrics_path, json.dumps(results, indent=2))
    return results


def process_start_ticks(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (Linux), None when it does not exist.

    A pid alone is not an identity: after the owner dies the kernel may hand its pid to a new
    process. (pid, start ticks) is unique.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        if sys.platform.startswith("linux"):
            return None
        try:  # no /proc: existence only
            os.kill(pid, 0)
        except OSError:
            return None
        return 0
    # Field 2 (comm) may hold spaces and parentheses: split after its closing ')'.
    return int(stat[stat.rindex(")") + 2:].split()[19])


def owner_alive(pid: int, start_ticks: int | None) -> bool:
    """Whether process ``pid`` started at ``start_ticks`` still runs (``pid`` alone when ``start_ticks``
    is None or the system has no /proc)."""
    now = process_start_ticks(pid)
    return now is not None and (start_ticks is None or now == start_ticks or now == 0)


def _set_parent_death_signal() -> None:
    """Linux: SIGKILL this rank when its parent (the torchrun agent) dies, whatever kills it."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    if os.getppid() == 1:  # the agent died before prctl took effect
        os._exit(3)


def _start_owner_watchdog(pid: int, start_ticks: int | None, interval_s: float = 0.5) -> None:
    """Exit this process as soon as the owner is gone, even in the middle of a step.

    Nothing of an orphaned step could be published (the owner publishes), so there is nothing to
    finish: the staging folder it leaves is hidden and ``checkpoints.clean_stale_staging`` removes it.
    The rank's agent goes too (its other ranks with it, by their parent-death signal): an agent of a group
    spanning nodes would otherwise wait minutes for the other nodes' agents at torchrun's exit barrier.
    """
    def watch() -> None:
        while owner_alive(pid, start_ticks):
            time.sleep(interval_s)
        agent = os.getppid()
        if agent != 1:
            os.kill(agent, signal.SIGKILL)
        os._exit(0)

    threading.Thread(target=watch, name="owner-watchdog", daemon=True).start()


def request_path(serve_dir: str | Path, n: int) -> Path:
    return Path(serve_dir) / f"request-{n:06d}.json"


def result_path(serve_dir: str | Path, n: int) -> Path:
    return Path(serve_dir) / f"result-{n:06d}.json"


def ack_path(serve_dir: str | Path, n: int, rank: int) -> Path:
    return Path(serve_dir) / f"ack-{n:06d}.rank{rank}"


def error_prefix(serve_dir: str | Path, n: int) -> Path:
    return Path(serve_dir) / f"error-{n:06d}.txt"


POLL_S = 0.02  # serve mode: how often an idle rank looks for the next request


def _wait_request(serve_dir: Path, n: int, wake_fd: int | None) -> dict[str, Any]:
    path = request_path(serve_dir, n)
    while not path.is_file():
        mailbox_wake.wait(wake_fd, POLL_S)  # the owner pokes this rank's FIFO after writing a request
    return json.loads(path.read_text())


# Modules the first engine build would import (measured with cProfile on the 2-core machine):
# deepspeed.initialize's ZeRO optimizer check imports DeepSpeed's Muon optimizer, whose
# torch.compile decorators import torch._inductor (~1.2 s); every decoder model's layer classes
# (~0.1 s). The model's own module (e.g. Qwen2's) is left to the build: the parent is not known yet.
_PRELOADED = ("transformers.modeling_layers", "deepspeed.runtime.zero.muon.muon_optimizer")


def _preload() -> None:
    """Import what building the first request's engine needs before waiting for it: a group
    started ahead of its first step (engines/train/launch.py: start_workers) has it done by then."""
    from transformers import AutoModelForCausalLM  # noqa: F401

    for name in _PRELOADED:
        try:
            importlib.import_module(name)
        except ImportError:  # another version without it: the build will not import it either
            pass


def release_cached_gpu_memory() -> None:
    """Hand the step's freed activation blocks back to the GPU, which the caching allocator would keep:
    between steps a local run's vLLM engine generates on this GPU (infra/sizing.py: plan_shared_gpu
    counts the ranks' states alone then). No-op on the CPU."""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _spans_nodes() -> bool:
    """True in a warm group whose ranks run on several nodes (engines/train/node_group.py)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size())) < dist.get_world_size()


def _serve(base: WorkerSpec, rank: int) -> None:
    """Serve requests until a ``stop`` request (or the owner's death, via the watchdog)."""
    assert base.serve_dir is not None
    serve_dir = Path(base.serve_dir)
    runner: StepRunner | None = None
    wake_fd = mailbox_wake.listen(mailbox_wake.rank_fifo(serve_dir, rank))
    _preload()
    dist.barrier()  # every rank joined before the first acknowledgement
    n = 0
    while True:
        request = _wait_request(serve_dir, n, wake_fd)
        ack_path(serve_dir, n, rank).write_text("")
        if request.get("op") == "stop":
            return
        spec = replace(base, **request["spec"], serve_dir=base.serve_dir,
                       metrics_path=str(result_path(serve_dir, n)), error_path=str(error_prefix(serve_dir, n)))
        try:
            t0 = time.perf_counter()
            continued = bool(request.get("continue_in_memory")) and runner is not None and \
                runner.can_continue_from(spec.resume_ds_state)
            # Every rank decides from the same files; agreeing explicitly costs one collective and
            # makes a disagreement (e.g. a file racing a write) a reload, never a split group.
            (agreed,) = all_reduce_scalars([1.0 if continued else 0.0], dist.ReduceOp.MIN)
            continued = agreed == 1.0
            if continued:
                assert runner is not None
                runner.spec = spec
            else:
                # Rebuild exactly as a cold launch would (same seed, parent weights, ds_state).
                runner = None
                gc.collect()
                runner = StepRunner(spec)
            load_s = time.perf_counter() - t0
            results = run_request(runner, spec, load_s, {"continued_in_memory": continued, "serve_request": n})
            if _spans_nodes():
                dist.barrier()  # every rank of every node wrote its files of the step
                if rank != 0 and int(os.environ.get("LOCAL_RANK", 0)) == 0:
                    # Rank 0 wrote the group's result on its node; the owner of this one waits for its own.
                    write_text(spec.metrics_path, json.dumps(results))
                    mailbox_wake.poke(mailbox_wake.owner_fifo(serve_dir))
            if rank == 0:
                mailbox_wake.poke(mailbox_wake.owner_fifo(serve_dir))  # the result is written
        except Exception as err:
            Path(f"{spec.error_path}.rank{rank}").write_text(f"{type(err).__name__}: {err}\n\n{traceback.format_exc()}")
            mailbox_wake.poke(mailbox_wake.owner_fifo(serve_dir))
            raise
        n += 1


def main(argv: list[str]) -> int:
    """Run the spec at ``argv[0]`` on this rank: one launch, or serve mode until stopped."""
    if len(argv) != 1:
        print("usage: python -m engines.train.worker SPEC.json (launched by torchrun)", file=sys.stderr)
        return 2
    spec = WorkerSpec.from_json(argv[0])
    if spec.serve_dir is not None:
        _set_parent_death_signal()
        if spec.owner_pid is not None:
            _start_owner_watchdog(spec.owner_pid, spec.owner_start_ticks)
    t_start = time.perf_counter()
    rank = init_process()
    try:
        if spec.serve_dir is not None:
            _serve(spec, rank)
        else:
            runner = StepRunner(spec)
            run_request(runner, spec, time.perf_counter() - t_start)
    except Exception as err:  # report, then fail the launch (torchrun stops the other ranks)
        if spec.serve_dir is None:
            Path(f"{spec.error_path}.rank{rank}").write_text(f"{type(err).__name__}: {err}\n\n{traceback.format_exc()}")
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


def exit_without_teardown(code: int) -> NoReturn:
    """End this process now, with ``code``, without the interpreter's teardown.

    By the time ``main`` returns, every output of the launch is written and closed and the process
    group is destroyed; only the teardown is left, where the interpreter destroys the C++ objects of
    torch, gloo and DeepSpeed. That aborted one bf16 ZeRO-3 rank in ~25 launches on the CPU
    ("terminate called without an active exception"; faulthandler showed the main thread alone, with
    no Python frame), which failed a finished step (tests/integration/test_train_worker_exit.py). A
    failing ``main`` raises instead and exits through the teardown with its traceback, non-zero anyway.
    """
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_without_teardown(main(sys.argv[1:]))
