"""The ``tracking`` section: loaded like the others, yet outside the digest and the run-folder binding."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from workflows.config import ConfigError, load_config
from workflows.run_binding import RunFolderError, check_run_record

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "configs" / "tiny-cpu.yaml"


def test_tensorboard_is_on_by_default_and_the_others_off() -> None:
    cfg = load_config(TINY)
    assert cfg.tracking.enabled() == ("tensorboard",)
    on = load_config(TINY, ["tracking.wandb=true", "tracking.mlflow=true", "tracking.wandb_project=rl"])
    assert on.tracking.enabled() == ("tensorboard", "wandb", "mlflow") and on.tracking.wandb_project == "rl"


def test_trackers_do_not_enter_the_digest() -> None:
    base = load_config(TINY)
    other = load_config(TINY, ["tracking.wandb=true", "tracking.tensorboard=false", "tracking.mlflow_experiment=x"])
    assert other.to_dict()["tracking"] != base.to_dict()["tracking"]
    assert other.digest() == base.digest()
    assert load_config(TINY, ["train.lr=3e-4"]).digest() != base.digest()  # the digest still sees the rest


@pytest.mark.parametrize("override", ["tracking.wandb_project=a/b", "tracking.mlflow_experiment=", "tracking.wandb=1"])
def test_bad_values_are_blamed_on_the_set(override: str) -> None:
    field = override.partition("=")[0]
    with pytest.raises(ConfigError, match=re.escape(f"--set {override}: ") + rf"({re.escape(field)}=|expected)"):
        load_config(TINY, [override])


def test_a_resumed_run_may_turn_trackers_on_and_an_old_record_without_the_section_resumes() -> None:
    recorded = load_config(TINY).to_dict()
    wanted = load_config(TINY, ["tracking.wandb=true", "tracking.mlflow=true", "tracking.tensorboard=false"]).to_dict()
    check_run_record("runs/r", {"config": recorded}, wanted)
    old_record = {k: v for k, v in recorded.items() if k != "tracking"}  # run.json written before trackers existed
    check_run_record("runs/r", {"config": old_record}, wanted)
    # ... and a real change is still refused, and named
    changed = load_config(TINY, ["tracking.wandb=true", "train.lr=3e-4"]).to_dict()
    with pytest.raises(RunFolderError, match=r"train\.lr") as info:
        check_run_record("runs/r", {"config": old_record}, changed)
    assert "tracking" not in str(info.value)
