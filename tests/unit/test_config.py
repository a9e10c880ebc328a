"""Run configs: YAML -> stage dataclasses, --set overrides, and errors that name the field."""

from pathlib import Path

import pytest

from workflows.config import ConfigError, config_from_dict, load_config, parse_overrides

REPO = Path(__file__).resolve().parents[2]


def test_shipped_configs_load() -> None:
    for path in sorted((REPO / "configs").glob("*.yaml")):
        cfg = load_config(path)
        assert cfg.run.steps >= 1, path
        assert cfg.train.eps_low == 0.2 and cfg.train.eps_high == 0.28, path


def test_overrides_are_parsed_as_yaml_values() -> None:
    assert parse_overrides(["train.lr=3.0e-4", "run.steps=2", "score.dynamic_sampling=false"]) == {
        "train": {"lr": 3e-4},
        "run": {"steps": 2},
        "score": {"dynamic_sampling": False},
    }
    # "1e-4" is a string to YAML 1.1; a float field still takes it
    cfg = load_config(REPO / "configs" / "tiny-cpu.yaml", ["train.lr=1e-4", "run.steps=3"])
    assert cfg.train.lr == 1e-4 and cfg.run.steps == 3
    # an int where a float is expected is accepted and converted
    assert load_config(REPO / "configs" / "tiny-cpu.yaml", ["train.lr=1"]).train.lr == 1.0


def test_round_trip_through_dict_keeps_the_digest() -> None:
    cfg = load_config(REPO / "configs" / "tiny-cpu.yaml")
    again = config_from_dict(cfg.to_dict())
    assert again.to_dict() == cfg.to_dict() and again.digest() == cfg.digest()
    assert load_config(REPO / "configs" / "tiny-cpu.yaml", ["run.seed=1"]).digest() != cfg.digest()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["train.learning_rate=1"], r"train: unknown field\(s\) \['learning_rate'\]"),
        (["run.steps=two"], r"run\.steps: expected an integer"),
        (["train.lr=fast"], r"train\.lr: expected a number"),
        (["score.dynamic_sampling=1"], r"score\.dynamic_sampling: expected true/false"),
        (["nosection.x=1"], r"unknown section 'nosection'"),
        (["trainlr=1"], r"expected SECTION\.FIELD=VALUE"),
        (["train.zero_stage=4"], r"train: .*zero_stage=4"),
    ],
)
def test_bad_values_name_the_field(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(REPO / "configs" / "tiny-cpu.yaml", overrides)


def test_missing_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("run: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    listy = tmp_path / "list.yaml"
    listy.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping of sections"):
        load_config(listy)


def test_stage_config_for_stage_clis(tmp_path: Path) -> None:
    from workflows.config import stage_config

    # defaults + bare FIELD=VALUE overrides
    score = stage_config("score", None, ["overlong_buffer_tokens=4", "score.dynamic_sampling=false"])
    assert score.overlong_buffer_tokens == 4 and score.dynamic_sampling is False
    # from a run config's section, then overridden
    train = stage_config("train", REPO / "configs" / "tiny-cpu.yaml", ["lr=2e-5"])
    assert train.lr == 2e-5 and train.updates_per_step == load_config(REPO / "configs" / "tiny-cpu.yaml").train.updates_per_step
    with pytest.raises(ConfigError, match=r"only train\.FIELD overrides"):
        stage_config("train", None, ["score.reward_timeout_s=1"])
    with pytest.raises(ConfigError, match=r"unknown field\(s\) \['nope'\]"):
        stage_config("rollout", None, ["nope=1"])
