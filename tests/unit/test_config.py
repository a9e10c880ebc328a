"""Run configs: YAML -> stage dataclasses, --set overrides, and errors that name the field."""

import json
from pathlib import Path

import pytest

from settings.checks import FieldError
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
        (["train.learning_rate=1"], r"^--set train\.learning_rate=1: unknown field 'learning_rate' of train"),
        (["run.steps=two"], r"^--set run\.steps=two: expected an integer"),
        (["train.lr=fast"], r"^--set train\.lr=fast: expected a number"),
        (["score.dynamic_sampling=1"], r"^--set score\.dynamic_sampling=1: expected true/false"),
        (["nosection.x=1"], r"^--set nosection\.x=1: unknown section 'nosection'"),
        (["trainlr=1"], r"expected SECTION\.FIELD=VALUE"),
        (["train.zero_stage=4"], r"^--set train\.zero_stage=4: train\.zero_stage=4 must be 1, 2 or 3"),
        (["train.keep_workers_warm=false", "train.optimizer_state_every=5"],
         r"train\.optimizer_state_every=5 must be .* 1 with keep_workers_warm false"),
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
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("run: 5\n")
    with pytest.raises(ConfigError, match=r"section 'run' must be a mapping of fields, got 5"):
        load_config(scalar)
    with pytest.raises(ConfigError, match="is a folder, not a config file"):
        load_config(tmp_path)


def test_a_run_without_a_held_out_split_is_refused_at_load_time(tmp_path: Path) -> None:
    """Evaluation needs a test split; without one a run failed after curation, its folder already bound
    to the config. Every default gives none: an empty config file is refused before any work."""
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    with pytest.raises(ConfigError, match=r"empty\.yaml: run\.data: no input gives a held-out \(test\) split"):
        load_config(empty)
    with pytest.raises(ConfigError, match=r"^--set run\.data=.*no input gives a held-out"):
        load_config(empty, ["run.data=[a.jsonl@train]"])
    for fixed in (["curate.test_fraction=0.2"], ["run.data=[a.jsonl@train, b.jsonl@test]"],
                  ["run.data=['synthetic:n=100,test_fraction=0.3']"], ["run.data=[hf:some/set]"]):
        load_config(empty, fixed)
    with pytest.raises(ConfigError, match=r"run\.data.*synthetic option 'n' is not key=value"):
        load_config(empty, ["run.data=['synthetic:n']"])


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
    with pytest.raises(ConfigError, match=r"--set rollout\.nope=1: unknown field 'nope'"):
        stage_config("rollout", None, ["nope=1"])


# Every check that needs no data runs at load time: (override, the field the message must name).
BAD_VALUES = [
    ("train.epochs_per_step=0", "train.epochs_per_step"),
    ("train.eps_low=-0.1", "train.eps_low"),
    ("train.eps_low=1.0", "train.eps_low"),
    ("train.eps_high=0.1", "train.eps_high"),  # below eps_low=0.2
    ("train.lr=0", "train.lr"),
    ("train.lr=-1e-4", "train.lr"),
    ("rollout.samples_per_prompt=1", "rollout.samples_per_prompt"),
    ("rollout.max_response_tokens=0", "rollout.max_response_tokens"),
    ("rollout.temperature=0.7", "rollout.temperature"),
    ("rollout.top_p=0.9", "rollout.top_p"),
    ("run.prompts_per_round=0", "run.prompts_per_round"),
    ("run.prompts_per_step=0", "run.prompts_per_step"),
    ("run.max_rounds=0", "run.max_rounds"),
    ("run.on_max_rounds=retry", "run.on_max_rounds"),
    ("run.steps=-1", "run.steps"),
    ("run.name=a/b", "run.name"),
    ("score.overlong_buffer_tokens=33", "score.overlong_buffer_tokens"),  # > rollout.max_response_tokens=32
    ("score.informative_by=mean", "score.informative_by"),
    ("evaluate.top_p=0", "evaluate.top_p"),
    ("bootstrap.num_heads=3", "bootstrap.num_heads"),  # does not divide hidden_size=128
    ("curate.test_fraction=1.0", "curate.test_fraction"),
]


@pytest.mark.parametrize(("override", "field"), BAD_VALUES)
def test_bad_values_are_refused_at_load_time_and_blamed_on_the_set(override: str, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(REPO / "configs" / "tiny-cpu.yaml", [override])
    message = str(info.value)
    assert message.startswith(f"--set {override}: {field}="), message
    assert "\n" not in message


def test_a_bad_value_in_the_file_is_blamed_on_the_file(tmp_path: Path) -> None:
    text = (REPO / "configs" / "tiny-cpu.yaml").read_text().replace("  top_p: 1.0\n", "  top_p: 0.7\n", 1)
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    with pytest.raises(ConfigError, match=rf"^{bad}: rollout\.top_p: rollout\.top_p=0\.7 must be 1\.0: the trainer"):
        load_config(bad)
    # ... and a --set that fixes it is accepted.
    assert load_config(bad, ["rollout.top_p=1.0"]).rollout.top_p == 1.0


def test_evaluation_may_sample_differently_from_training() -> None:
    from settings.rollout import RolloutConfig

    # evaluate reuses RolloutConfig for its engine at its own temperature / top_p / k.
    config = RolloutConfig(samples_per_prompt=1, top_p=0.7, temperature=0.6)
    assert config.top_p == 0.7
    cfg = load_config(REPO / "configs" / "tiny-cpu.yaml", ["evaluate.top_p=0.5", "evaluate.samples_per_problem=1"])
    assert cfg.evaluate.top_p == 0.5


def test_length_caps_are_derived_from_the_rollout_cap_unless_set() -> None:
    from workflows.config import load_config

    config = load_config(REPO / "configs" / "tiny-cpu.yaml", ["rollout.max_response_tokens=48"])
    assert config.evaluate.max_response_tokens == 48  # follows the rollout cap
    assert config.train.loss_norm_tokens == 0  # token-mean needs no normaliser: not derived
    drgrpo = load_config(REPO / "configs" / "tiny-cpu.yaml", ["rollout.max_response_tokens=48",
                                                             "train.loss_agg=seq-mean-token-sum-norm"])
    assert drgrpo.train.loss_norm_tokens == 48  # Dr.GRPO's normaliser = the response cap
    own = load_config(REPO / "configs" / "tiny-cpu.yaml", ["rollout.max_response_tokens=48",
                                                          "evaluate.max_response_tokens=20"])
    assert own.evaluate.max_response_tokens == 20  # an explicit value wins


def test_retention_fields_are_checked_and_default_to_keeping_everything() -> None:
    from settings.run import DriverConfig

    assert DriverConfig().keep_optimizer_checkpoints == 0 and DriverConfig().keep_weights_every_steps == 0
    DriverConfig(keep_optimizer_checkpoints=2, keep_weights_every_steps=25)
    with pytest.raises(FieldError, match="keep_optimizer_checkpoints"):
        DriverConfig(keep_optimizer_checkpoints=-1)
    with pytest.raises(FieldError, match="keep_weights_every_steps"):
        DriverConfig(keep_weights_every_steps=5)  # weights-only pruning needs K >= 1


def test_paper_config_sets_a_retention_policy() -> None:
    cfg = load_config(REPO / "configs" / "qwen2.5-32b-dapo.yaml")
    assert cfg.run.keep_optimizer_checkpoints >= 1 and cfg.run.keep_weights_every_steps >= 1


def test_retention_is_outside_the_config_digest() -> None:
    # Retention decides what is stored, never what is computed: the run's digest ignores it.
    plain = load_config(REPO / "configs" / "tiny-cpu.yaml")
    pruned = load_config(REPO / "configs" / "tiny-cpu.yaml",
                         ["run.keep_optimizer_checkpoints=1", "run.keep_weights_every_steps=2"])
    assert plain.digest() == pruned.digest()
    assert plain.digest() != load_config(REPO / "configs" / "tiny-cpu.yaml", ["run.steps=7"]).digest()


def test_pipelined_is_in_the_digest_but_a_default_config_keeps_its_digest() -> None:
    # run.pipelined changes what is computed (rollouts from an older policy), so it is in the
    # digest; at its default (synchronous) the digest is the one configs had before the field.
    import hashlib
    import json

    sync = load_config(REPO / "configs" / "tiny-cpu.yaml")
    piped = load_config(REPO / "configs" / "tiny-cpu.yaml", ["run.pipelined=true"])
    assert sync.run.pipelined is False and piped.run.pipelined is True
    assert piped.digest() != sync.digest()
    before = sync.to_dict()
    del before["tracking"]
    del before["run"]["pipelined"], before["run"]["keep_optimizer_checkpoints"], before["run"]["keep_weights_every_steps"]
    del before["rollout"]["sleep_between_rounds"]  # added later too (ADDED_AT): computes nothing at True
    del before["run"]["round_size"]  # added later too (ADDED_AT): "fixed" draws what configs drew before it
    del before["train"]["optimizer_state_every"]  # STORAGE_ONLY: decides what is stored, not computed
    assert sync.digest() == hashlib.sha256(json.dumps(before, sort_keys=True, default=str).encode()).hexdigest()[:12]


def test_round_size_is_in_the_digest_but_fixed_keeps_the_digest_and_a_bad_value_is_named() -> None:
    # Adaptive rounds draw other problems (other rollout inputs, other batches): another run, so
    # another digest, and a run folder bound to one refuses the other (workflows/run_binding.py).
    from workflows.run_binding import refusing_changes

    fixed = load_config(REPO / "configs" / "tiny-cpu.yaml")
    adaptive = load_config(REPO / "configs" / "tiny-cpu.yaml", ["run.round_size=adaptive"])
    assert fixed.run.round_size == "fixed" and adaptive.run.round_size == "adaptive"
    assert adaptive.digest() != fixed.digest()
    assert fixed.digest() == load_config(REPO / "configs" / "tiny-cpu.yaml", ["run.round_size=fixed"]).digest()
    recorded = fixed.to_dict()
    del recorded["run"]["round_size"]  # a run.json written before the field: it drew fixed rounds
    assert refusing_changes(recorded, fixed.to_dict()) == []
    assert refusing_changes(recorded, adaptive.to_dict()) == [("run.round_size", "fixed", "adaptive")]
    with pytest.raises(ConfigError, match=r"^--set run\.round_size=elastic: run\.round_size=.*must be one of \['fixed', 'adaptive'\]"):
        load_config(REPO / "configs" / "tiny-cpu.yaml", ["run.round_size=elastic"])


def test_pipelined_retention_keeps_the_policy_the_next_rollouts_use() -> None:
    from settings.run import DriverConfig

    DriverConfig(pipelined=True, keep_optimizer_checkpoints=2, keep_weights_every_steps=5)
    DriverConfig(pipelined=True)  # keep every checkpoint whole
    with pytest.raises(FieldError, match="keep_optimizer_checkpoints"):
        DriverConfig(pipelined=True, keep_optimizer_checkpoints=1)  # would prune the weights step N+1 generates from


def test_the_default_configs_are_found_from_any_working_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`dapo run` and `dapo ablate` without --config, run outside the checkout's root."""
    from cli.main import build_parser

    monkeypatch.chdir(tmp_path)
    for command, name in (("run", "tiny-cpu.yaml"), ("ablate", "ablation-addsub.yaml")):
        args = build_parser([command]).parse_args([command])
        assert Path(args.config) == REPO / "configs" / name
        load_config(args.config)


def test_a_shipped_policy_was_made_by_the_bootstrap_section_of_the_configs_that_import_it() -> None:
    # Each config that imports assets/policies/NAME says its own bootstrap section (with source: tiny)
    # makes it again; the policy's lineage records the warm-up's settings, so they must be the section's.
    from dataclasses import asdict

    from settings.bootstrap import BootstrapConfig

    checked = []
    for path in sorted((REPO / "configs").glob("*.yaml")):
        section = load_config(path).bootstrap
        if not section.source.startswith("shipped:"):
            continue
        name = section.source.removeprefix("shipped:")
        lineage = json.loads((REPO / "assets" / "policies" / name / "dapo_checkpoint.json").read_text())["inputs"]
        made_with = {**asdict(BootstrapConfig()), **lineage["config"]}  # fields added since: their defaults
        expected = {**asdict(section), "source": "tiny", "link_import": False}
        assert made_with == expected, (path.name, {k: (made_with[k], v) for k, v in expected.items() if made_with[k] != v})
        checked.append((path.name, name))
    assert ("ablation-checks.yaml", "tiny-addsub30-checks") in checked and ("tiny-cpu.yaml", "tiny-addsub30") in checked
