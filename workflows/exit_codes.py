"""The exit codes of every ``dapo`` command, declared once (README "Exit codes").

A script driving the stages needs to tell "fix what you gave me" from "the work failed": the
first is worth a message to a person, the second a retry or a look at the log.
"""

from __future__ import annotations

OK = 0
FAILED = 1  # the work failed (a worker, an engine, the disk), or a check found a problem (`dapo verify`)
BAD_INPUT = 2  # the arguments, config or input files are wrong; named in one line, before any long work
INTERRUPTED = 130  # Ctrl-C, as a shell reports it
TERMINATED = 143  # SIGTERM
