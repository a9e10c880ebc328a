"""The DAPO rule reward: +1 if the final answer is equivalent to the gold answer, else -1.

Paper eq. 7 (arXiv 2503.14476, section 3.5): R(y_hat, y) = 1 if is_equivalent(y_hat, y) else -1.
DAPO uses this rule-based outcome reward instead of a learned reward model because a learned
one is easy to hack; the same worry shapes this module:

- The answer is read the way the DAPO data asks for it (`dapo_core.answer_extraction`): the last
  `Answer:` in the last 300 characters, falling back to the last `\\boxed{}` in that window.
- The final answer line must state ONE value. Prose is removed from it and splits it
  (`stated_values`); a line that then offers more than one value ("35 otherwise 34",
  "\\boxed{35} \\boxed{34}", "12 or 13", "12, 13") is wrong even if one of them matches, whatever
  joins them. The one value must parse as one LaTeX expression: math-verify's lenient extraction,
  which scavenges the last number out of text it cannot parse ("35 ? 34" -> 34), is not used on
  model answers. The official DAPO scorer's strict match is the floor: the single-value forms it
  accepts ("34 cm", "x = 34", "$34$", "\\$34", "1,234", an equation's last side) are accepted.
- Equivalence is judged by math-verify (`parse` / `verify`), except for a cheap exact path when
  both sides are plain integers (the DAPO-Math-17K case, and the bulk of real verdicts).
- Model output is untrusted: parsing `\\boxed{9^{9^{9^{9}}}}` never finishes. math-verify's own
  timeout uses `signal.alarm`, which only works in a process's main thread, so every verdict
  runs in a worker *process* under a per-item wall-clock deadline. A worker that overruns it is
  SIGKILLed and replaced; its item gets status "timeout" (reward -1), a crashed worker's item
  gets status "error". Both are counted (`summarize_verdicts`) and logged, never a silent -1.

The worker pool is created lazily on first use, reused across calls and shut down at interpreter
exit. Workers are fresh interpreters started with `subprocess` (exec, never a bare fork of the
trainer, whose torch threads make fork unsafe; and unlike multiprocessing's spawn/forkserver
they never re-import the caller's `__main__`). The pool can be driven from any thread,
including an asyncio executor thread; concurrent callers are served one batch at a time.

Version rule: bump `_RULE_REVISION` whenever a change can alter any verdict (extraction,
normalisation, hedge rules, fast path, the default timeout). `REWARD_VERSION` also names the
installed math-verify version, so upgrading it changes the lineage string automatically.
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import importlib.metadata
import logging
import mmap
import multiprocessing.connection
import os
import re
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

from dapo_core.answer_extraction import (
    extract_answer,
    gold_integer,
    integer_value,
    looks_hedged,
    stated_values,
    strip_thousands_separators,
)

logger = logging.getLogger(__name__)

_RULE_REVISION: int = 2

try:
    _MATH_VERIFY_VERSION = importlib.metadata.version("math-verify")
except importlib.metadata.PackageNotFoundError:  # pragma: no cover - the package is a hard dependency
    _MATH_VERIFY_VERSION = "unknown"

REWARD_VERSION: str = f"dapo-rule-reward-r{_RULE_REVISION}+math-verify-{_MATH_VERIFY_VERSION}"
"""Names this reward code and the math-verify it judges with; stored per row for lineage."""

DEFAULT_TIMEOUT_S: float = 5.0
"""Per-verdict wall-clock limit. Ordinary verdicts take ~1 ms; 5 s matches math-verify's own default."""

CORRECT_REWARD: float = 1.0
INCORRECT_REWARD: float = -1.0

# A worker gets this long past `timeout_s` to report its own (signal-based) timeout before it is
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

VerdictStatus = Literal["ok", "timeout", "error"]


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The rule reward for one response (eq. 7).

    Attributes:
        reward: +1.0 if correct else -1.0 (timeouts and errors are -1.0).
        correct: Whether the extracted answer is equivalent to the gold answer.
        status: "ok" when judged; "timeout" when judging overran `timeout_s` (worker killed or
            interrupted); "error" when judging raised or the worker died.
        extracted_answer: The final answer read from the response, None if it gave none.
        reason: Why: "correct", "wrong", "no_answer", "hedged" (several values offered),
            "unparsable" (no value, or not one well-formed expression), "timeout", "error".
        error: Human-readable detail when status is "timeout" or "error", else None.
        judged_value: The single value that was judged, in a canonical form ("34" for "34",
            "34.0", "\\frac{68}{2}" and "x = 34"), so that equivalent answers compare equal (maj@k
            votes on it); None when no single value was judged (no answer, hedged, unparsable,
            timeout, error).
    """

    reward: float
    correct: bool
    status: VerdictStatus
    extracted_answer: str | None
    reason: str
    error: str | None = None
    judged_value: str | None = None


def _verdict(correct: bool, extracted: str | None, reason: str, status: VerdictStatus = "ok",
             error: str | None = None, judged_value: str | None = None) -> Verdict:
    return Verdict(
        reward=CORRECT_REWARD if correct else INCORRECT_REWARD,
        correct=correct,
        status=status,
        extracted_answer=extracted,
        reason=reason,
        error=error,
        judged_value=judged_value,
    )


@dataclasses.dataclass(frozen=True)
class VerdictCounts:
    """Counts over a batch of verdicts, for logs and step metrics."""

    total: int
    correct: int
    ok: int
    timeout: int
    error: int
    no_answer: int
    hedged: int


def summarize_verdicts(verdicts: Sequence[Verdict]) -> VerdictCounts:
    """Count verdicts by outcome and status (timeouts and errors must be visible, not just -1s)."""
    by_status = collections.Counter(v.status for v in verdicts)
    by_reason = collections.Counter(v.reason for v in verdicts)
    return VerdictCounts(
        total=len(verdicts),
        correct=sum(1 for v in verdicts if v.correct),
        ok=by_status["ok"],
        timeout=by_status["timeout"],
        error=by_status["error"],
        no_answer=by_reason["no_answer"],
        hedged=by_reason["hedged"],
    )


# --------------------------------------------------------------------------------------------
# Judging one extracted answer with math-verify. Runs inside worker processes (and in-process in
# `judge_in_process`, the slow obvious reference used by tests).
# --------------------------------------------------------------------------------------------

# (status, correct, reason, error, judged_value) - what a worker sends back per item.
_Outcome = tuple[str, bool, str, "str | None", "str | None"]


def _as_latex(text: str) -> str:
    """Wrap bare text in `$...$` so math-verify parses it as one LaTeX expression.

    Without delimiters math-verify falls back to regexes that pick the *last number*
    ("2^{5}+2" -> 2, "12 or 13" -> 13), which is both wrong and hackable.
    """
    return text if "$" in text else f"${text}$"


def _is_multi_valued(expr: Any) -> bool:
    """True for a parsed answer holding several values: a set of >1, interval, tuple, matrix, or/and."""
    import sympy
    from sympy.logic.boolalg import BooleanFunction

    if isinstance(expr, sympy.FiniteSet):
        return len(expr) > 1
    return isinstance(expr, (sympy.Set, sympy.Tuple, sympy.MatrixBase, BooleanFunction, list, tuple))


_GOLD_CACHE: dict[str, list[Any]] = {}
_DECIMAL_RE = re.compile(r"[+-]?\d{1,50}(?:\.\d{1,50})?")


def _parse_value(value: str) -> list[Any]:
    """Parse ONE stated value strictly: the whole string as one LaTeX expression, or nothing.

    math-verify's `parse` is an extractor for free text: by default, when the LaTeX grammar
    rejects the text it tries other matches and the plain-number regex, which returns the
    rightmost number ("35 ? 34", "35 \\to 34" -> 34). Here one expression is tried and only it
    (`first_match`, LaTeX only, no string fallback), so a line that is not one expression is
    unparsable, not a number picked out of it.
    """
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    if _DECIMAL_RE.fullmatch(value):
        # A plain decimal ("34.0") needs no LaTeX grammar: expression mode reads it exactly, ~5x faster.
        config: list[Any] = [ExprExtractionConfig()]
    else:
        config = [LatexExtractionConfig()]
        value = _as_latex(value)
    return parse(value, extraction_config=config, fallback_mode="no_fallback", extraction_mode="first_match",
                 parsing_timeout=None, raise_on_error=True)


def _has_unknowns(expr: Any) -> bool:
    """True when a parsed value has free symbols; for an equation, in its last side ("x = 34": no)."""
    import sympy

    if isinstance(expr, sympy.Equality):
        expr = expr.rhs
    return bool(getattr(expr, "free_symbols", ()))


def _canonical_value(expr: Any) -> str | None:
    """A canonical string for a parsed value, equal for equivalent numbers ("34", "34.0", 68/2).

    An equation's value is its last side ("x = 34" -> "34"). Numbers are evaluated and floats made
    rational, so 34.0 and \\frac{68}{2} both read "34"; other expressions keep sympy's printing.
    """
    import sympy

    if isinstance(expr, sympy.Equality):
        expr = expr.rhs
    if isinstance(expr, sympy.Expr) and expr.is_number:
        expr = expr.doit()
        if isinstance(expr, sympy.Float):
            expr = sympy.nsimplify(expr, rational=True)
    if isinstance(expr, str):
        return expr
    return str(expr)


def _parse_gold(gold_text: str) -> list[Any]:
    # G responses share one gold answer; parsing it once per worker saves ~0.3 ms per verdict.
    from math_verify import parse

    parsed = _GOLD_CACHE.get(gold_text)
    if parsed is None:
        gold_int = gold_integer(gold_text)
        if gold_int is not None:
            # What parse("34") returns, without the LaTeX grammar's ~1.5 ms per call.
            import sympy

            parsed = [sympy.Integer(gold_int), str(gold_int)]
        else:
            parsed = parse(_as_latex(gold_text), parsing_timeout=None, raise_on_error=True)
        if len(_GOLD_CACHE) > 4096:
            _GOLD_CACHE.clear()
        _GOLD_CACHE[gold_text] = parsed
    return parsed


def _judge(answer: str, gold_text: str) -> _Outcome:
    """Judge one extracted answer against one gold answer with math-verify (no timeout here)."""
    from math_verify import verify

    gold = _parse_gold(gold_text)
    if not gold:
        return ("error", False, "error", f"gold answer {gold_text!r} could not be parsed by math-verify", None)
    gold_is_single = not _is_multi_valued(gold[0])
    values = [strip_thousands_separators(value) for value in stated_values(answer)]
    if not values:
        return ("ok", False, "unparsable", None, None)
    if gold_is_single and (len(values) > 1 or looks_hedged(values[0])):
        return ("ok", False, "hedged", None, None)
    # A multi-valued gold (a tuple, a set) may be stated piece by piece ("x = 3 and y = 4").
    predicted = _parse_value(", ".join(values))
    if not predicted:
        return ("ok", False, "unparsable", None, None)
    if gold_is_single and _is_multi_valued(predicted[0]):
        return ("ok", False, "hedged", None, None)
    value = _canonical_value(predicted[0])
    if _has_unknowns(predicted[0]) and not _has_unknowns(gold[0]):
        # A value with unknowns is not a number, even where a zero makes it one ("2 A 0" for 0).
        return ("ok", False, "wrong", None, value)
    correct = bool(verify(gold, predicted, timeout_seconds=None, raise_on_error=True))
    return ("ok", correct, "correct" if correct else "wrong", None, value)


def _judge_caught(answer: str, gold_text: str) -> _Outcome:
    try:
        return _judge(answer, gold_text)
    except Exception as exc:  # untrusted input: any failure is a counted "error" verdict
        return ("error", False, "error", f"{type(exc).__name__}: {exc}"[:500], None)


class _SoftTimeout(BaseException):
    """Raised by SIGALRM inside a worker; a BaseException so library `except Exception` can't eat it."""


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
    _judge_caught("\\frac{68}{2}", "34")

    armed = [False]

    def on_alarm(signum: int, frame: Any) -> None:
        if armed[0]:
            raise _SoftTimeout()

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
        outcomes: list[_Outcome] = []
        for position, (answer, gold_text) in enumerate(items):
            struct.pack_into(_SLOT_FORMAT, slot, _SLOT_START_OFFSET, time.monotonic())
            struct.pack_into(_SLOT_FORMAT, slot, _SLOT_POSITION_OFFSET, float(position))
            try:
                armed[0] = True
                signal.setitimer(signal.ITIMER_REAL, timeout_s)
                if fault_injection:
                    _inject_fault(answer)
                outcome = _judge_caught(answer, gold_text)
                armed[0] = False
            except _SoftTimeout:
                outcome = ("timeout", False, "timeout", f"verdict exceeded {timeout_s:g} s (interrupted)", None)
            finally:
                armed[0] = False
                signal.setitimer(signal.ITIMER_REAL, 0)
            outcomes.append(outcome)
        struct.pack_into(_SLOT_FORMAT, slot, _SLOT_POSITION_OFFSET, -1.0)
        conn.send(outcomes)


# --------------------------------------------------------------------------------------------
# The worker pool (parent side).
# --------------------------------------------------------------------------------------------


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
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
                [sys.executable, "-c", "from dapo_core.rewards import _worker_entry; _worker_entry()",
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

    def run(self, items: Sequence[tuple[str, str]], timeout_s: float, max_workers: int) -> list[_Outcome]:
        """Judge `items` [(answer, gold_text)] on up to `max_workers` processes; one outcome each."""
        outcomes: list[_Outcome | None] = [None] * len(items)
        attempts = [0] * len(items)
        pending: collections.deque[int] = collections.deque(range(len(items)))
        while len(self.workers) > max_workers:  # shrink a pool left larger by an earlier call
            self._discard(self.workers[-1])
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
            while pending and len(self.workers) < max_workers:
                self.workers.append(self._start_worker())
            for worker in list(self.workers):
                if not pending:
                    break
                if worker.chunk is not None:
                    continue
                chunk_size = max(1, min(_MAX_CHUNK_ITEMS, len(pending) // (2 * max_workers)))
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
                      outcomes: list[_Outcome | None], requeue: Callable[[list[int], bool], None]) -> None:
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

    def _handle_crash(self, worker: _Worker, chunk: list[int], outcomes: list[_Outcome | None],
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


def shutdown_reward_pool() -> None:
    """Stop the worker processes (also registered at exit); the next call starts new ones."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is not None and _POOL.owner_pid == os.getpid():
            _POOL.close()
        _POOL = None


atexit.register(shutdown_reward_pool)


def reward_pool_stats() -> dict[str, int]:
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


def _validate(responses: Sequence[str], gold_answers: Sequence[str | int], timeout_s: float,
              max_workers: int | None) -> None:
    if len(responses) != len(gold_answers):
        raise ValueError(
            f"responses and gold_answers differ in length: {len(responses)} responses, "
            f"{len(gold_answers)} gold answers"
        )
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
    if max_workers is not None and max_workers < 1:
        raise ValueError(f"max_workers must be >= 1 or None, got {max_workers!r}")
    for row, (response, gold) in enumerate(zip(responses, gold_answers)):
        if not isinstance(response, str):
            raise TypeError(f"responses[{row}] must be str, got {type(response).__name__}")
        if isinstance(gold, bool) or not isinstance(gold, (str, int)):
            raise TypeError(f"gold_answers[{row}] must be str or int, got {type(gold).__name__}: {gold!r}")
        if isinstance(gold, str) and not gold.strip():
            raise ValueError(f"gold_answers[{row}] is an empty string")


def score_responses(
    responses: Sequence[str],
    gold_answers: Sequence[str | int],
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_workers: int | None = None,
    integer_fast_path: bool = True,
) -> list[Verdict]:
    """Rule reward (eq. 7) for each response against its gold answer.

    Args:
        responses: N decoded model responses (untrusted text).
        gold_answers: N gold answers, ints or strings (LaTeX allowed, e.g. "\\frac{14}{3}").
        timeout_s: Wall-clock limit per verdict; an overrun is a "timeout" verdict with reward -1.
        max_workers: Worker processes to use; None means every CPU this process may run on.
        integer_fast_path: Judge plain-integer answers against integer golds exactly in this
            process ("34" vs 34) instead of through math-verify. Same verdicts, ~100x cheaper;
            off only to measure math-verify itself.

    Returns:
        N verdicts, in input order.

    Raises:
        ValueError / TypeError: mismatched lengths or a malformed row (named by index).
    """
    _validate(responses, gold_answers, timeout_s, max_workers)
    extracted = [extract_answer(response) for response in responses]
    verdicts: list[Verdict | None] = [None] * len(responses)
    to_judge: list[int] = []
    for row, (answer, gold) in enumerate(zip(extracted, gold_answers)):
        if answer is None:
            verdicts[row] = _verdict(False, None, "no_answer")
            continue
        gold_int = gold_integer(gold) if integer_fast_path else None
        answer_int = integer_value(answer) if gold_int is not None else None
        if gold_int is not None and answer_int is not None:
            correct = answer_int == gold_int
            verdicts[row] = _verdict(correct, answer, "correct" if correct else "wrong", judged_value=str(answer_int))
        else:
            to_judge.append(row)
    if to_judge:
        items = [(extracted[row] or "", str(gold_answers[row]).strip()) for row in to_judge]
        workers = min(max_workers or _default_workers(), len(items))
        global _POOL
        with _POOL_LOCK:
            if _POOL is None or _POOL.owner_pid != os.getpid():
                # A forked child must not drive its parent's workers; it gets its own pool.
                _POOL = _VerdictPool()
            outcomes = _POOL.run(items, timeout_s, workers)
        for row, (status, correct, reason, error, value) in zip(to_judge, outcomes):
            verdicts[row] = _verdict(correct, extracted[row], reason, status, error, value)  # type: ignore[arg-type]
    final = [v for v in verdicts if v is not None]
    counts = summarize_verdicts(final)
    if counts.timeout or counts.error:
        logger.warning(
            "rule reward: %d of %d verdicts timed out (limit %.3g s) and %d errored; they score -1",
            counts.timeout, counts.total, timeout_s, counts.error,
        )
    return final


def score_response(response: str, gold_answer: str | int, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> Verdict:
    """Rule reward (eq. 7) for one response; see `score_responses`."""
    return score_responses([response], [gold_answer], timeout_s=timeout_s, max_workers=1)[0]


def judge_in_process(response: str, gold_answer: str | int) -> Verdict:
    """Slow, obvious reference: extract and judge with math-verify in this thread, no fast path.

    No timeout protection - for tests on trusted inputs only. `score_responses` must agree
    with it on every input that does not time out.
    """
    answer = extract_answer(response)
    if answer is None:
        return _verdict(False, None, "no_answer")
    status, correct, reason, error, value = _judge_caught(answer, str(gold_answer).strip())
    return _verdict(correct, answer, reason, status, error, value)  # type: ignore[arg-type]
