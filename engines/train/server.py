"""A warm DeepSpeed worker group that serves training steps across pipeline steps.

A cold training step launches ``torchrun ... -m engines.train.worker SPEC`` and pays process start,
imports and engine construction (~8 s of an ~11 s tiny step). By default
(``TrainConfig.keep_workers_warm``) the first step of a process starts the workers in serve mode
and later steps send them requests through a file mailbox. The group continues from memory only
when the parent is the checkpoint it last published; otherwise it rebuilds from disk as a cold
launch does, and every step still publishes its full checkpoint. A group that is dead or silent
past ``ACK_TIMEOUT_S`` raises ``GroupUnavailable`` and the caller runs that step cold, with a warning.

The owner is the process that calls ``acquire``: the driver's locally, or the train host's, a named
Ray actor that outlives each task (engines/train/ray_host.py). Design notes (the mailbox, exactness,
lifecycle): docs/WARM_ENGINES.md, "Warm training group (engines/train/server.py)".
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engines.train import mailbox_wake
from engines.runtime.processes import process_tree
from engines.train.dist import multi_node_launch, single_node_launch
from engines.train.node_group import NodeGroup, Relay
from engines.train.worker import (
    ack_path,
    error_prefix,
    process_start_ticks,
    request_path,
    result_path,
)
from storage.run_store import write_text

REPO_ROOT = Path(__file__).resolve().parents[2]
ACK_TIMEOUT_S = 60.0  # a ready group picks a request up within ~20 ms; silence this long = hung
STOP_TIMEOUT_S = 10.0  # a clean stop before the group is killed
_POLL_S = 0.01
PEER_ERROR_WAIT_S = 10.0  # a failed rank here waits this long for another node's own error (a multi-node group)


class GroupUnavailable(RuntimeError):
    """The warm group is dead or hung before it could run the request: run the step cold."""


class GroupStepFailed(RuntimeError):
    """The workers ran the request and failed (the message is the failing rank's first line)."""


class GroupTimeout(RuntimeError):
    """The request ran past its time limit; the group was killed."""


# Set by `dapo run` (workflows/run_output.py): the run's log file, where the workers' stdout and
# stderr are appended. Unset, each launch writes a worker.log in its own temp folder (removed after).
LOG_FILE_ENV = "DAPO_LOG_FILE"


@dataclass(frozen=True)
class WorkerLog:
    """Where one launch's workers write (their stdout and stderr), and where their output begins."""

    path: Path
    start: int  # byte offset of this launch's first line (the run's log file is shared)

    @staticmethod
    def open(folder: Path, title: str) -> WorkerLog:
        """The run's log file (``LOG_FILE_ENV``) after a ``title`` line, else a fresh ``folder/worker.log``."""
        shared = os.environ.get(LOG_FILE_ENV)
        if not shared:
            path = folder / "worker.log"
            path.write_bytes(b"")
            return WorkerLog(path=path, start=0)
        path = Path(shared)
        with path.open("ab") as handle:  # O_APPEND: whole lines from several writers stay whole
            handle.write(f"---- {title} ({time.strftime('%Y-%m-%d %H:%M:%S')}) ----\n".encode())
            return WorkerLog(path=path, start=handle.tell())

    def tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines the ranks wrote since this launch began, then torchrun's summary
        of which rank failed how (for an error message). The agent's own traceback between them
        (~17 lines of torch.distributed internals) is left out: it would push the ranks' last
        words, e.g. a crashed rank's stacks, out of the message."""
        try:
            with self.path.open("rb") as handle:
                handle.seek(self.start)
                text = handle.read().decode(errors="replace")
        except OSError:
            return ""
        return "\n".join(_without_agent_traceback(text.splitlines(), lines))


def _without_agent_traceback(lines: list[str], keep: int) -> list[str]:
    """``lines`` of a worker log: the last ``keep`` before torchrun's traceback (ending in its
    ``ChildFailedError``) and all after it; the last ``keep`` lines when there is none."""
    end = next((i for i in range(len(lines) - 1, -1, -1) if "ChildFailedError" in lines[i]), None)
    if end is None:
        return lines[-keep:]
    start = next((i for i in range(end, -1, -1) if lines[i].startswith("Traceback (most recent call last)")), end)
    return [*lines[:start][-keep:], *lines[end + 1:]]


@dataclass
class WorkerGroup:
    """One torchrun launch in serve mode, owned by the process that started it."""

    key: str  # everything baked into the engine; another key needs another group
    num_processes: int
    serve_dir: Path
    proc: subprocess.Popen[bytes]
    owner_pid: int
    log: WorkerLog
    started_s: float  # time.perf_counter() at launch
    next_request: int = 0
    ready: bool = False  # every rank acknowledged a request once (the group finished starting)
    last_checkpoint_id: str | None = None  # the checkpoint this group last produced AND was published
    start_s: float = 0.0  # launch until ready, measured by the first request that waited for it
    history: list[str] = field(default_factory=list)  # "continued" / "reloaded" per request (tests, benchmarks)
    wake_fd: int | None = None  # the owner's FIFO (engines/train/mailbox_wake.py): results end the wait at once
    node: NodeGroup | None = None  # this node's agent of a multi-node group (engines/train/node_group.py); None: one node
    engine_spec: dict[str, Any] = field(default_factory=dict)  # what the group was started with (relayed to peers)
    relay: Relay | None = None  # on the lead of a multi-node group: every request goes to the peers too

    @property
    def ranks(self) -> range:
        """The ranks whose mailboxes this owner writes: all of them, or its node's in a multi-node group."""
        return self.node.ranks if self.node is not None else range(self.num_processes)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def pids(self) -> list[int]:
        """torchrun and its ranks, for tests and diagnostics."""
        return process_tree(self.proc.pid)

    def submit(self, spec: dict[str, Any], *, continue_in_memory: bool, timeout_s: float) -> list[dict[str, Any]]:
        """Run one request; returns rank 0's metrics (one dict per step).

        Raises ``GroupUnavailable`` (dead/hung before it ran: run cold), ``GroupStepFailed``
        (the step itself failed, as a cold launch would have) or ``GroupTimeout``.
        """
        if not self.alive:
            raise GroupUnavailable(f"the warm worker group exited with {self.proc.returncode} while idle")
        n = self.next_request
        self.next_request += 1
        write_text(request_path(self.serve_dir, n),
                   json.dumps({"op": "run", "spec": spec, "continue_in_memory": continue_in_memory}))
        self._poke_ranks()
        if self.relay is not None:
            self.relay.send(n, self.key, self.engine_spec, spec, continue_in_memory, timeout_s)
        t0 = time.perf_counter()
        # Until every rank acknowledged, silence means a hung group (or, for a new group, one still
        # starting: that wait counts against the step's own time limit, as a cold launch's does).
        ack_deadline = t0 + (ACK_TIMEOUT_S if self.ready else timeout_s)
        acked = False
        while True:
            if result_path(self.serve_dir, n).is_file():
                results = json.loads(result_path(self.serve_dir, n).read_text())
                self._finish_peers()
                self.ready = True
                self.history.append("continued" if results[0].get("continued_in_memory") else "reloaded")
                return results
            errors = sorted(self.serve_dir.glob(f"{error_prefix(self.serve_dir, n).name}.rank*"))
            if errors:
                self._wait_exit(5.0)  # the failing rank exits; torchrun stops the others
                self.kill()
                first = errors[0].read_text().splitlines()[0]
                # A rank here that lost its partners on another node: that node's own error says why.
                peer = self.relay.failure(wait_s=PEER_ERROR_WAIT_S) if self.relay is not None else None
                raise GroupStepFailed(first if peer is None else f"{peer} (here: {first})")
            self._check_peers()
            if not self.alive:
                raise GroupUnavailable(f"the warm worker group exited with {self.proc.returncode} "
                                       f"during request {n}:\n{self.log_tail()}")
            now = time.perf_counter()
            if not acked:
                acked = all(ack_path(self.serve_dir, n, r).is_file() for r in self.ranks)
                if acked and not self.ready:
                    self.ready = True
                    self.start_s = now - self.started_s
                if not acked and now > ack_deadline:
                    self.kill()
                    raise GroupUnavailable(f"the warm worker group did not take request {n} within "
                                           f"{ack_deadline - t0:.0f} s (hung); killed it")
            if now - t0 > timeout_s:
                self.kill()
                raise GroupTimeout(f"ran past {timeout_s} s")
            mailbox_wake.wait(self.wake_fd, _POLL_S)

    def _check_peers(self) -> None:
        """A peer that failed or was lost fails the request here too (its ranks' partners would wait)."""
        failed = self.relay.failure() if self.relay is not None else None
        if failed is not None:
            self.kill()
            raise failed

    def _finish_peers(self) -> None:
        """Wait for every peer's part of the request (on an object store, its ranks' files uploaded)."""
        if self.relay is not None:
            self.relay.finish()

    def _poke_ranks(self) -> None:
        for rank in self.ranks:
            mailbox_wake.poke(mailbox_wake.rank_fifo(self.serve_dir, rank))

    def stop(self) -> None:
        """Ask the workers to exit; kill them if they do not within STOP_TIMEOUT_S. Idempotent.

        A group that never acknowledged a request is killed at once: its ranks may still be importing
        torch and DeepSpeed and read no request until they serve, so a run that ended before its first
        step (a refusal after curation) waited out their start at exit; they hold no state yet."""
        if self.owner_pid != os.getpid():
            return  # a forked child inherited this object: the group is not its to stop
        if self.alive and self.ready:
            try:
                write_text(request_path(self.serve_dir, self.next_request), json.dumps({"op": "stop"}))
                self.next_request += 1
                self._poke_ranks()
            except OSError:
                pass
            self._wait_exit(STOP_TIMEOUT_S)
        self.remove()

    def remove(self) -> None:
        """Kill the group and remove its temp folder (mailbox, spec, log): nothing of it is left."""
        self.kill()
        shutil.rmtree(self.serve_dir, ignore_errors=True)

    def kill(self) -> None:
        """SIGKILL torchrun and every rank, then reap it (and stop listening for their pokes)."""
        kill_tree(self.proc)
        if self.wake_fd is not None:
            os.close(self.wake_fd)
            self.wake_fd = None

    def log_tail(self, lines: int = 30) -> str:
        return self.log.tail(lines)

    def _wait_exit(self, timeout_s: float) -> None:
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass


def kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL a torchrun launch and its ranks, then reap it.

    torchrun starts every rank in a session of its own, so killing torchrun's process group does
    not reach them: the ranks are found by parentage before anything is killed.
    """
    if proc.poll() is None:
        tree = process_tree(proc.pid)
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # torchrun was started in its own session
        except ProcessLookupError:
            pass
        for pid in tree[1:]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    proc.wait()


def torchrun_command(num_processes: int, spec_path: Path, node: NodeGroup | None = None) -> list[str]:
    """The one-node torchrun launch of ``engines.train.worker`` (cold and warm paths alike), or with ``node``
    this node's agent of a multi-node warm group (engines/train/node_group.py).

    torchrun's log folder goes beside the spec, in the launch's own temp folder (removed after the
    step, or when the warm group stops): left to itself, torchrun makes a ``torchelastic_*`` folder
    in the system temp folder for every launch and never removes it. Its rendezvous listens on the
    loopback address only (engines/train/dist.py: ``single_node_launch``).
    """
    launch = single_node_launch(num_processes) if node is None else multi_node_launch(
        nodes=node.nodes, node_rank=node.node_rank, nproc_per_node=node.nproc_per_node,
        master_addr=node.master_addr, master_port=node.master_port)
    return [*launch, f"--log-dir={spec_path.parent / 'torchelastic'}", "-m", "engines.train.worker", str(spec_path)]


def start_group(*, key: str, num_processes: int, engine_spec: dict[str, Any], env: dict[str, str],
                node: NodeGroup | None = None) -> WorkerGroup:
    """Launch torchrun in serve mode (with ``node``: this node's agent of a multi-node group); returns at once
    (the first request waits for readiness)."""
    owner = os.getpid()
    serve_dir = Path(tempfile.mkdtemp(prefix=f"dapo-train-serve-pid{owner}-"))  # pid: see train.clean_stale_temp_dirs
    # metrics_path/error_path are per request in serve mode (result-N.json, error-N.txt.rankR).
    spec = {**engine_spec, "metrics_path": "", "error_path": "", "serve_dir": str(serve_dir), "owner_pid": owner, "owner_start_ticks": process_start_ticks(owner)}
    spec_path = serve_dir / "spec.json"
    spec_path.write_text(json.dumps(spec, indent=2))
    ranks = node.ranks if node is not None else range(num_processes)
    for fifo in [mailbox_wake.owner_fifo(serve_dir), *(mailbox_wake.rank_fifo(serve_dir, r) for r in ranks)]:
        mailbox_wake.make(fifo)
    cmd = torchrun_command(num_processes if node is None else node.nproc_per_node, spec_path, node)
    where = "" if node is None else f", node {node.node_rank} of {node.nodes}"
    log = WorkerLog.open(serve_dir, f"DeepSpeed workers: warm group of {num_processes} rank(s){where}, pid {owner}")
    with log.path.open("ab") as handle:
        # Own session, so a timeout kills torchrun and every rank at once (as the cold path does).
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT,
                                start_new_session=True)
    return WorkerGroup(key=key, num_processes=num_processes, serve_dir=serve_dir, proc=proc, owner_pid=owner,
                       log=log, started_s=time.perf_counter(),
                       wake_fd=mailbox_wake.listen(mailbox_wake.owner_fifo(serve_dir)), node=node,
                       engine_spec=engine_spec)


_lock = threading.RLock()  # Flyte may run tasks in threads; one request at a time per group
_active: WorkerGroup | None = None


def lock() -> threading.RLock:
    """Held by engines/train/launch.py around a warm step: one step at a time uses the group."""
    return _lock


def acquire(*, key: str, num_processes: int, engine_spec: dict[str, Any], env: dict[str, str],
            node: NodeGroup | None = None) -> tuple[WorkerGroup, bool]:
    """The group for ``key`` (call with ``lock()`` held): the running one, or a new one (with ``node``: this
    node's agent of a multi-node group; another place in another group is another key).

    Returns (group, started_now). A group with another key is stopped first. A group that died
    while idle is forgotten and ``GroupUnavailable`` raised: the caller runs this step cold (with
    a warning) and the next step starts a new group. After Ctrl-C (:func:`stop_now`) it raises
    ``GroupUnavailable`` and starts nothing; the caller then reports the step interrupted.
    """
    global _active
    if stopping():
        raise GroupUnavailable("interrupted (Ctrl-C): no worker group starts or runs after it")
    if node is not None:
        key = f"{key}|{json.dumps(dataclasses.asdict(node), sort_keys=True)}"
    group = _active
    if group is not None and group.owner_pid != os.getpid():
        group = _active = None  # inherited through fork: not ours
    if group is not None and not group.alive:
        code = group.proc.returncode
        discard(group)
        raise GroupUnavailable(f"the warm worker group exited with {code} while idle:\n{group.log_tail()}")
    if group is not None and group.key != key:
        stop_active()
        group = None
    if group is None:
        group = _active = start_group(key=key, num_processes=num_processes, engine_spec=engine_spec, env=env,
                                      node=node)
        if stopping():  # Ctrl-C while it started: stop_now may have looked before it was recorded
            discard(group)
            raise GroupUnavailable("interrupted (Ctrl-C) while the worker group started")
        return group, True
    return group, False


def active_group() -> WorkerGroup | None:
    """The running group of this process, if any (tests and benchmarks)."""
    group = _active
    return group if group is not None and group.owner_pid == os.getpid() else None


def discard(group: WorkerGroup) -> None:
    """Kill ``group`` and forget it (after a failure: its engine state can no longer be trusted)."""
    global _active
    with _lock:
        group.remove()
        if _active is group:
            _active = None


_stopping = threading.Event()  # set on Ctrl-C: this process starts no more training workers


def stop_now() -> None:
    """Ctrl-C: kill this process's group now (without its lock: a task thread may hold it) and
    start no other, so a step interrupted mid-update is not re-run by a cold launch. Its temp folder
    goes too: the driver then leaves by ``os._exit`` (no atexit), before the task thread may discard it."""
    _stopping.set()
    group = _active
    if group is not None and group.owner_pid == os.getpid():
        group.remove()


def stopping() -> bool:
    """True once :func:`stop_now` was called in this process."""
    return _stopping.is_set()


def stop_active() -> None:
    """Stop this process's warm group, if any (also registered with atexit)."""
    global _active
    with _lock:
        group, _active = _active, None
        if group is not None:
            group.stop()


atexit.register(stop_active)
