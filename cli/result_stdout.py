"""A stage command's stdout holds its result alone (a manifest, metrics as JSON, answers).

`dapo rollout ... | jq .tokens_per_second` is how a user scripts a stage, yet vLLM logs to stdout
by default, and C++ code (torch, vLLM's CPU kernels) and child processes (DeepSpeed ranks, reward
workers) write to file descriptor 1 too, so the manifest came after pages of warnings. Inside
``result_stdout`` descriptor 1, which libraries, C code and children write to, points at stderr,
where diagnostics belong (they still reach the terminal); Python's ``sys.stdout``, which the
command prints its result through, keeps the command's real stdout. `dapo run` and `dapo ablate`
send all of it to their log file instead (workflows/run_output.py).
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Iterator

# vLLM's own log stream (read when vLLM is first imported): stderr, not the result's stdout.
VLLM_LOGGING_STREAM = ("VLLM_LOGGING_STREAM", "ext://sys.stderr")


def _writes_to_descriptor_1(stream: object) -> bool:
    try:
        return stream.fileno() == 1  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return False  # e.g. a test's io.StringIO: it is not descriptor 1, so it needs no copy


@contextlib.contextmanager
def result_stdout() -> Iterator[None]:
    """Descriptor 1 points at stderr inside the block; ``sys.stdout`` keeps the real stdout."""
    os.environ.setdefault(*VLLM_LOGGING_STREAM)
    sys.stdout.flush()
    real = os.dup(1)
    os.dup2(2, 1)
    kept = sys.stdout
    if _writes_to_descriptor_1(kept):
        sys.stdout = open(os.dup(real), "w", encoding=kept.encoding, errors=kept.errors,  # noqa: SIM115
                          buffering=1, closefd=True)
    try:
        yield
    finally:
        if sys.stdout is not kept:
            with contextlib.suppress(OSError):  # a reader that stopped early (`| head`): nothing to flush to
                sys.stdout.close()
            sys.stdout = kept
        with contextlib.suppress(OSError):
            sys.stderr.flush()
        os.dup2(real, 1)
        os.close(real)
