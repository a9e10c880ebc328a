"""What a user sees in TensorBoard, read back with TensorBoard's own readers (issue 48): the run is
named after the run (not "."), the resolved config is there as hparams and as text, and each
held-out evaluation is there in a form the default smoothing (0.6) does not change."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from settings.tracking import TrackingConfig
from tests.tracking_fixtures import evaluation, step_rows
from tracking.run_tracking import open_tracking

RUN_CONFIG = {"run": {"name": "tiny-cpu", "steps": 5, "data": ["synthetic:n=20"]},
              "train": {"lr": 1e-4, "eps_high": 0.28, "loss_agg": "token-mean", "keep_workers_warm": True}}


def _log_run(tmp_path: Path, *, sessions: int = 1) -> Path:
    """Steps 1..5 with evaluations 0, 3, 5 logged to TensorBoard; returns ``<run>/tracking/tensorboard``."""
    rows, evals = step_rows(tmp_path, range(1, 6)), [evaluation(0), evaluation(3), evaluation(5)]
    folder = tmp_path / "tiny-cpu" / "tracking"
    for _ in range(sessions):
        tracking = open_tracking(TrackingConfig(), str(folder), run_name="tiny-cpu", run_config=RUN_CONFIG)
        tracking.record(rows, evals)
        tracking.close()
    return folder / "tensorboard"


def _runs(logdir: Path) -> dict[str, Any]:
    """TensorBoard's runs under ``logdir``, as ``tensorboard --logdir`` names them, each loaded."""
    from tensorboard.backend.event_processing.plugin_event_multiplexer import EventMultiplexer

    mux = EventMultiplexer(size_guidance={"scalars": 0, "tensors": 0})
    mux.AddRunsFromDirectory(str(logdir))
    mux.Reload()
    return {name: mux.GetAccumulator(name) for name in mux.Runs()}


def _texts(acc: Any, tag: str) -> list[tuple[int, str]]:
    """A tag's text entries by step, as TensorBoard shows them (a resumed run's second event file may load
    first: files written in the same second sort by their writer's suffix)."""
    return sorted((e.step, e.tensor_proto.string_val[0].decode()) for e in acc.Tensors(tag))


def test_the_tensorboard_run_is_named_after_the_run(tmp_path: Path) -> None:
    assert list(_runs(_log_run(tmp_path))) == ["tiny-cpu"]


def test_the_resolved_config_is_there_as_hparams_and_as_text(tmp_path: Path) -> None:
    from tensorboard.plugins.hparams import plugin_data_pb2

    [acc] = _runs(_log_run(tmp_path, sessions=2)).values()
    content = acc.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
    hparams = {name: value.WhichOneof("kind") and getattr(value, value.WhichOneof("kind"))
               for name, value in start.hparams.items()}
    assert hparams == {"run.name": "tiny-cpu", "run.steps": 5, "run.data": '["synthetic:n=20"]', "train.lr": 1e-4,
                       "train.eps_high": 0.28, "train.loss_agg": "token-mean", "train.keep_workers_warm": True}
    # the held-out metrics are the hparams table's columns (its values are the last, unsmoothed)
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    assert [m.name.tag for m in experiment.metric_infos] == ["eval/avg_at_k", "eval/pass_at_k"]
    # the config as text, once although two sessions opened the run (it did not change)
    [(step, text)] = _texts(acc, "config/text_summary")
    assert step == 0 and "eps_high: 0.28" in text and "name: tiny-cpu" in text


def test_each_held_out_evaluation_is_a_text_line_no_smoothing_changes(tmp_path: Path) -> None:
    [acc] = _runs(_log_run(tmp_path)).values()
    lines = _texts(acc, "eval/held_out/text_summary")
    # evaluation(step): avg@4 = 0.25 + step / 8, pass@4 = 0.5 + step / 16, 95% half-width 0.125
    assert lines == [
        (0, "step 0: held-out avg@4 **25.0%** (95% interval +/- 12.5 points), pass@4 50.0%, maj@4 37.5%, 40 problems"),
        (3, "step 3: held-out avg@4 **62.5%** (95% interval +/- 12.5 points), pass@4 68.8%, maj@4 37.5%, 40 problems"),
        (5, "step 5: held-out avg@4 **87.5%** (95% interval +/- 12.5 points), pass@4 81.2%, maj@4 37.5%, 40 problems"),
    ]


def test_a_config_change_on_resume_is_logged_again_at_the_step_it_took_effect(tmp_path: Path) -> None:
    rows = step_rows(tmp_path, range(1, 4))
    folder = tmp_path / "tiny-cpu" / "tracking"
    first = open_tracking(TrackingConfig(), str(folder), run_name="tiny-cpu", run_config=RUN_CONFIG)
    first.record(rows[:2], [evaluation(0)])
    first.close()
    longer = {**RUN_CONFIG, "run": {**RUN_CONFIG["run"], "steps": 8}}  # a resume that adds steps
    second = open_tracking(TrackingConfig(), str(folder), run_name="tiny-cpu", run_config=longer)
    second.record(rows, [evaluation(0)])
    second.close()
    [acc] = _runs(folder / "tensorboard").values()
    texts = _texts(acc, "config/text_summary")
    assert [step for step, _ in texts] == [0, 3] and "steps: 5" in texts[0][1] and "steps: 8" in texts[1][1]
