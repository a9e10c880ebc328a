"""The run report: PNGs only for plots with data, a page that links them, an inline copy for Flyte."""

from pathlib import Path

from workflows.report import write_report


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
    pngs = sorted(p.name for p in tmp_path.glob("*.png"))
    # no length/truncation/rounds/timings columns were given, so no such plots
    assert pngs == ["clip.png", "entropy.png", "eval.png", "reward.png"]
    html = page.read_text()
    assert all(f"src='{name}'" in html for name in pngs)
    assert "Answer: &lt;3&gt;" in html  # response text is escaped
    assert "data:image/png;base64," in inline and "src='reward.png'" not in inline
    assert not list(tmp_path.glob(".*.tmp"))
