"""Where `dapo run` and `dapo ablate` send output: progress to the terminal, the rest to a log file.

vLLM, DeepSpeed, torch, Ray, transformers and Flyte print pages of warnings and start-up logs,
from Python (logging, ``warnings``, ``print``), from C++ (writes to file descriptors 1 and 2) and
from the processes they start (DeepSpeed ranks, vLLM engine cores, reward workers). Inside
``quiet_run`` every one of them lands in ``<run folder>/logs/dapo.log``:

- file descriptors 1 and 2 of this process point at the log file (appended), so C-level writes,
  ``sys.stdout``/``sys.stderr`` and every child process inherit it;
- Python's log records (root logger) and ``warnings`` are written there with a time stamp;
- the DeepSpeed launchers append their workers' output there too (``engines.train.server.LOG_FILE_ENV``).

The terminal gets the progress display (workflows/progress.py: redrawn in place on a terminal,
one line per event otherwise) through copies of the original descriptors. A failure still
reaches the terminal in full: the block's exception carries, as notes, the traceback of the
Flyte task that failed (Flyte logs it and re-raises without it) and the log file's path, and
``cli/main.py`` prints them. ``--verbose`` skips all of this: everything prints as before.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from engines.runtime.environ import overlay
from storage import run_store
from storage.run_layout import RunLayout
from workflows import progress
from workflows.run_binding import open_regular

LOG_NAME = "logs/dapo.log"


def log_file(layout: RunLayout) -> Path:
    """``<run folder>/logs/dapo.log`` (for a run in an object store: in this machine's mirror of it)."""
    return run_store.local_path(layout.root) / LOG_NAME


class _FailedTask(logging.Filter):
    """Keeps the traceback of the first Flyte task that failed (the innermost one: each parent
    task then fails with Flyte's own error, which carries only the message)."""

    def __init__(self) -> None:
        super().__init__()
        self.traceback: str | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if self.traceback is None and record.exc_info and record.exc_info[1] is not None \
                and record.getMessage().startswith("Task failed"):
            self.traceback = "".join(traceback.format_exception(record.exc_info[1])).rstrip()
        return True


@contextlib.contextmanager
def _descriptors_to(path: Path) -> Iterator[tuple[TextIO, TextIO]]:
    """Point fds 1 and 2 at ``path`` (appended) for the block; yields text streams on the original ones."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    target = open_regular(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    saved = [os.dup(1), os.dup(2)]
    terminal_out = os.fdopen(os.dup(saved[0]), "w", buffering=1, encoding="utf-8", errors="replace")
    terminal_err = os.fdopen(os.dup(saved[1]), "w", buffering=1, encoding="utf-8", errors="replace")
    try:
        os.dup2(target, 1)
        os.dup2(target, 2)
        yield terminal_out, terminal_err
    finally:
        for stream in (sys.stdout, sys.stderr, terminal_out, terminal_err):
            with contextlib.suppress(ValueError, OSError):
                stream.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, target):
            os.close(fd)
        terminal_out.close()
        terminal_err.close()


@contextlib.contextmanager
def _python_logging_to(stream: TextIO) -> Iterator[_FailedTask]:
    """Root log records (WARNING and up) and ``warnings`` to ``stream`` with time stamps; watches Flyte for a failed task."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.setLevel(logging.WARNING)
    root = logging.getLogger()
    root.addHandler(handler)
    logging.captureWarnings(True)
    failed = _FailedTask()
    flyte_logger = logging.getLogger("flyte")  # Flyte replaces its handlers on init; a logger filter stays
    flyte_logger.addFilter(failed)
    try:
        yield failed
    finally:
        flyte_logger.removeFilter(failed)
        logging.captureWarnings(False)
        root.removeHandler(handler)


@contextlib.contextmanager
def quiet_run(log_path: Path, *, command: str) -> Iterator[None]:
    """Run the block with third-party output in ``log_path`` and a progress display on the terminal."""
    from engines.train.server import (
        LOG_FILE_ENV,  # imports torch: not for `dapo run --help`
    )

    log_path.parent.mkdir(parents=True, exist_ok=True)
    # Never through a symlink, only a regular file (workflows/run_binding.py: open_regular).
    with os.fdopen(open_regular(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND), "a") as header:
        header.write(f"\n===== dapo {command} (pid {os.getpid()}) {time.strftime('%Y-%m-%d %H:%M:%S')}: "
                     f"{' '.join(sys.argv)} =====\n")
    with overlay({LOG_FILE_ENV: str(log_path)}), \
            _descriptors_to(log_path) as (out, err), _python_logging_to(sys.stderr) as failed:
        display = _display(out, err)
        try:
            with display if isinstance(display, progress.LiveProgress) else contextlib.nullcontext(), \
                    progress.using(display):
                yield
        except Exception as exc:
            if failed.traceback:
                exc.add_note(f"\nThe failing task's traceback:\n{failed.traceback}")
            exc.add_note(f"dapo {command}: full log: {log_path}")
            raise


def _display(out: TextIO, err: TextIO) -> progress.Progress:
    """A live display on a terminal, one line per event otherwise."""
    if out.isatty() and os.environ.get("TERM") != "dumb":
        from rich.console import Console

        return progress.LiveProgress(Console(file=out, stderr=False))
    return progress.PlainProgress(out, err)


@contextlib.contextmanager
def run_output(log_path: Path, *, command: str, verbose: bool) -> Iterator[None]:
    """``quiet_run`` unless ``verbose`` (then everything prints where it always did, lines for progress)."""
    if verbose:
        with progress.using(progress.PlainProgress()):
            yield
        return
    with quiet_run(log_path, command=command):
        yield
