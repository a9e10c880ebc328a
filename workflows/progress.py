"""What a run shows while it works: the seam the driver reports to, and its two displays.

The driver (workflows/driver.py) calls the module functions here: ``begin`` (a run of N steps),
``stage`` (curation, the warm-up, a step's rollout round, an evaluation), ``training`` (a step's
update; the run's first names the training workers' start), ``step_done`` (a step's StepStats
record), ``eval_done`` and ``note`` (a line the user must see, such as
an output made again). Long loops inside engines (generation, the tiny warm-up) report through
``engines/runtime/work_progress.py``. The display is the CLI's choice (workflows/run_output.py):

- ``LiveProgress``: one rich display redrawn in place on a terminal (stage, step i/N, the last
  step's reward, accuracy, entropy, loss, KL, grad norm and tokens/s, elapsed time and ETA, a bar
  for the work under way);
  finished evaluations and steps are printed above it as lines that stay (at most about
  ``MAX_STEP_LINES`` step lines, so a long run's screen keeps its start and its summary).
- ``PlainProgress``: every line, one per stage, step and evaluation, no redraws (pipes, CI,
  tests, ``--verbose``). It is also the default when no CLI chose (a cluster, tests that call the
  driver), printing to whatever ``sys.stdout`` is then.
"""

from __future__ import annotations

import contextlib
import math
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, TextIO

from engines.runtime import work_progress
from schemas.step_stats import StepStats


@dataclass(frozen=True)
class StepReport:
    """One finished DAPO step as the terminal shows it: its statistics record and where it stands."""

    stats: StepStats  # the step's StepMetrics record (schemas/step_stats.py); NaN or None: not measured
    steps: int  # steps in the run
    outcome: str  # full | partial | skipped
    seconds: float  # wall time of the step, rollout to published checkpoint

    @property
    def step(self) -> int:
        return self.stats.step

    @property
    def tokens_per_s(self) -> float | None:
        """Response tokens in the loss per second of the step's training (``tokens / time_train_s``)."""
        tokens, seconds = self.stats.tokens, _measured(self.stats.time_train_s)
        return tokens / seconds if tokens and seconds else None


class Progress(Protocol):
    """A display of a run's progress; each call must be quick (some come from engine threads)."""

    def begin(self, run: str, steps: int) -> None:
        """A run of ``steps`` DAPO steps starts (the ablation ladder: once per rung and seed)."""

    def stage(self, text: str, *, quiet: bool = False) -> None:
        """Work on ``text`` starts; ``quiet`` stages are shown live only, never as a line."""

    def work(self, label: str, done: int, total: int) -> None:
        """``done`` of ``total`` units of the current stage's loop (generation, warm-up)."""

    def step_done(self, report: StepReport) -> None: ...

    def eval_done(self, step: int, summary: dict[str, Any]) -> None:
        """Held-out evaluation of step ``step``'s policy (``avg_at_k``, ``pass_at_k``, ``k``, ``problems``)."""

    def note(self, text: str, *, warning: bool = False) -> None:
        """A line the user must see; ``warning`` ones go to stderr."""


def _measured(value: float | None) -> float | None:
    """``value``, or None when it was not measured: NaN, or a NaN read back from the shard as None."""
    return None if value is None or math.isnan(value) else value


def fmt3(value: float | None) -> str:
    """A metric for the step line: a NaN written to the metrics shard reads back as None."""
    return "nan" if _measured(value) is None else f"{value:.3f}"


def format_duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h10m``: whole seconds, the two largest units."""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def training_figures(report: StepReport, *, sep: str = "=", joiner: str = " ") -> str:
    """What the step's update measured, as TRL and verl print at each logging step: loss, KL
    (``approx_kl``, KL(old || new) on the batch, for monitoring: DAPO has no KL term), grad norm
    (before clipping) and tokens/s.
    Each is left out when the step did not measure it (a skipped step trained nothing)."""
    s = report.stats
    figures = [("loss", _measured(s.loss), "{:.3g}"), ("kl", _measured(s.approx_kl), "{:.3g}"),
               ("grad_norm", _measured(s.grad_norm), "{:.3g}"), ("tok/s", report.tokens_per_s, "{:.0f}")]
    return joiner.join(f"{name}{sep}{form.format(value)}" for name, value, form in figures if value is not None)


def step_line(report: StepReport) -> str:
    """The step's line: what sampling found, what the update measured, and the step's wall time."""
    r, s = report, report.stats
    trained = training_figures(r)
    return (f"[step {r.step}/{r.steps}] rounds={s.generation_rounds} groups={s.trained_groups} ({r.outcome}) "
            f"samples={s.samples} acc={fmt3(s.accuracy)} reward={fmt3(s.reward_mean)} entropy={fmt3(s.entropy)} "
            + (f"{trained} " if trained else "") + f"({r.seconds:.1f} s)")


# A terminal keeps at most about this many step lines (the live display always shows the latest
# step): a 60-step run would otherwise scroll its first lines and the step-0 evaluation away.
MAX_STEP_LINES = 20


def keeps_step_line(report: StepReport) -> bool:
    """Whether a terminal keeps ``report``'s line: every ``ceil(steps / MAX_STEP_LINES)``-th step,
    the last one, and any step that did not train a full batch (partial or skipped: worth seeing)."""
    every = max(1, math.ceil(report.steps / MAX_STEP_LINES))
    return report.step % every == 0 or report.step >= report.steps or report.outcome != "full"


def eval_line(step: int, summary: dict[str, Any]) -> str:
    k = summary["k"]
    return (f"[eval step {step}] held-out avg@{k} {summary['avg_at_k']:.1%}  pass@{k} {summary['pass_at_k']:.1%}  "
            f"({summary['problems']} problems)")


class _Timing:
    """Elapsed time and the ETA from the mean step so far (evaluations ride along in the mean's error)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock, self.started = clock, clock()
        self.step_seconds: list[float] = []

    def step(self, report: StepReport) -> tuple[float, float | None]:
        self.step_seconds.append(report.seconds)
        left = report.steps - report.step
        mean = sum(self.step_seconds) / len(self.step_seconds)
        return self.clock() - self.started, (mean * left if left > 0 else None)


class PlainProgress:
    """One line per stage, step and evaluation; nothing redrawn. ``None`` streams: ``sys.stdout`` /
    ``sys.stderr`` as they are when a line is written."""

    def __init__(self, out: TextIO | None = None, err: TextIO | None = None, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._out, self._err = out, err
        self._timing = _Timing(clock)

    def _print(self, line: str, *, warning: bool = False) -> None:
        stream = (self._err or sys.stderr) if warning else (self._out or sys.stdout)
        print(line, file=stream, flush=True)

    def begin(self, run: str, steps: int) -> None:
        pass

    def stage(self, text: str, *, quiet: bool = False) -> None:
        if not quiet:
            self._print(f"[run] {text} ...")

    def work(self, label: str, done: int, total: int) -> None:
        pass  # a bar is for a terminal; a log gets the step lines

    def step_done(self, report: StepReport) -> None:
        elapsed, eta = self._timing.step(report)
        self._print(f"{step_line(report)}  elapsed {format_duration(elapsed)}"
                    + (f"  ETA ~{format_duration(eta)}" if eta is not None else ""))

    def eval_done(self, step: int, summary: dict[str, Any]) -> None:
        self._print(eval_line(step, summary))

    def note(self, text: str, *, warning: bool = False) -> None:
        self._print(text, warning=warning)


class LiveProgress:
    """One display redrawn in place on a terminal (rich.live); step and evaluation lines stay above it.

    Use as a context manager: it draws from ``__enter__`` to ``__exit__`` and listens to the
    engines' work reports meanwhile. Nothing of it is left on the screen after ``__exit__``.
    """

    def __init__(self, console: Any, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.console = console
        self._timing = _Timing(clock)
        self._lock = threading.Lock()
        self._run, self._steps, self._done = "", 0, 0
        self._stage = "starting"
        self._work: tuple[str, int, int] | None = None
        self._last: StepReport | None = None
        self._eval: tuple[int, dict[str, Any]] | None = None
        self._eta: float | None = None
        self._eta_at = 0.0
        self._live: Any = None
        self._stop_listening: Callable[[], None] | None = None

    def __enter__(self) -> LiveProgress:
        from rich.live import Live

        self._live = Live(self, console=self.console, refresh_per_second=4, transient=True,
                          redirect_stdout=False, redirect_stderr=False)
        self._live.start()
        self._stop_listening = work_progress.listen(self.work)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._stop_listening is not None:
            self._stop_listening()
        if self._live is not None:
            self._live.stop()

    def _print(self, line: str) -> None:
        from rich.text import Text

        self.console.print(Text(line), soft_wrap=True)

    def begin(self, run: str, steps: int) -> None:
        with self._lock:
            self._run, self._steps, self._done = run, steps, 0

    def stage(self, text: str, *, quiet: bool = False) -> None:
        with self._lock:
            self._stage, self._work = text, None

    def work(self, label: str, done: int, total: int) -> None:
        self._work = (label, done, total)

    def step_done(self, report: StepReport) -> None:
        elapsed, eta = self._timing.step(report)
        with self._lock:
            self._done, self._steps, self._last = report.step, report.steps, report
            self._eta, self._eta_at = eta, self._timing.clock()
        if keeps_step_line(report):
            self._print(f"{step_line(report)}  elapsed {format_duration(elapsed)}")

    def eval_done(self, step: int, summary: dict[str, Any]) -> None:
        self._eval = (step, summary)
        self._print(eval_line(step, summary))

    def note(self, text: str, *, warning: bool = False) -> None:
        self._print(text)

    def __rich__(self) -> Any:
        from rich.console import Group
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        with self._lock:
            run, steps, done, stage, work = self._run, self._steps, self._done, self._stage, self._work
            last, evaluated, eta, eta_at = self._last, self._eval, self._eta, self._eta_at
        now = self._timing.clock()
        timing = f"elapsed {format_duration(now - self._timing.started)}"
        if eta is not None:
            timing += f"  ETA ~{format_duration(max(0.0, eta - (now - eta_at)))}"
        title = Text.assemble(("DAPO ", "bold"), (run or "run", "bold cyan"), f"  {stage}   ", (timing, "dim"))
        grid = Table.grid(padding=(0, 1))
        grid.add_column(min_width=10)
        grid.add_column(width=40)
        grid.add_column()
        if steps:
            grid.add_row("steps", ProgressBar(total=steps, completed=done, width=40), f"{done}/{steps}")
        if work is not None and work[2] > 0:
            label, n, total = work
            grid.add_row(label, ProgressBar(total=total, completed=n, width=40), f"{n}/{total}")
        facts = []
        if last is not None:
            trained = training_figures(last, sep=" ", joiner="  ")
            facts.append(f"step {last.step}: reward {fmt3(last.stats.reward_mean)}  acc {fmt3(last.stats.accuracy)}  "
                         f"entropy {fmt3(last.stats.entropy)}" + (f"  {trained}" if trained else ""))
        if evaluated is not None:
            step, summary = evaluated
            facts.append(f"held-out avg@{summary['k']} {summary['avg_at_k']:.1%} (step {step})")
        return Group(title, grid, *([Text("   ".join(facts))] if facts else []))


_current: Progress = PlainProgress()
_where = "start-up"
_workers_named = False  # whether this run's first training stage was shown (see training)


@contextlib.contextmanager
def using(display: Progress) -> Iterator[Progress]:
    """Report to ``display`` inside the block (the CLI's choice), then to the previous one again."""
    global _current
    previous, _current = _current, display
    try:
        yield display
    finally:
        _current = previous


def where() -> str:
    """What the run was doing last (for the Ctrl-C message), e.g. ``step 3/20 (training)``."""
    return _where


def begin(run: str, steps: int) -> None:
    global _workers_named
    _workers_named = False  # each run (each ablation rung) may start its own training workers
    _current.begin(run, steps)


def stage(text: str, *, quiet: bool = False, hint: str = "") -> None:
    """Work on ``text`` starts; ``hint`` (shown, never part of :func:`where`) says why it may take long."""
    global _where
    _where = text
    _current.stage(f"{text[:-1]}; {hint})" if hint and text.endswith(")") else text, quiet=quiet)


def training(step: int, steps: int, *, trains: bool) -> None:
    """Step ``step``'s training starts (``trains``: it updates the policy; a skipped step does not).

    The run's first update waits for the training workers to start and build their engine (30-40 s
    seen on a CPU machine when they were not up yet, where later updates take ~1 s; less when the
    driver's early start, engines/train/launch.py: start_workers, had time to finish): that stage
    is named and shown as a line, so a long first step reads as what it is. Later steps' training
    is a quiet stage.
    """
    global _workers_named
    if trains and not _workers_named:
        _workers_named = True
        stage(f"step {step}/{steps} (training)", hint="starting training workers, the first step only")
    else:
        stage(f"step {step}/{steps} (training)", quiet=True)


def step_done(report: StepReport) -> None:
    _current.step_done(report)


def eval_done(step: int, summary: dict[str, Any]) -> None:
    _current.eval_done(step, summary)


def note(text: str, *, warning: bool = False) -> None:
    _current.note(text, warning=warning)
