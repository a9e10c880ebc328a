"""The ablation ladder's configs (cumulative deltas) and its table, on hand-made run results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workflows.ablation import check_ladder_ends_at, ladder, rung_config, rung_settings
from reports.ablation import format_table, rung_row, write_ablation
from workflows.config import ConfigError, load_config

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def base():
    return load_config(REPO / "configs" / "ablation-tiny.yaml")


def test_naive_rung_is_grpo(base) -> None:
    cfg = rung_config(base, rung_settings(ladder(base), 0), seed=3, name="n")
    assert cfg.train.eps_high == cfg.train.eps_low == 0.2  # symmetric clip
    assert cfg.train.loss_agg == "seq-mean-token-mean"  # sample-level loss
    assert cfg.score.truncated_is_wrong and not cfg.score.overlong_filtering
    assert not cfg.score.soft_overlong_punishment and not cfg.score.dynamic_sampling
    assert (cfg.run.prompts_per_round, cfg.run.max_rounds) == (cfg.run.prompts_per_step, 1)  # no over-sampling
    assert (cfg.run.seed, cfg.train.seed, cfg.run.name) == (3, 3, "n")


def test_each_rung_adds_exactly_its_technique(base) -> None:
    rungs = ladder(base)
    assert [r.name for r in rungs] == ["naive GRPO", "+ overlong filtering", "+ clip-higher",
                                       "+ soft overlong punishment", "+ token-level loss", "+ dynamic sampling (DAPO)"]
    configs = [rung_config(base, rung_settings(rungs, i), seed=0, name="x").to_dict() for i in range(len(rungs))]
    changed = []
    for before, after in zip(configs, configs[1:]):
        changed.append(sorted(f"{s}.{f}" for s in after for f in after[s] if after[s][f] != before[s][f]))
    assert changed == [
        ["score.overlong_filtering"],
        ["train.eps_high"],
        ["score.soft_overlong_punishment"],
        ["train.loss_agg"],
        ["run.max_rounds", "run.prompts_per_round", "score.dynamic_sampling"],
    ]


def test_last_rung_is_the_config_file(base) -> None:
    rungs = ladder(base)
    last = rung_config(base, rung_settings(rungs, len(rungs) - 1), seed=base.run.seed, name=base.run.name)
    assert last.to_dict() == base.to_dict()


@pytest.mark.parametrize("name", ["ablation-addsub.yaml", "ablation-checks.yaml", "ablation-tiny.yaml"])
def test_the_shipped_ladder_configs_are_their_own_last_rung(name: str) -> None:
    config = load_config(REPO / "configs" / name)
    check_ladder_ends_at(config)
    rungs = ladder(config)
    last = rung_config(config, rung_settings(rungs, len(rungs) - 1), seed=config.run.seed, name=config.run.name)
    assert last.to_dict() == config.to_dict()


def test_a_config_the_last_rung_would_not_reproduce_is_refused(tmp_path: Path) -> None:
    # The main job leaves overlong filtering and truncated-is-wrong off, which rungs 0 and 1 turn on:
    # its "DAPO" rung would have been another config than `dapo run` of the same file.
    main = load_config(REPO / "configs" / "tiny-cpu.yaml")
    with pytest.raises(ConfigError) as refused:
        check_ladder_ends_at(main)
    text = str(refused.value)
    assert "score.overlong_filtering is False where the rungs set True" in text
    assert "score.truncated_is_wrong is False where the rungs set True" in text
    assert "--set score.truncated_is_wrong=true --set score.overlong_filtering=true" in text
    from cli.main import main as dapo

    assert dapo(["ablate", "--config", str(REPO / "configs" / "tiny-cpu.yaml"), "--run-root", str(tmp_path)]) == 2
    assert list(tmp_path.iterdir()) == []  # refused before any folder was made


def test_the_clip_higher_rung_adds_the_configs_own_upper_clip(tmp_path: Path) -> None:
    # A config with its own decoupled clip (here 0.1 / 0.14): the ladder's naive rung clips both sides
    # at the lower value, clip-higher raises the upper one to the config's, so the last rung is the file.
    config = rung_config(load_config(REPO / "configs" / "ablation-addsub.yaml"),
                         {"train.eps_low": 0.1, "train.eps_high": 0.14}, seed=0, name="tight")
    check_ladder_ends_at(config)
    rungs = ladder(config)
    configs = [rung_config(config, rung_settings(rungs, i), seed=0, name="tight") for i in range(len(rungs))]
    assert [(c.train.eps_low, c.train.eps_high) for c in configs] == [(0.1, 0.1)] * 2 + [(0.1, 0.14)] * 4
    assert configs[-1].to_dict() == config.to_dict()


def test_a_config_without_clip_higher_is_refused_by_the_ladder() -> None:
    # eps_high == eps_low: the clip-higher rung would repeat the rung below it, runs for nothing.
    config = rung_config(load_config(REPO / "configs" / "ablation-addsub.yaml"), {"train.eps_high": 0.2},
                         seed=0, name="symmetric")
    with pytest.raises(ConfigError, match=r"train.eps_high \(0.2\) is not above train.eps_low \(0.2\)"):
        check_ladder_ends_at(config)


def test_the_default_ladder_is_the_main_job_with_the_two_settings_the_rungs_add() -> None:
    # So benchmarks/ablation.md (run on the main job's config with these two settings) is what
    # `dapo ablate` gives by default, rung for rung.
    ladder_config = load_config(REPO / "configs" / "ablation-addsub.yaml")
    main = load_config(REPO / "configs" / "tiny-cpu.yaml",
                       ["score.overlong_filtering=true", "score.truncated_is_wrong=true"])
    for index in range(len(ladder(main))):
        ours, theirs = (rung_config(c, rung_settings(ladder(c), index), seed=1, name="same").to_dict()
                        for c in (ladder_config, main))
        assert ours == theirs, index


def _run(seed: int, final: float, entropy: list[float]) -> dict:
    metrics = [{"step": i + 1, "entropy": e, "response_length_mean": 20.0, "truncation_ratio": 0.1, "accuracy": 0.5,
                "generation_rounds": 2, "clip_frac_high": 0.01, "clip_frac_low": 0.02} for i, e in enumerate(entropy)]
    evals = [{"step": 0, "avg_at_k": 0.3, "pass_at_k": 0.5, "maj_at_k": 0.3},
             {"step": len(entropy), "avg_at_k": final, "pass_at_k": 0.6, "maj_at_k": 0.4}]
    summary = {"accuracy_before": 0.3, "accuracy_after": final, "pass_at_k_after": 0.6, "evals": evals, "eval_k": 4,
               "eval_problems": 100, "steps": len(entropy), "wall_seconds": 10.0}
    return {"seed": seed, "summary": summary, "metrics": metrics}


def test_table_rows_hand_worked(tmp_path: Path, base) -> None:
    results = [
        {"name": "naive GRPO", "settings": {"train.eps_high": 0.2}, "runs": [_run(0, 0.30, [1.0] * 4), _run(1, 0.40, [0.6] * 4)]},
        {"name": "+ dynamic sampling (DAPO)", "settings": {"score.dynamic_sampling": True},
         "runs": [_run(0, 0.50, [1.0, 1.0, 1.0, 0.8]), _run(1, 0.60, [1.0, 1.0, 1.0, 0.4])]},
    ]
    row = rung_row(results[0])
    assert row["accuracy"] == [0.30, 0.40] and row["accuracy_mean"] == pytest.approx(0.35)
    assert row["accuracy_std"] == pytest.approx(0.0707107, rel=1e-5)  # sample std of (0.3, 0.4)
    assert row["entropy_last_quarter"] == pytest.approx(0.8)  # last step of 4: (1.0 + 0.6) / 2
    assert rung_row(results[1])["entropy_last_quarter"] == pytest.approx(0.6)
    assert rung_row(results[1])["entropy_final"] == [0.8, 0.4]  # each seed's last step
    assert rung_row(results[1])["entropy_tail"] == [0.8, 0.4]  # each seed's last quarter (1 of 4 steps)
    assert row["generation_rounds_total"] == [8, 8]

    table, page = write_ablation(tmp_path, results, base=base, seconds=1.0)
    written = json.loads((tmp_path / "ablation.json").read_text())
    assert [r["name"] for r in written] == ["naive GRPO", "+ dynamic sampling (DAPO)"]
    assert written[1]["config"] == {"score.dynamic_sampling": True} and written[1]["accuracy"] == [0.5, 0.6]
    assert (tmp_path / "curves.png").stat().st_size > 10_000 and "base64" in page
    text = format_table(table)
    assert "| naive GRPO | 35.0% +/- 7.1% | 30.0%, 40.0% | - | reference |" in text
    # Welch: se = sqrt(0.005/2 + 0.005/2) = 0.0707 points-fraction; t(0.975, 1 df) = 12.706 -> +/- 89.8 pts
    assert "| + dynamic sampling (DAPO) | 55.0% +/- 7.1% | 50.0%, 60.0% | +20.0 pts (+/- 89.8) | +20.0 pts (+/- 89.8) |" in text


# ----------------------------------------------------------------------------- the ladder folder


def _ablate(run_root: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    """``dapo ablate`` of configs/ablation-tiny.yaml into ``run_root``, with the ladder itself replaced by a
    failure: only the checks before it run."""
    from workflows import ablation
    from cli.main import main

    def started(*args: object, **kwargs: object) -> None:
        raise AssertionError("the ladder was started")

    monkeypatch.setattr(ablation, "run_driver_locally", started)
    return main(["ablate", "--config", str(REPO / "configs" / "ablation-tiny.yaml"), "--run-root", str(run_root),
                 "--seeds", "0", "--rungs", "0"])


def _finished_run(folder: Path) -> None:
    """What `dapo run` leaves in a run folder (the parts a ladder never writes at its top)."""
    for sub in ("curate", "checkpoints/step-0001", "logs"):
        (folder / sub).mkdir(parents=True)
    (folder / "run.json").write_text("{}")
    (folder / "summary.json").write_text("{}")
    (folder / "logs" / "dapo.log").write_text("the run's own log\n")


@pytest.mark.parametrize("kind", ["a finished dapo run", "another folder"])
def test_a_folder_of_the_ladders_name_that_is_no_ladder_is_refused_leaving_it_as_it_was(
        kind: str, tmp_path: Path, base, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / f"{base.run.name}-ladder"  # `dapo run --set run.name=<name>-ladder` made it
    if kind == "a finished dapo run":
        _finished_run(folder)
    else:
        folder.mkdir()
        (folder / "notes.txt").write_text("mine\n")
    before = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*"))
    logged = (folder / "logs" / "dapo.log").read_text() if kind == "a finished dapo run" else None
    code = _ablate(tmp_path, monkeypatch)
    err = capsys.readouterr().err
    assert code == 2, err[-2000:]
    assert err.startswith(f"dapo ablate: {folder}") and len(err.strip().splitlines()) == 1, err
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")) == before  # nothing written there
    if logged is not None:
        assert (folder / "logs" / "dapo.log").read_text() == logged


def test_an_interrupted_ladder_folder_is_resumed_not_refused(tmp_path: Path, base) -> None:
    from workflows.ablation import check_ladder_folder

    folder = tmp_path / f"{base.run.name}-ladder"
    check_ladder_folder(base, folder)  # not there yet
    folder.mkdir()
    check_ladder_folder(base, folder)  # empty
    # What an interrupted ladder leaves: its log and lock, the Flyte cache, the shared run, a rung's run.
    (folder / "logs").mkdir()
    (folder / "logs" / "dapo.log").write_text("")
    (folder / ".dapo-run.lock").write_text("{}")
    (folder / "flyte").mkdir()
    _finished_run(folder / "shared")
    _finished_run(folder / ladder(base)[0].slug / "seed-0")
    check_ladder_folder(base, folder)
    # and a finished one, its table written (the names ablation_report writes)
    write_ablation(folder, [{"name": "naive GRPO", "settings": {}, "runs": [_run(0, 0.3, [1.0])]}], base=base, seconds=1.0)
    check_ladder_folder(base, folder)
