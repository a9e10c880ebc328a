"""Every numeric setting has one bound, checked when its config is built (issue 45, "Unbounded
sizes"): a non-finite float, an int past int64 or past its field's sane maximum, and a round whose
size estimate exceeds the memory budget are refused at load time with the field named; so are
--set values that are not YAML (taken as the text typed: a string field accepts it) and NULs."""

from __future__ import annotations

import dataclasses
import math
import typing
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from settings.checks import FieldError
from workflows.config import ConfigError, _stage_classes, load_config

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "configs" / "tiny-cpu.yaml"


@pytest.mark.parametrize(("override", "named"), [
    ("rollout.samples_per_prompt=1000000000", "rollout.samples_per_prompt"),
    ("train.lr=.inf", "train.lr"),
    ("train.lr=.nan", "train.lr"),
    ("evaluate.temperature=.inf", "evaluate.temperature"),
    ("score.reward_timeout_s=.inf", "score.reward_timeout_s"),
    ("run.steps=9223372036854775808", "run.steps"),
    ("run.seed=9223372036854775808", "run.seed"),
    ("train.dual_clip_c=.inf", "train.dual_clip_c"),
    ("rollout.max_response_tokens=100000000", "rollout.max_response_tokens"),
    ("run.prompts_per_round=100000000", "rollout.samples_per_prompt"),  # the size estimate names its fields
])
def test_unbounded_values_are_refused_at_load_naming_the_field(override: str, named: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(TINY, [override])
    message = str(info.value)
    assert f"--set {override}" in message or named in message, message
    assert named in message and "\n" not in message, message


def test_the_size_estimate_names_every_field_it_multiplies() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(TINY, ["run.prompts_per_round=100000", "rollout.samples_per_prompt=1024"])
    message = str(info.value)
    for field in ("run.prompts_per_round", "rollout.samples_per_prompt", "rollout.max_response_tokens"):
        assert field in message, message
    assert "GiB" in message


def test_the_shipped_configs_fit_their_bounds() -> None:
    for path in sorted((REPO / "configs").glob("*.yaml")):
        load_config(path)


def test_a_set_value_that_is_not_yaml_is_its_text_for_a_string_field() -> None:
    config = load_config(TINY, ["curate.prompt_template={problem}="])
    assert config.curate.prompt_template == "{problem}="
    with pytest.raises(ConfigError, match=r"--set train\.lr=\{x:: expected a number, got .\{x:."):
        load_config(TINY, ["train.lr={x:"])


def test_a_nul_in_a_name_is_refused_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--set run\.name=a\x00b: run\.name=.* NUL"):
        load_config(TINY, ["run.name=a\x00b"])
    config = tmp_path / "nul.yaml"
    config.write_text('run:\n  data: ["synthetic:n=10@train", "a\\0b@test"]\n')
    with pytest.raises(ConfigError, match=r"nul\.yaml: run\.data.* NUL"):
        load_config(config)


def _numeric_fields() -> list[tuple[str, str, type]]:
    out = []
    for section, cls in _stage_classes().items():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            kind = next((t for t in (bool, int, float) if t in (hints[f.name], *typing.get_args(hints[f.name]))), None)
            if kind in (int, float):
                out.append((section, f.name, kind))
    return out


NUMERIC = _numeric_fields()
VALUES = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, 2, 2**31, 2**63 - 1, 2**63, 2**64, -(2**63) - 1]),
    st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=False),
    st.sampled_from([math.inf, -math.inf, math.nan, 1e308, 0.5, 1.0]),
)


@settings(max_examples=300, deadline=None)
@given(field=st.sampled_from(NUMERIC), value=VALUES)
def test_any_value_of_any_numeric_field_builds_or_is_a_config_error(field: tuple[str, str, type], value: object) -> None:
    """Finite, infinite or huge: load_config either builds the config or raises ConfigError, never
    anything else; what it builds is finite and fits int64."""
    section, name, kind = field
    try:
        config = load_config(TINY, [f"{section}.{name}={value!r}" if not isinstance(value, float) or math.isfinite(value)
                                    else f"{section}.{name}={'.nan' if math.isnan(value) else ('.inf' if value > 0 else '-.inf')}"])
    except ConfigError:
        return
    got = getattr(getattr(config, section), name)
    if isinstance(got, float):
        assert math.isfinite(got)
    elif isinstance(got, int):
        assert -(2**63) <= got < 2**63


def test_a_stage_config_refuses_an_unbounded_value_directly() -> None:
    from settings.rollout import RolloutConfig
    from settings.train import TrainConfig

    with pytest.raises(FieldError, match="samples_per_prompt"):
        RolloutConfig(samples_per_prompt=10**9)
    with pytest.raises(FieldError, match="lr"):
        TrainConfig(lr=math.inf)
    with pytest.raises(FieldError, match="seed"):
        TrainConfig(seed=2**63)
