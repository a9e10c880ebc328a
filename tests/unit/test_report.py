"""The run report: PNGs only for plots with data, one self-contained page, its headline and formats."""

from pathlib import Path

import pytest

from reports.run import headline, integer, pct, pts, seconds, write_report


def test_report_skips_empty_plots_and_tolerates_missing_values(tmp_path: Path) -> None:
    metrics = [
        # step 1: carried surplus filled the batch, so no generation accuracy (None)
        {"step": 1, "reward_mean": 0.1, "accuracy": None, "entropy": 0.2, "clip_frac_low": 0.01, "clip_frac_high": 0.0},
        {"step": 2, "reward_mean": 0.3, "accuracy": 0.5, "entropy": 0.25, "clip_frac_low": 0.02, "clip_frac_high": 0.001},
    ]
    evals = [{"step": 0, "avg_at_k": 0.3, "pass_at_k": 0.5}, {"step": 2, "avg_at_k": 0.4, "pass_at_k": 0.6}]
    samples = [{"problem_id": "abc", "response_text": "1+2=3\nAnswer: <3>", "reward": 1.0, "correct": True,
                "filter_reason": "kept", "response_length": 12, "finish_reason": "stop"}]
    page, inline = write_report(tmp_path, title="run x", summary={"steps": 2}, metrics=metrics, evals=evals,
                                samples=samples)
    pngs = sorted(p.name for p in tmp_path.glob("*.svg"))
    # no length/truncation/rounds/timings columns were given, so no such plots
    assert pngs == ["accuracy.svg", "clip.svg", "entropy.svg", "eval.svg", "reward.svg"]
    html = page.read_text()
    assert html == inline and html.count("src='data:image/svg+xml;base64,") == len(pngs)  # self-contained
    assert "Answer: &lt;3&gt;" in html  # response text is escaped
    assert "http" not in html and "<script" not in html
    assert not list(tmp_path.glob(".*.tmp"))


def test_formats_hand_worked() -> None:
    assert pct(0.2897727272727273) == "29.0%" and pct(None) == "n/a" and pct(float("nan")) == "n/a"
    assert pts(0.068) == "+6.8 pts" and pts(-0.0049) == "-0.5 pts"
    assert seconds(12.345) == "12.3 s" and seconds(125) == "2 min 05 s" and seconds(4000) == "1 h 06 min 40 s"
    assert integer(1234567) == "1,234,567"


def test_headline_falls_back_to_binomial_interval_and_says_so() -> None:
    summary = {"accuracy_before": 0.3, "accuracy_after": 0.4, "eval_problems": 100, "eval_k": 4, "steps": 5,
               "pass_at_k_before": 0.5, "pass_at_k_after": 0.6}
    h = headline(summary, [{"step": 1}, {"step": 2}])
    # SE^2 = (0.3*0.7 + 0.4*0.6) / 400 = 0.001125; half = 1.96 * 0.03354 = 0.06574
    assert h["change"] == pytest.approx(0.1)
    assert h["change_ci95"] == pytest.approx([0.1 - 0.065740, 0.1 + 0.065740], abs=1e-5)
    assert "binomial approximation" in h["change_method"]
    assert (h["steps_done"], h["steps_planned"], h["status"]) == (2, 5, "finished")
    paired = headline({**summary, "accuracy_change_ci95": [0.02, 0.18], "accuracy_change_method": "paired"}, [])
    assert paired["change_ci95"] == [0.02, 0.18] and paired["change_method"] == "paired"


def test_headline_status_running_with_eta_and_failed_stage() -> None:
    running = headline({"status": "running", "steps": 10, "steps_done": 4, "step_seconds": [10, 20, 30, 20]}, [])
    assert running["status"] == "running, step 4/10, ETA 2 min 00 s"  # 6 steps left x 20 s mean
    assert headline({"status": "failed", "failed_stage": "train (step 3)"}, [])["status"] == "failed at train (step 3)"
