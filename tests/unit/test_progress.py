"""What `dapo run` prints while it works when its output is not a terminal (CI, pipes): one line per event."""

from __future__ import annotations

import io
import math

from workflows.progress import (
    PlainProgress,
    StepReport,
    format_duration,
    stage,
    using,
    where,
)


def _step(step: int, seconds: float, **overrides) -> StepReport:
    fields = dict(step=step, steps=4, rounds=2, groups=8, outcome="full", samples=32, accuracy=0.40625,
                  reward=-0.1875, entropy=0.53125, seconds=seconds)
    fields.update(overrides)
    return StepReport(**fields)


def test_plain_lines_hand_worked() -> None:
    out, err = io.StringIO(), io.StringIO()
    clock = iter([0.0, 100.0, 130.0, 190.0]).__next__  # start, after step 1, after step 2, after the eval
    display = PlainProgress(out, err, clock=clock)
    display.stage("curation")
    display.work("generation", 10, 384)  # bars are for a terminal: nothing in plain text
    display.step_done(_step(1, 30.0))
    display.step_done(_step(2, 10.0, accuracy=None, outcome="partial", groups=5))
    display.eval_done(2, {"avg_at_k": 0.3125, "pass_at_k": 0.5, "k": 4, "problems": 16})
    display.note("[verify] evaluate: outputs not intact, making them again", warning=True)
    assert out.getvalue().splitlines() == [
        "[run] curation ...",
        # ETA: the mean step so far (30 s) times the 3 steps left
        "[step 1/4] rounds=2 groups=8 (full) samples=32 acc=0.406 reward=-0.188 entropy=0.531 (30.0 s)  elapsed 1m40s  ETA ~1m30s",
        # a step of carried groups alone reads its accuracy back as None: "nan", not a crash
        "[step 2/4] rounds=2 groups=5 (partial) samples=32 acc=nan reward=-0.188 entropy=0.531 (10.0 s)  elapsed 2m10s  ETA ~40s",
        "[eval step 2] held-out avg@4 31.2%  pass@4 50.0%  (16 problems)",
    ]
    assert err.getvalue() == "[verify] evaluate: outputs not intact, making them again\n"


def test_nan_metrics_and_the_last_step_have_no_eta() -> None:
    out = io.StringIO()
    display = PlainProgress(out, io.StringIO(), clock=iter([0.0, 5.0]).__next__)
    display.step_done(_step(4, 5.0, reward=math.nan, entropy=None))
    assert out.getvalue() == "[step 4/4] rounds=2 groups=8 (full) samples=32 acc=0.406 reward=nan entropy=nan (5.0 s)  elapsed 5s\n"


def test_durations() -> None:
    assert [format_duration(s) for s in (0.4, 59.6, 60, 3599, 3600, 86399)] == ["0s", "1m00s", "1m00s", "59m59s", "1h00m", "23h59m"]


def test_where_follows_the_current_display() -> None:
    out = io.StringIO()
    with using(PlainProgress(out, io.StringIO())):
        stage("the step-0 policy (bootstrap warm-up)")
        assert where() == "the step-0 policy (bootstrap warm-up)"
        stage("step 3/20 (training)", quiet=True)
        assert where() == "step 3/20 (training)"
    assert out.getvalue() == "[run] the step-0 policy (bootstrap warm-up) ...\n"


def test_live_display_shows_stage_step_metrics_timing_and_the_work_bar() -> None:
    from rich.console import Console

    from workflows.progress import LiveProgress

    console = Console(file=io.StringIO(), width=140, color_system=None)
    times = iter([0.0, 60.0, 60.0])  # start, step 2 done, its ETA stamp; then every redraw at 75 s
    now = lambda: next(times, 75.0)  # noqa: E731
    display = LiveProgress(console, clock=now)
    display.begin("tiny-cpu", 4)
    display.step_done(_step(2, 30.0))  # the line that stays above the display
    display.eval_done(2, {"avg_at_k": 0.3125, "pass_at_k": 0.5, "k": 4, "problems": 16})
    display.stage("step 3/4 (rollout round 1)", quiet=True)
    display.work("generation", 96, 384)
    with console.capture() as capture:
        console.print(display.__rich__())
    screen = capture.get()
    assert "DAPO tiny-cpu  step 3/4 (rollout round 1)" in screen
    # ETA: 2 steps left x 30 s, stamped at 60 s, redrawn 15 s later
    assert "elapsed 1m15s  ETA ~45s" in screen.splitlines()[0]
    assert "steps" in screen and "2/4" in screen and "generation" in screen and "96/384" in screen
    assert "step 2: reward -0.188  acc 0.406  entropy 0.531" in screen and "held-out avg@4 31.2% (step 2)" in screen
    printed = console.file.getvalue().splitlines()
    assert printed[0].startswith("[step 2/4] rounds=2 groups=8 (full)") and printed[1].startswith("[eval step 2]")
    display.stage("step 3/4 (training)", quiet=True)  # a new stage drops the finished bar
    with console.capture() as capture:
        console.print(display.__rich__())
    assert "generation" not in capture.get()


def test_a_terminal_keeps_about_twenty_step_lines_of_a_long_run_and_every_unusual_step() -> None:
    from rich.console import Console

    from workflows.progress import MAX_STEP_LINES, LiveProgress

    console = Console(file=io.StringIO(), width=200, color_system=None)
    display = LiveProgress(console, clock=lambda: 0.0)
    display.begin("tiny-cpu", 60)
    for step in range(1, 61):
        display.step_done(_step(step, 5.0, steps=60, outcome="skipped" if step == 7 else "full"))
    kept = [int(line.split("/")[0].removeprefix("[step ")) for line in console.file.getvalue().splitlines()]
    # every 3rd step (ceil(60 / 20)), the last, and the skipped step 7
    assert kept == sorted({*range(3, 61, 3), 7, 60})
    assert len(kept) <= MAX_STEP_LINES + 1
    # a short run keeps every step, and pipes (PlainProgress) keep every step of any run
    short = Console(file=io.StringIO(), width=200, color_system=None)
    display = LiveProgress(short, clock=lambda: 0.0)
    for step in range(1, 5):
        display.step_done(_step(step, 5.0))
    assert len(short.file.getvalue().splitlines()) == 4
    out = io.StringIO()
    plain = PlainProgress(out, clock=lambda: 0.0)
    for step in range(1, 61):
        plain.step_done(_step(step, 5.0, steps=60))
    assert len(out.getvalue().splitlines()) == 60
