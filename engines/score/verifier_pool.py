"""The verifier process pool: rule-reward verdicts in killable worker processes.

Model output is untrusted: parsing `\\boxed{9^{9^{9^{9}}}}` never finishes, and a huge integer
power runs in C where no signal reaches it. So the pipeline judges every verdict that needs
math-verify (`dapo_core.rewards.judge_answer`) in a worker *process* under a per-item wall-clock
deadline: the worker's own SIGALRM stops Python-level runaways, and a worker that overruns the
deadline plus a short grace is SIGKILLed and replaced; its item gets status "timeout" (reward
-1), a crashed worker's item "error". Both are counted and logged, never a silent -1.

`process_judge()` is what `dapo_core.rewards.score_responses(..., judge=...)` takes; the scoring
and evaluation engines pass it. The pool is created lazily on first use, reused across calls and
shut down at interpreter exit. Workers are fresh interpreters started with `subprocess` (exec,
never a bare fork of the trainer, whose torch threads make fork unsafe; and unlike
multiprocessing's spawn/forkserver they never re-import the caller's `__main__`). The pool can
be driven from any thread, including an asyncio executor thread; concurrent callers are served
one batch at a time.

The pure reward (extraction, hedging rules, math-verify judging, the fast integer path) stays
in `dapo_core/rewards.py`; this module only decides where a verdict runs and for how long.
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import logging
import mmap
import multiprocessing.connection
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from dapo_core.rewards import Judge, Outcome, SoftTimeout, judge_answer

logger = logging.getLogger(__name__)

# killed; the signal cannot interrupt C code such as a huge integer power, the kill can.
_KILL_GRACE_S: float = 0.25
# A new worker imports sympy and math-verify (~1 s, more on a loaded machine) before judging.
_WORKER_STARTUP_ALLOWANCE_S: float = 60.0
# How often the parent checks deadlines while waiting for results.
_POLL_INTERVAL_S: float = 0.02
# Items per message: large enough to amortise pickling/IPC (~50 us per message), small enough
# that work spreads over all workers and a killed worker loses little finished work.
_MAX_CHUNK_ITEMS: int = 64
# A runaway sympy expression should fail with MemoryError in its worker, not exhaust the machine.
_WORKER_ADDRESS_SPACE_BYTES: int = 4 * 1024**3
# An item whose worker died while idle (so the item is not to blame) is retried this often.
_MAX_ATTEMPTS: int = 3



# Progress slot shared by a worker and the parent (16 bytes of shared memory): the chunk
# position being judged (-1.0 when idle) and the monotonic time it started. The worker writes
# the start before the position, so a reader never pairs a position with an older start.
_SLOT_FORMAT = "d"
_SLOT_POSITION_OFFSET = 0
_SLOT_START_OFFSET = 8
_SLOT_BYTES = 16


# Tests set this to "1" (before the pool starts) so that the answers "<hang>" and "<crash>"
# simulate what real inputs do only rarely: a hang no signal can interrupt (like a long C call)
# and a worker dying mid-item (like a segfault or the OOM killer).
_FAULT_INJECTION_ENV = "DAPO_REWARD_FAULT_INJECTION"


def _inject_fault(answer: str) -> None:
    import signal

    if answer == "<hang>":
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        while True:
            time.sleep(3600)
    if answer == "<crash>":
        os._exit(70)


def _worker_entry() -> None:
    """Entry point of a worker process: `python -c "...; _worker_entry()" CONN_FD SLOT_FD`."""
    import mmap
    import signal
    import struct
    import sys

    conn = multiprocessing.connection.Connection(int(sys.argv[1]))
    slot = mmap.mmap(int(sys.argv[2]), _SLOT_BYTES)
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (_WORKER_ADDRESS_SPACE_BYTES, _WORKER_ADDRESS_SPACE_BYTES))
    except (ImportError, ValueError, OSError):
        pass
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeout disabled" notices: we time out ourselves
    # Warm math-verify's lazy regex/grammar set-up so the first real item is not charged ~0.1 s.
    judge_answer("\\frac{68}{2}", "34")

    armed = [False]

    def on_alarm(signum: int, frame: Any) -> None:
        if armed[0]:
            raise SoftTimeout()

    signal.signal(signal.SIGALRM, on_alarm)
    fault_injection = os.environ.get(_FAULT_INJECTION_ENV) == "1"
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return  # the parent went away
        if message is None:
            return
        timeout_s, items = message
        outcomes: list[Outcome] = []
        for position, (answer, gold_text) in enumerate(items):
            struct.pack_into(_SLOT_FORMAT, slot, _SLOT_START_OFFSET, time.monotonic())
            struct.pack_into(_SLOT_FORMAT, slot, _SLOT_POSITION_OFFSET, float(position))
            try:
                armed[0] = True
                signal.setitimer(signal.ITIMER_REAL, timeout_s)
                if fault_injection:
                    _inject_fault(answer)
                outcome = judge_answer(answer, gold_text)
                armed[0] = False
            except SoftTimeout:
                outcome = ("timeout", False, "timeout", f"verdict exceeded {timeout_s:g} s (interrupted)", None)
            finally:
                armed[0] = False
                signal.setitimer(signal.ITIMER_REAL, 0)
            outcomes.append(outcome)
        struct.pack_into(_SLOT_FORMAT, slot, _SLOT_POSITION_OFFSET, -1.0)
        conn.send(outcomes)


@dataclasses.dataclass
class _Worker:
    process: subprocess.Popen[bytes]
    conn: multiprocessing.connection.Connection
    slot: mmap.mmap
    chunk: list[int] | None = None  # item indices in flight, None when idle
    chunk_deadline: float = 0.0  # monotonic time by which the whole chunk must be back

    def progress(self) -> tuple[int, float] | None:
        """(chunk position, start time) of the item being judged, None when idle or mid-update."""
        before = struct.unpack_from(_SLOT_FORMAT, self.slot, _SLOT_POSITION_OFFSET)[0]
        started = struct.unpack_from(_SLOT_FORMAT, self.slot, _SLOT_START_OFFSET)[0]
        after = struct.unpack_from(_SLOT_FORMAT, self.slot, _SLOT_POSITION_OFFSET)[0]
        if before < 0 or before != after:
            return None
        return int(before), started


def _package_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class _VerdictPool:
    """Worker processes with per-item deadlines; a hung worker is killed and replaced.

    Workers are fresh interpreters (`subprocess`, i.e. exec, never a bare fork of this possibly
    multithreaded process) that import only this module, so unlike multiprocessing's spawn and
    forkserver methods they never re-import the caller's `__main__` (which breaks scripts
    without an `if __name__ == "__main__":` guard). They talk over a socket pair with
    multiprocessing's framed pickle `Connection`, and publish progress in 16 bytes of shared memory.
    """

    def __init__(self) -> None:
        self.owner_pid = os.getpid()
        self.workers: list[_Worker] = []
        self.workers_started = 0
        self.workers_killed = 0

    def _start_worker(self) -> _Worker:
        parent_sock, child_sock = socket.socketpair()
        memfd_create = getattr(os, "memfd_create", None)
        slot_fd = memfd_create("dapo-reward-slot") if memfd_create else tempfile.TemporaryFile().detach()
        try:
            os.ftruncate(slot_fd, _SLOT_BYTES)
            slot = mmap.mmap(slot_fd, _SLOT_BYTES)
            struct.pack_into(_SLOT_FORMAT, slot, _SLOT_POSITION_OFFSET, -1.0)
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join(p for p in (_package_root(), env.get("PYTHONPATH")) if p)
            env["OMP_NUM_THREADS"] = "1"  # sympy needs no threads; never oversubscribe the trainer's cores
            process = subprocess.Popen(
                [sys.executable, "-c", "from engines.score.verifier_pool import _worker_entry; _worker_entry()",
                 str(child_sock.fileno()), str(slot_fd)],
                pass_fds=(child_sock.fileno(), slot_fd),
                env=env,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C goes to the parent, which kills workers itself
            )
        finally:
            child_sock.close()
            os.close(slot_fd)
        self.workers_started += 1
        return _Worker(process=process, conn=multiprocessing.connection.Connection(parent_sock.detach()), slot=slot)

    def grow_to(self, count: int) -> None:
        """Start workers until ``count`` are alive (they import while the caller goes on)."""
        while len(self.workers) < count:
            self.workers.append(self._start_worker())

    def _discard(self, worker: _Worker) -> None:
        if worker.process.poll() is None:
            worker.process.kill()
        try:
            worker.process.wait(timeout=5.0)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL not honoured
            logger.error("reward worker %d did not exit after SIGKILL", worker.process.pid)
        worker.conn.close()
        worker.slot.close()
        self.workers.remove(worker)

    def close(self) -> None:
        for worker in list(self.workers):
            try:
                worker.conn.send(None)
            except (OSError, ValueError):
                pass
        for worker in list(self.workers):
            try:
                worker.process.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                pass
            self._discard(worker)

    def run(self, items: Sequence[tuple[str, str]], timeout_s: float, max_workers: int) -> list[Outcome]:
        """Judge `items` [(answer, gold_text)] on up to `max_workers` processes; one outcome each.

        The pool keeps up to `max_workers` processes between calls: a call with fewer items than
        workers leaves the others idle, not killed, so the next call does not pay a fresh
        interpreter's sympy import (~0.4 s). Only a smaller `max_workers` shrinks it.
        """
        outcomes: list[Outcome | None] = [None] * len(items)
        attempts = [0] * len(items)
        pending: collections.deque[int] = collections.deque(range(len(items)))
        while len(self.workers) > max_workers:  # shrink a pool left larger by an earlier call
            self._discard(self.workers[-1])
        wanted = min(max_workers, len(items))  # start no more workers than this call can use
        kill_after_s = timeout_s + _KILL_GRACE_S

        def requeue(indices: list[int], blame: bool) -> None:
            for index in reversed(indices):
                attempts[index] += 1
                if blame and attempts[index] >= _MAX_ATTEMPTS:
                    outcomes[index] = ("error", False, "error", "reward worker died repeatedly on this item's chunk", None)
                else:
                    pending.appendleft(index)

        while pending or any(w.chunk is not None for w in self.workers):
            # Dispatch: top the pool up lazily (this also replaces killed workers), feed idle ones.
            if pending:
                self.grow_to(wanted)
            for worker in list(self.workers):
                if not pending:
                    break
                if worker.chunk is not None:
                    continue
                chunk_size = max(1, min(_MAX_CHUNK_ITEMS, len(pending) // (2 * wanted)))
                chunk = [pending.popleft() for _ in range(min(chunk_size, len(pending)))]
                worker.chunk = chunk
                # Backstop for a worker that never starts an item (stuck importing, stopped):
                # per-item deadlines only cover items in progress.
                worker.chunk_deadline = time.monotonic() + _WORKER_STARTUP_ALLOWANCE_S + len(chunk) * kill_after_s
                try:
                    worker.conn.send((timeout_s, [items[i] for i in chunk]))
                except (OSError, ValueError):
                    worker.chunk = None
                    requeue(chunk, blame=True)
                    self._discard(worker)
            busy = [w for w in self.workers if w.chunk is not None]
            if not busy:
                continue
            ready = multiprocessing.connection.wait([w.conn for w in busy], timeout=_POLL_INTERVAL_S)
            for worker in busy:
                chunk = worker.chunk
                if worker.conn not in ready or chunk is None:
                    continue
                try:
                    results = worker.conn.recv()
                except (EOFError, OSError):
                    self._handle_crash(worker, chunk, outcomes, requeue)
                    continue
                for index, outcome in zip(chunk, results):
                    outcomes[index] = outcome
                worker.chunk = None
            # Deadlines: kill any worker whose current item has run past timeout + grace.
            now = time.monotonic()
            for worker in busy:
                chunk = worker.chunk
                if chunk is None or worker not in self.workers:
                    continue
                progress = worker.progress()
                if progress is not None and now - progress[1] > kill_after_s:
                    self._kill_overdue(worker, chunk, progress[0], timeout_s, outcomes, requeue)
                elif now > worker.chunk_deadline:
                    logger.error("reward worker %d missed its chunk deadline; killing it", worker.process.pid)
                    self.workers_killed += 1
                    worker.chunk = None
                    requeue(chunk, True)
                    self._discard(worker)
        return [outcome for outcome in outcomes if outcome is not None]

    def _kill_overdue(self, worker: _Worker, chunk: list[int], position: int, timeout_s: float,
                      outcomes: list[Outcome | None], requeue: Callable[[list[int], bool], None]) -> None:
        worker.process.kill()
        worker.process.wait()
        self.workers_killed += 1
        worker.chunk = None
        try:  # the worker may have finished its whole chunk just before the kill landed
            if worker.conn.poll():
                results = worker.conn.recv()
                if len(results) == len(chunk):
                    for index, outcome in zip(chunk, results):
                        outcomes[index] = outcome
                    self._discard(worker)
                    return
        except (EOFError, OSError):
            pass
        outcomes[chunk[position]] = ("timeout", False, "timeout", f"verdict exceeded {timeout_s:g} s; worker killed", None)
        # Items before `position` were judged but not yet sent: judge them again elsewhere.
        requeue(chunk[:position] + chunk[position + 1 :], False)
        self._discard(worker)

    def _handle_crash(self, worker: _Worker, chunk: list[int], outcomes: list[Outcome | None],
                      requeue: Callable[[list[int], bool], None]) -> None:
        exit_code = worker.process.wait()
        position = int(struct.unpack_from(_SLOT_FORMAT, worker.slot, _SLOT_POSITION_OFFSET)[0])
        worker.chunk = None
        if 0 <= position < len(chunk):
            outcomes[chunk[position]] = (
                "error", False, "error", f"reward worker died (exit code {exit_code}) while judging this item", None
            )
            requeue(chunk[:position] + chunk[position + 1 :], False)
        else:
            requeue(chunk, True)
        self._discard(worker)



_POOL: _VerdictPool | None = None
_POOL_LOCK = threading.Lock()


def shutdown_verifier_pool() -> None:
    """Stop the worker processes (also registered at exit); the next call starts new ones."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is not None and _POOL.owner_pid == os.getpid():
            _POOL.close()
        _POOL = None


atexit.register(shutdown_verifier_pool)


def verifier_pool_stats() -> dict[str, int]:
    """Workers alive, started and killed (for timeouts) since the pool was created in this process."""
    pool = _POOL
    if pool is None or pool.owner_pid != os.getpid():
        return {"alive": 0, "started": 0, "killed": 0}
    return {"alive": len(pool.workers), "started": pool.workers_started, "killed": pool.workers_killed}


def _default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)



def _pool() -> _VerdictPool:
    """This process's pool (call with ``_POOL_LOCK`` held); a forked child gets its own, never
    driving its parent's workers."""
    global _POOL
    if _POOL is None or _POOL.owner_pid != os.getpid():
        _POOL = _VerdictPool()
    return _POOL


def start_verifier_pool(max_workers: int | None = None) -> None:
    """Start this process's verifier workers now (up to ``max_workers``; None = one per CPU) and
    return at once: each fresh interpreter imports sympy and math-verify (~0.4 s) while the caller
    does other work (the local driver: curation and the step-0 evaluation), so the first scoring
    call finds them up. Workers already alive are kept."""
    workers = max_workers or _default_workers()
    with _POOL_LOCK:
        _pool().grow_to(workers)


def process_judge(max_workers: int | None = None) -> Judge:
    """A judge for `dapo_core.rewards.score_responses` that runs verdicts on this process's pool.

    Args:
        max_workers: worker processes to use; None means every CPU this process may run on.
    """
    if max_workers is not None and max_workers < 1:
        raise ValueError(f"max_workers must be >= 1 or None, got {max_workers!r}")

    def judge(items: Sequence[tuple[str, str]], timeout_s: float) -> list[Outcome]:
        workers = max_workers or _default_workers()
        with _POOL_LOCK:
            return _pool().run(items, timeout_s, workers)

    return judge
