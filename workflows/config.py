"""Run configs: YAML files in configs/ loaded into the stage dataclasses, with CLI overrides.

A run config has one section per stage (``curate``, ``bootstrap``, ``rollout``, ``score``,
``train``, ``evaluate``) plus ``run`` for the driver loop and ``tracking`` for the experiment
trackers (which record, never change, what is computed: :data:`NOT_COMPUTED`). Each section becomes that stage's
frozen dataclass (settings/); ``--set section.field=value`` overrides one field
(the value is parsed as YAML, so ``--set train.lr=3e-4`` is a float). Unknown sections or
fields, and values of the wrong type, are errors that name the file and the field. Settings
that follow from others are derived when a config leaves them out (:data:`DERIVED`: the
evaluation length cap and Dr.GRPO's normaliser from ``rollout.max_response_tokens``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from readers.problem_files import CurationError, gives_test_split
from settings.bootstrap import BootstrapConfig
from settings.checks import FieldError
from settings.curate import CurateConfig
from settings.evaluate import EvalConfig
from settings.rollout import RolloutConfig
from settings.run import DriverConfig
from settings.score import ScoreConfig
from settings.tracking import TrackingConfig
from settings.train import TrainConfig


# The configs shipped in the checkout (configs/): a command's default config is found there from
# any working folder, not only from the checkout's root.
SHIPPED_CONFIGS = Path(__file__).resolve().parents[1] / "configs"


class ConfigError(ValueError):
    """A run config is malformed; the message names the file and the field."""


# Fields that decide which finished files are kept, never what is computed: outside
# RunConfig.digest(), and free to change when a run folder is resumed (workflows/run_binding.py).
STORAGE_ONLY = ("run.keep_optimizer_checkpoints", "run.keep_weights_every_steps", "train.optimizer_state_every")
# Fields added after runs were recorded, each with the value that computes what a config without it
# computed: at that value the field stays out of RunConfig.digest() (a config that leaves it there
# keeps the digest it had before the field existed), and a run.json that lacks it reads as holding
# it (workflows/run_binding.py). Any other value is in the digest like every computed field.
ADDED_AT = {"run.pipelined": False, "rollout.sleep_between_rounds": True, "run.round_size": "fixed"}


def _stage_classes() -> dict[str, type]:
    return {
        "run": DriverConfig,
        "curate": CurateConfig,
        "bootstrap": BootstrapConfig,
        "rollout": RolloutConfig,
        "score": ScoreConfig,
        "train": TrainConfig,
        "evaluate": EvalConfig,
        "tracking": TrackingConfig,
    }


# Sections that say where results are recorded, not what is computed: outside RunConfig.digest()
# and outside the run-folder binding (a resumed run may turn a tracker on).
NOT_COMPUTED = ("tracking",)


@dataclass(frozen=True)
class RunConfig:
    """Every stage's config for one run; built by :func:`load_config`."""

    run: DriverConfig
    curate: CurateConfig
    bootstrap: BootstrapConfig
    rollout: RolloutConfig
    score: ScoreConfig
    train: TrainConfig
    evaluate: EvalConfig
    tracking: TrackingConfig
    source: str = ""  # the YAML file it came from (for messages and the run record)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: dataclasses.asdict(getattr(self, f.name)) for f in dataclasses.fields(self) if f.name != "source"}
        return out

    def digest(self) -> str:
        """A short hash of every field that changes results (all but the sections :data:`NOT_COMPUTED`,
        the fields :data:`STORAGE_ONLY`, and those of :data:`ADDED_AT` at their old behaviour): two
        runs with the same digest compute the same things."""
        computed = {k: v for k, v in self.to_dict().items() if k not in NOT_COMPUTED}
        for key in STORAGE_ONLY:
            section, _, field = key.partition(".")
            computed[section].pop(field, None)
        for key, value in ADDED_AT.items():
            section, _, field = key.partition(".")
            if computed[section].get(field) == value:
                del computed[section][field]
        blob = json.dumps(computed, sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:12]


def _coerce(value: Any, annotation: Any, where: str) -> Any:
    """Check/convert a YAML value against a dataclass field annotation (a small, strict subset)."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, where)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(f"{where}: {value!r} matches none of {annotation}")
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"{where}: {value!r} is not one of {list(args)}")
        return value
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        inner = args[0] if args else Any
        items = [_coerce(v, inner, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if annotation is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true/false, got {value!r}")
        return value
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if annotation is float:
        if isinstance(value, str):
            # PyYAML (YAML 1.1) reads "3e-4" as a string; accept what Python reads as a float.
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if annotation is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    return value


def _build(cls: type, values: dict[str, Any], where: str, blame: dict[str, str] | None = None) -> Any:
    """``cls(**values)`` with every value checked; ``blame`` maps a field to the ``--set`` that gave it.

    ``where`` is ``"<file>: <section>"``; an error about a field set by ``--set`` names that
    ``--set`` instead of the file.
    """
    blame = blame or {}
    section = where.rpartition(": ")[2]

    def at(name: str) -> str:
        return f"--set {blame[name]}" if name in blame else f"{where}.{name}"

    if not isinstance(values, dict):
        raise ConfigError(f"{where}: expected a mapping of fields, got {values!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - fields)
    for name in unknown:
        if name in blame:
            raise ConfigError(f"{at(name)}: unknown field {name!r} of {section}; known: {sorted(fields)}")
    if unknown:
        raise ConfigError(f"{where}: unknown field(s) {unknown}; known: {sorted(fields)}")
    kwargs = {k: _coerce(v, hints[k], at(k)) for k, v in values.items()}
    try:
        return cls(**kwargs)
    except FieldError as err:
        raise ConfigError(f"{at(err.field)}: {section}.{err}") from None
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{where}: {err}") from err


def parse_overrides(overrides: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``["train.lr=3e-4", "run.steps=2"]`` -> ``{"train": {"lr": 3e-4}, "run": {"steps": 2}}``."""
    out: dict[str, dict[str, Any]] = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        section, dot, field = key.strip().partition(".")
        if not sep or not dot or not section or not field:
            raise ConfigError(f"--set {item!r}: expected SECTION.FIELD=VALUE, e.g. train.lr=3e-4")
        out.setdefault(section, {})[field] = _override_value(raw)
    return out


def _override_value(raw: str) -> Any:
    """A ``--set`` value parsed as YAML; text that is not YAML (``{problem}=``, a NUL) is the text
    typed, so a string field takes it as it stands and any other field refuses it as the wrong type,
    naming the ``--set``."""
    if not raw.strip():
        return ""
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw


def config_from_dict(sections: dict[str, Any], *, source: str = "<dict>", overrides: Sequence[str] = ()) -> RunConfig:
    """Build a RunConfig from ``{section: {field: value}}`` (the YAML's shape, or ``RunConfig.to_dict()``).

    Every check that needs no data is done here, before any work starts: each stage
    dataclass checks its own fields, and :func:`_check_run` the fields that only matter, or
    only make sense together, in a training run.
    """
    classes = _stage_classes()
    unknown = sorted(set(sections) - set(classes))
    if unknown:
        raise ConfigError(f"{source}: unknown section(s) {unknown}; known: {sorted(classes)}")
    for name, fields in sections.items():
        if fields is not None and not isinstance(fields, dict):
            raise ConfigError(f"{source}: section {name!r} must be a mapping of fields, got {fields!r}")
    merged = {name: dict(sections.get(name) or {}) for name in classes}
    blame: dict[str, dict[str, str]] = {name: {} for name in classes}
    for item in overrides:
        for section, fields in parse_overrides([item]).items():
            if section not in classes:
                raise ConfigError(f"--set {item}: unknown section {section!r}; known: {sorted(classes)}")
            merged[section].update(fields)
            blame[section].update({field: item for field in fields})
    _derive(merged)
    built = {name: _build(cls, merged[name], f"{source}: {name}", blame[name]) for name, cls in classes.items()}
    config = RunConfig(**built, source=source)
    _check_run(config, source, blame)
    return config


# Settings a run config derives from another section when it does not set them itself:
# (section, field) <- (section, field), and when the derivation applies.
DERIVED: dict[tuple[str, str], tuple[tuple[str, str], str]] = {
    # Held-out answers get the training response cap (the paper evaluates at the training length).
    ("evaluate", "max_response_tokens"): (("rollout", "max_response_tokens"), "always"),
    # Dr.GRPO's constant normaliser is the response cap (Liu et al. 2025), needed by that aggregation only.
    ("train", "loss_norm_tokens"): (("rollout", "max_response_tokens"), "seq-mean-token-sum-norm"),
}


def _derive(merged: dict[str, dict[str, Any]]) -> None:
    """Fill each :data:`DERIVED` field the sections leave unset from its source field (in place)."""
    for (section, field), ((source_section, source_field), when) in DERIVED.items():
        if field in merged[section] or source_field not in merged[source_section]:
            continue
        if when == "always" or merged["train"].get("loss_agg") == when:
            merged[section][field] = merged[source_section][source_field]


def _check_run(config: RunConfig, source: str, blame: dict[str, dict[str, str]]) -> None:
    """Checks across sections, and those that hold for training rollouts only (not for evaluation)."""

    def fail(section: str, err: FieldError) -> None:
        where = f"--set {blame[section][err.field]}" if err.field in blame[section] else f"{source}: {section}.{err.field}"
        raise ConfigError(f"{where}: {section}.{err}")

    try:
        config.rollout.check_for_training()
    except FieldError as err:
        fail("rollout", err)
    try:
        has_test_split = gives_test_split(config.run.data, config.curate.test_fraction)
    except CurationError as err:
        fail("run", FieldError("data", list(config.run.data), f"holds a bad input spec: {err}"))
    if not has_test_split:
        # Held-out evaluation needs a test split; found out after curation, the run folder would
        # already hold this config (workflows/run_binding.py).
        where = f"--set {blame['run']['data']}" if "data" in blame["run"] else f"{source}: run.data"
        raise ConfigError(
            f"{where}: no input gives a held-out (test) split, which evaluation needs: set curate.test_fraction "
            "> 0, mark an input @test, or give a synthetic input test_fraction=F (e.g. "
            "synthetic:n=2000,seed=0,test_fraction=0.2)")
    _check_round_size(config, source)
    score, max_tokens = config.score, config.rollout.max_response_tokens
    if score.soft_overlong_punishment and score.overlong_buffer_tokens > max_tokens:
        # dapo_core/overlong.py: L_cache must fit inside L_max (eq. 13).
        fail("score", FieldError("overlong_buffer_tokens", score.overlong_buffer_tokens,
                                 f"must be <= rollout.max_response_tokens={max_tokens} (L_cache within L_max, eq. 13)"))


# The size estimate of one rollout round, refused above a budget before any work: the driver's
# process holds a round's rows (token ids and log-probs, 4 bytes each; response text; the scored
# copy), ~16 bytes a token. The paper's config (1,536 prompts x 16 x 20,480 tokens) is ~7.5 GiB.
ROUND_BYTES_PER_TOKEN = 16
ROUND_BUDGET_GIB = 32


def _check_round_size(config: RunConfig, source: str) -> None:
    """Refuse a round whose rows would not fit :data:`ROUND_BUDGET_GIB`, naming the fields multiplied."""
    prompts, group, tokens = config.run.prompts_per_round, config.rollout.samples_per_prompt, config.rollout.max_response_tokens
    gib = prompts * group * tokens * ROUND_BYTES_PER_TOKEN / 2**30
    if gib > ROUND_BUDGET_GIB:
        raise ConfigError(
            f"{source}: one rollout round of run.prompts_per_round={prompts} x rollout.samples_per_prompt={group} x "
            f"rollout.max_response_tokens={tokens} tokens holds ~{gib:,.0f} GiB of rows ({ROUND_BYTES_PER_TOKEN} bytes a "
            f"token), over the {ROUND_BUDGET_GIB} GiB budget: lower one of them")


def stage_config(section: str, config_path: str | Path | None = None, overrides: Sequence[str] = ()) -> Any:
    """One stage's config for that stage's own CLI (``dapo score``, ``dapo train``, ...).

    Starts from ``config_path``'s section when given, else from the dataclass defaults; each
    override is ``FIELD=VALUE`` or ``SECTION.FIELD=VALUE`` and is checked like a YAML value.
    """
    classes = _stage_classes()
    if section not in classes:
        raise ConfigError(f"unknown stage section {section!r}; known: {sorted(classes)}")
    qualified = [item if "." in item.partition("=")[0] else f"{section}.{item}" for item in overrides]
    if config_path is not None:
        return getattr(load_config(config_path, qualified), section)
    fields = parse_overrides(qualified)
    other = sorted(set(fields) - {section})
    if other:
        raise ConfigError(f"--set: only {section}.FIELD overrides apply here, got section(s) {other}")
    blame = {field: item for item in qualified for field in parse_overrides([item]).get(section, {})}
    return _build(classes[section], fields.get(section, {}), f"--set {section}", blame)


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> RunConfig:
    """Read a YAML run config, apply ``--set`` overrides, and build every stage dataclass."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError as err:
        raise ConfigError(f"{path}: config file not found") from err
    except IsADirectoryError as err:
        raise ConfigError(f"{path}: is a folder, not a config file (e.g. configs/tiny-cpu.yaml)") from err
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from err
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    return config_from_dict(raw, source=str(path), overrides=overrides)
