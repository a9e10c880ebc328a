"""What `dapo run` prints while it works when its output is not a terminal (CI, pipes): one line per event."""

from __future__ import annotations

import io
import math

from schemas.step_stats import StepStats
from workflows.progress import (
    PlainProgress,
    StepReport,
    format_duration,
    stage,
    using,
    where,
)


def _step(step: int, seconds: float, *, steps: int = 4, outcome: str = "full", **stats) -> StepReport:
    """The report of a step whose StepStats record holds the values below (and ``stats``)."""
    values = dict(generation_rounds=2, trained_groups=8, samples=32, accuracy=0.40625, reward_mean=-0.1875,
                  entropy=0.53125, loss=-0.00125, approx_kl=0.0140625, grad_norm=0.58125, tokens=9866,
                  time_train_s=1.7)
    values.update(stats)
    return StepReport(StepStats.blank(step, f"ckpt-{step}", f"ckpt-{step - 1}", **values), steps=steps,
                      outcome=outcome, seconds=seconds)


def test_plain_lines_hand_worked() -> None:
    out, err = io.StringIO(), io.StringIO()
    clock = iter([0.0, 100.0, 130.0, 190.0]).__next__  # start, after step 1, after step 2, after the eval
    display = PlainProgress(out, err, clock=clock)
    display.stage("curation")
    display.work("generation", 10, 384)  # bars are for a terminal: nothing in plain text
    display.step_done(_step(1, 30.0))
    display.step_done(_step(2, 10.0, accuracy=None, outcome="partial", trained_groups=5, approx_kl=None))
    display.eval_done(2, {"avg_at_k": 0.3125, "pass_at_k": 0.5, "k": 4, "problems": 16})
    display.note("[verify] evaluate: outputs not intact, making them again", warning=True)
    assert out.getvalue().splitlines() == [
        "[run] curation ...",
        # ETA: the mean step so far (30 s) times the 3 steps left
        # tok/s: 9866 tokens trained in 1.7 s of the step's training
        "[step 1/4] rounds=2 groups=8 (full) samples=32 acc=0.406 reward=-0.188 entropy=0.531 loss=-0.00125 kl=0.0141 "
        "grad_norm=0.581 tok/s=5804 (30.0 s)  elapsed 1m40s  ETA ~1m30s",
        # a step of carried groups alone reads its accuracy back as None: "nan", not a crash; a KL
        # not computed is left out
        "[step 2/4] rounds=2 groups=5 (partial) samples=32 acc=nan reward=-0.188 entropy=0.531 loss=-0.00125 "
        "grad_norm=0.581 tok/s=5804 (10.0 s)  elapsed 2m10s  ETA ~40s",
        "[eval step 2] held-out avg@4 31.2%  pass@4 50.0%  (16 problems)",
    ]
    assert err.getvalue() == "[verify] evaluate: outputs not intact, making them again\n"


def test_nan_metrics_and_the_last_step_have_no_eta() -> None:
    out = io.StringIO()
    display = PlainProgress(out, io.StringIO(), clock=iter([0.0, 5.0]).__next__)
    display.step_done(_step(4, 5.0, reward_mean=math.nan, entropy=None))
    assert out.getvalue() == ("[step 4/4] rounds=2 groups=8 (full) samples=32 acc=0.406 reward=nan entropy=nan "
                              "loss=-0.00125 kl=0.0141 grad_norm=0.581 tok/s=5804 (5.0 s)  elapsed 5s\n")


def test_a_skipped_step_trained_nothing_so_its_line_has_no_training_figures() -> None:
    out = io.StringIO()
    display = PlainProgress(out, io.StringIO(), clock=iter([0.0, 5.0]).__next__)
    skipped = StepReport(StepStats.blank(3, "ckpt-2", "ckpt-2", generation_rounds=3, samples=0, accuracy=0.0,
                                         time_train_s=0.01), steps=4, outcome="skipped", seconds=5.0)
    display.step_done(skipped)
    assert out.getvalue() == ("[step 3/4] rounds=3 groups=0 (skipped) samples=0 acc=0.000 reward=nan entropy=nan "
                              "(5.0 s)  elapsed 5s  ETA ~5s\n")


def test_the_first_training_step_names_the_worker_start_once_per_run() -> None:
    from workflows import progress

    out = io.StringIO()
    with using(PlainProgress(out, io.StringIO())):
        progress.begin("tiny-cpu", 3)
        progress.training(1, 3, trains=False)  # a skipped step starts no worker
        progress.training(2, 3, trains=True)
        assert where() == "step 2/3 (training)"  # the Ctrl-C message names the place, not the hint
        progress.training(3, 3, trains=True)
        assert where() == "step 3/3 (training)"
        progress.begin("rung-2", 1)  # the ablation ladder: the next rung may need other workers
        progress.training(1, 1, trains=True)
    assert out.getvalue().splitlines() == [
        "[run] step 2/3 (training; starting training workers, the first step only) ...",
        "[run] step 1/1 (training; starting training workers, the first step only) ...",
    ]


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
    assert "step 2: reward -0.188  acc 0.406  entropy 0.531  loss -0.00125  kl 0.0141  grad_norm 0.581  tok/s 5804" in screen and "held-out avg@4 31.2% (step 2)" in screen
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
