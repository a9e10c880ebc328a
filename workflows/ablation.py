"""The paper's ablation ladder (Table 1) as one workflow: config deltas over a shared start.

    naive GRPO -> + overlong filtering -> + clip-higher -> + soft overlong punishment
               -> + token-level loss -> + dynamic sampling (= DAPO)

Each rung adds one technique to the rung before it (:func:`ladder`); every rung runs with several
seeds. All runs share one curation, one step-0 policy and its step-0 evaluation, built once in
``<ladder>/shared/`` by the same cached tasks as ``dapo run``; a run folder
``<ladder>/<rung>/seed-<n>/`` then links to them (relative symlinks, so lineage works as in any
run folder) and holds only its own steps. The ladder's task is a plain loop over
``workflows.driver.train_and_report``, so a killed ladder resumes over cache hits like a run. With
long-lived engines named (``DAPO_ENGINES_RAY_ADDRESS``), the whole ladder is one hosting, as a run is
(engines/rollout/ray_engines.py: hosted_for_run): its engines are removed at its end, failed or not.

A seed changes the problem order, every rollout seed and the mini-batch shuffling; the
curation, the step-0 policy and the evaluation's sampling seed stay fixed, so the seeds of a
rung differ only in what the RL steps did. The table and curves are written by
``reports/ablation.py``.

The ladder folder ``<run-root>/<run name>-ladder`` holds only what a ladder writes
(:data:`LADDER_ENTRIES`); a folder of that name holding anything else (a `dapo run` folder whose
run was named so, a user's files) is refused before anything is written there
(:func:`check_ladder_folder`), and a ladder folder an interrupted ladder left is resumed.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engines.rollout import ray_engines
from infra.environments import cpu_env
from storage import run_store
from storage.run_layout import RunLayout, rung_folder
from workflows import progress
from workflows.config import ConfigError, RunConfig, config_from_dict
from workflows.local_run import run_driver_locally
from workflows.run_binding import RunFolderError, check_run_folder, hold_run_folder
from workflows.run_output import LOG_NAME

# What a ladder writes at the top of its folder besides its rungs' folders: the shared run, its
# log (workflows/run_output.py), the Flyte cache and records, and the table, page and curves
# (reports/ablation.py: write_ablation; tests/unit/test_ablation.py keeps the two in step).
# Hidden names (the lock, temp files) are the ladder's too.
LADDER_ENTRIES = ("shared", LOG_NAME.split("/")[0], "flyte", "ablation.json", "ablation.md", "curves.png", "index.html")


@dataclass(frozen=True)
class Rung:
    """One step of the ladder: the settings it changes relative to the rung before it."""

    name: str  # as in the paper's Table 1
    slug: str  # folder name
    delta: dict[str, Any]  # "section.field" -> value


def _base_value(base: RunConfig, key: str) -> Any:
    section, field = key.split(".")
    return getattr(getattr(base, section), field)


def ladder(base: RunConfig) -> list[Rung]:
    """The rungs for ``base`` (the full DAPO config, which the last rung reproduces).

    Naive GRPO (the paper's baseline, sec. 4.2): symmetric clip 0.2, GRPO's sample-level loss
    mean, truncated samples get the wrong-answer reward, every group trained on (one generation
    round of exactly ``prompts_per_step`` prompts, so no group is carried to the next step).
    """
    return [
        Rung("naive GRPO", "0-naive-grpo", {
            "train.eps_high": _base_value(base, "train.eps_low"),
            "train.loss_agg": "seq-mean-token-mean",
            "score.truncated_is_wrong": True,
            "score.overlong_filtering": False,
            "score.soft_overlong_punishment": False,
            "score.dynamic_sampling": False,
            "run.prompts_per_round": base.run.prompts_per_step,
            "run.max_rounds": 1,
        }),
        Rung("+ overlong filtering", "1-overlong-filtering", {"score.overlong_filtering": True}),  # sec. 3.4
        Rung("+ clip-higher", "2-clip-higher", {"train.eps_high": base.train.eps_high}),  # sec. 3.1: the config's
        Rung("+ soft overlong punishment", "3-soft-overlong-punishment",
             {"score.soft_overlong_punishment": True}),  # sec. 3.4, eq. 13
        Rung("+ token-level loss", "4-token-level-loss", {"train.loss_agg": "token-mean"}),  # sec. 3.3, eq. 12
        Rung("+ dynamic sampling (DAPO)", "5-dynamic-sampling", {  # sec. 3.2, eq. 11
            "score.dynamic_sampling": True,
            "run.prompts_per_round": base.run.prompts_per_round,
            "run.max_rounds": base.run.max_rounds,
        }),
    ]


def rung_settings(rungs: list[Rung], index: int) -> dict[str, Any]:
    """The accumulated deltas of rungs ``0..index``: everything rung ``index`` sets."""
    settings: dict[str, Any] = {}
    for rung in rungs[: index + 1]:
        settings.update(rung.delta)
    return settings


def check_ladder_ends_at(base: RunConfig) -> None:
    """Refuse (:class:`ConfigError`) a config that the ladder's last rung (DAPO) would not reproduce.

    The rungs add techniques and never take one back, so a setting a rung turns on that ``base``
    leaves off (e.g. ``score.overlong_filtering``, which rung 1 adds) would make "DAPO" a config
    other than ``base``, and its row of the table another run than ``dapo run`` of the same file.
    A config without a decoupled clip (``eps_high <= eps_low``) is refused too: its clip-higher rung
    would be the rung below it again.
    """
    if base.train.eps_high <= base.train.eps_low:
        raise ConfigError(f"{base.source}: train.eps_high ({base.train.eps_high}) is not above train.eps_low "
                          f"({base.train.eps_low}), so the ladder's clip-higher rung would repeat the rung below it; "
                          "set the config's decoupled clip (the paper's: --set train.eps_high=0.28)")
    rungs = ladder(base)
    differ = {key: (_base_value(base, key), value) for key, value in rung_settings(rungs, len(rungs) - 1).items()
              if _base_value(base, key) != value}
    if differ:
        listed = ", ".join(f"{key} is {was!r} where the rungs set {want!r}" for key, (was, want) in differ.items())
        sets = " ".join(f"--set {key}={str(want).lower() if isinstance(want, bool) else want}"
                        for key, (_, want) in differ.items())
        raise ConfigError(f"{base.source}: the ladder ends at the config itself, but {listed}; put them in the config "
                          f"(or add {sets}), or use the ladder's own configs/ablation-addsub.yaml")


def rung_config(base: RunConfig, settings: dict[str, Any], *, seed: int, name: str) -> RunConfig:
    """``base`` with ``settings`` applied, the run seed and the training shuffle seed set to ``seed``."""
    sections = base.to_dict()
    for key, value in {**settings, "run.seed": seed, "train.seed": seed, "run.name": name}.items():
        section, field = key.split(".")
        sections[section][field] = value
    return config_from_dict(sections, source=base.source)


def _link(target: Path, link: Path) -> None:
    """A relative symlink ``link`` -> ``target`` (kept if it already points there)."""
    link.parent.mkdir(parents=True, exist_ok=True)
    relative = os.path.relpath(target, link.parent)
    if link.is_symlink() and os.readlink(link) == relative:
        return
    if link.is_symlink():
        link.unlink()
    link.symlink_to(relative)


def link_shared(shared: RunLayout, run: RunLayout) -> None:
    """Make the shared curation, step-0 checkpoint and step-0 evaluation part of ``run``'s folder."""
    _link(Path(shared.curate_dir), Path(run.curate_dir))
    _link(Path(shared.checkpoint(0)), Path(run.checkpoint(0)))
    _link(Path(shared.eval_shard(0)), Path(run.eval_shard(0)))


def _read_metrics(layout: RunLayout, steps: int) -> list[dict[str, Any]]:
    import schemas
    from workflows.json_output import finite_or_none

    return [finite_or_none(schemas.read_shard(layout.metrics_shard(step), schemas.StepMetrics).to_pylist()[0])
            for step in range(1, steps + 1)]


def _rung_result(rungs: list[Rung], index: int, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One rung's entry of the results ``reports/ablation.py`` turns into the table."""
    rung = rungs[index]
    return {"index": index, "name": rung.name, "slug": rung.slug, "delta": rung.delta,
            "settings": rung_settings(rungs, index), "runs": runs}


@cpu_env.task(report=True)
async def dapo_ablation(run_config: RunConfig, ladder_dir: str, seeds: list[int], rungs: list[int]) -> str:
    """Run (or resume) the ladder of the full DAPO ``run_config`` into ``ladder_dir``; returns the path
    of ``ablation.json`` (the table). ``rungs`` are indices into ``ladder`` (all of them for the
    paper's table)."""
    import flyte.report

    from reports.ablation import write_ablation
    from workflows.driver import (
        prepare_run,
        stage_cores,
        start_run_folder,
        train_and_report,
    )

    started = time.perf_counter()
    base = run_config
    if run_store.is_remote(ladder_dir):
        # The rungs share curation and the step-0 policy through symlinks (link_shared).
        raise ValueError(f"{ladder_dir}: the ablation ladder needs a filesystem run root (a path or shared "
                         "volume), not an object store; `dapo run` accepts object-store URIs")
    root = Path(ladder_dir)
    shared = RunLayout(root / "shared")
    start_run_folder(base, shared)
    # Pipelined rungs: rollout and training share the cores (driver.stage_cores). With long-lived engines
    # named (settings/rollout.py: EngineHosting), one hosting for the whole ladder, as `dapo run` has for
    # its run: the shared step-0 work and every rung use the ladder's engines, removed at its end.
    with stage_cores(base), ray_engines.hosted_for_run(ladder_dir):
        prepared = await prepare_run(base, shared)
        all_rungs = ladder(base)
        results: list[dict[str, Any]] = []
        for index in rungs:
            rung = all_rungs[index]
            settings = rung_settings(all_rungs, index)
            runs = []
            for seed in seeds:
                cfg = rung_config(base, settings, seed=seed, name=f"{base.run.name}-{rung.slug}-seed{seed}")
                layout = RunLayout(root / rung_folder(rung.slug, seed))
                start_run_folder(cfg, layout)
                link_shared(shared, layout)
                t0 = time.perf_counter()
                summary = await train_and_report(cfg, layout, prepared, started=t0, live_report=False)
                summary.pop("_inline_report")
                runs.append({"seed": seed, "summary": summary, "metrics": _read_metrics(layout, cfg.run.steps)})
                progress.note(f"[ladder] {rung.name} seed {seed}: held-out avg@{summary['eval_k']} "
                              f"{summary['accuracy_before']:.3f} -> {summary['accuracy_after']:.3f}")
            results.append(_rung_result(all_rungs, index, runs))
    table, inline_page = write_ablation(root, results, base=base, seconds=time.perf_counter() - started)
    await flyte.report.replace.aio(inline_page, do_flush=True)
    return str(root / "ablation.json")


def run_ablation(config: RunConfig, run_root: str | Path, *, seeds: list[int], rungs: list[int] | None = None) -> list[dict[str, Any]]:
    """Run the ladder through Flyte locally into ``<run_root>/<run name>-ladder``; returns the table."""
    layout = RunLayout(ladder_folder(config, run_root))
    indices = list(range(len(ladder(config)))) if rungs is None else rungs
    with hold_run_folder(layout.root, note=lambda line: progress.note(line, warning=True)):
        check_ladder_records(config, Path(layout.root), seeds=seeds, rungs=indices)
        table = run_driver_locally(
            layout, dapo_ablation,
            interrupted=lambda: (f"interrupted the ladder in {layout.root}; nothing half-published: "
                                 "re-run the same command to resume"),
            run_config=config,
            ladder_dir=str(layout.root),
            seeds=seeds,
            rungs=indices,
        )
    return json.loads(Path(str(table)).read_text())


def ladder_folder(config: RunConfig, run_root: str | Path) -> Path:
    """``<run_root>/<run name>-ladder``: the shared run, one run folder per rung and seed, the table."""
    if run_store.is_remote(run_root):
        raise ValueError(f"{run_root}: the ablation ladder needs a filesystem run root, not an object store")
    return Path(run_root).resolve() / f"{config.run.name}-ladder"


def check_ladder_folder(config: RunConfig, ladder_dir: Path) -> None:
    """Refuse (:class:`RunFolderError`) a folder at ``ladder_dir`` that is no ladder folder: one that holds
    a name a ladder never writes at its top (:data:`LADDER_ENTRIES`, the rungs' folders, hidden names),
    such as a `dapo run` folder whose run was named ``<name>-ladder`` (its ``run.json``, ``curate/``,
    ``summary.json``). An empty folder, and one an interrupted ladder left, are the ladder's."""
    if not ladder_dir.is_dir():
        return
    ours = {*LADDER_ENTRIES, *(rung.slug for rung in ladder(config))}
    foreign = sorted(p.name for p in ladder_dir.iterdir() if p.name not in ours and not p.name.startswith("."))
    if not foreign:
        return
    what = ("holds a run of `dapo run` (run.json)" if Path(RunLayout(str(ladder_dir)).run_record).exists()
            else "is not an ablation ladder's folder")
    listed = ", ".join(foreign[:4]) + (", ..." if len(foreign) > 4 else "")
    raise RunFolderError(f"{ladder_dir} {what} ({listed}), where the ladder of run name {config.run.name!r} would be "
                         "written; choose another --run-root or --set run.name=NEW_NAME")


def check_ladder_records(config: RunConfig, ladder_dir: Path, *, seeds: list[int], rungs: list[int]) -> None:
    """Refuse (:class:`RunFolderError`) a folder that is no ladder folder (:func:`check_ladder_folder`), and a
    ladder folder whose shared or rung runs hold another config."""
    check_ladder_folder(config, ladder_dir)
    check_run_folder(RunLayout(ladder_dir / "shared"), config.to_dict())
    all_rungs = ladder(config)
    for index in rungs:
        settings = rung_settings(all_rungs, index)
        for seed in seeds:
            layout = RunLayout(ladder_dir / rung_folder(all_rungs[index].slug, seed))
            cfg = rung_config(config, settings, seed=seed, name=f"{config.run.name}-{all_rungs[index].slug}-seed{seed}")
            check_run_folder(layout, cfg.to_dict())


def collect_results(config: RunConfig, ladder_dir: Path, *, seeds: list[int], rungs: list[int] | None = None
                    ) -> list[dict[str, Any]]:
    """The per-rung results of finished runs in ``ladder_dir`` (what ``dapo_ablation`` gathers as
    it goes); raises FileNotFoundError naming the first run folder without a summary.json."""
    all_rungs = ladder(config)
    results = []
    for index in range(len(all_rungs)) if rungs is None else rungs:
        rung = all_rungs[index]
        runs = []
        for seed in seeds:
            layout = RunLayout(ladder_dir / rung_folder(rung.slug, seed))
            if not Path(layout.summary).is_file():
                raise FileNotFoundError(f"{layout.root}: no summary.json (run `dapo ablate` for rung {index}, seed {seed})")
            summary = json.loads(Path(layout.summary).read_text())
            runs.append({"seed": seed, "summary": summary, "metrics": _read_metrics(layout, summary["steps"])})
        results.append(_rung_result(all_rungs, index, runs))
    return results
