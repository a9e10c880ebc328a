"""The driver task: the DAPO loop as plain Python over cached Flyte tasks.

See workflows/local_run.py for how it is launched. Everything the loop decides (which
problems a round generates, which groups fill the batch, which are surplus) is a pure function
of the config and of task outputs, so a re-run replays it exactly over cache hits.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import platform
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import flyte
import flyte.report
import pyarrow as pa
import pyarrow.compute as pc
from flyte.io import Dir, File

import schemas
from dapo_core.intervals import paired_change
from engines.runtime import gc_heap, threads
from engines.curate.stage import check_curated_splits_disjoint
from engines.bootstrap.stage import policy_tokenizer_folder, source_folders, warmup_problem_ids
from engines.rollout import ray_engines
from engines.rollout.stage import check_prompt_lengths, manifest_path
from engines.score.stage import ScoreStats
from engines.train.launch import start_workers
from engines.train.node_group import planned_nodes
from engines.train.publish import METRICS_FILE
from engines.score.verifier_pool import start_verifier_pool
from infra.environments import cpu_env
from readers.problem_files import split_suffix
from storage import checkpoints, digests, outputs, run_store
from storage.pruner import Pruned, Pruner
from storage.run_layout import RunLayout
from storage.run_summary import relative_to, resolve_paths
from tasks.batch import assemble_batch
from tasks.bootstrap import bootstrap
from tasks.curate import curate
from tasks.evaluate import evaluate
from tasks.rollout import rollout
from tasks.score import score
from tasks.train import train
from tracking.run_tracking import open_tracking
from workflows import progress
from workflows.config import RunConfig
from workflows.json_output import finite_or_none
from workflows.problem_order import check_pool_size
from reports.run import eval_interval
from workflows import run_page
from workflows.run_binding import check_run_folder
from workflows.seeds import derive_seed
from workflows.step_loop import (
    GeneratedRound,
    GroupRef,
    LoopSettings,
    StepPlan,
    run_steps,
)
from workflows.verified_calls import call_verified


def _write_json(path: str, payload: dict[str, Any]) -> None:
    """Atomic (temp-then-rename, or one object PUT) JSON record in the run store."""
    run_store.write_text(path, json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n")


def _round_groups(stats: ScoreStats, scored_path: str, step: int, behaviour_step: int) -> list[tuple[str, str, GroupRef]]:
    """``(group_key, reason, ref)`` per group of a scored round, in first-row order.

    The score task returns every group's decision (``ScoreStats.group_decisions``, the values its
    shard's rows hold), so the driver does not read the scored shard back.
    """
    return [(d.group_key, d.filter_reason, GroupRef(problem_id=d.problem_id, source=scored_path, generated_step=step,
                                                    behaviour_step=behaviour_step))
            for d in stats.group_decisions]


def _problem_ids(paths: list[str]) -> list[str]:
    return schemas.read_shards(run_store.fetch_all(paths), schemas.Problem).column("problem_id").to_pylist()


def _held_out_intervals(layout: RunLayout, evals: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-evaluation 95% half-widths (added to ``evals``) and the paired interval of the change from
    the first evaluation to the last, from the eval shards' per-problem avg@k."""
    per_step = []
    for e in evals:
        rows = schemas.read_shard(run_store.fetch(layout.eval_shard(e["step"])), schemas.EvalResult).to_pylist()
        per_problem = {r["problem_id"]: r["avg_at_k"] for r in rows}
        e["avg_at_k_ci95_half"] = eval_interval(list(per_problem.values()))
        per_step.append(per_problem)
    common = sorted(set(per_step[0]) & set(per_step[-1]))
    if len(evals) < 2 or len(common) < 2:
        return {}
    change, half = paired_change([per_step[0][p] for p in common], [per_step[-1][p] for p in common])
    return {"accuracy_before_ci95": _interval(evals[0]), "accuracy_after_ci95": _interval(evals[-1]),
            "accuracy_change": change, "accuracy_change_ci95": [change - half, change + half],
            "accuracy_change_method": f"paired over the {len(common)} held-out problems (t interval of per-problem differences)"}


def _interval(evaluation: dict[str, Any]) -> list[float] | None:
    """[low, high] 95% interval of one evaluation's avg@k (t over problems), or None without a spread."""
    half = evaluation.get("avg_at_k_ci95_half")
    return None if half is None else [evaluation["avg_at_k"] - half, evaluation["avg_at_k"] + half]


def _best_eval(evals: list[dict[str, Any]]) -> dict[str, Any]:
    """The highest held-out avg@k of the run and its step (the first such step on a tie).

    Reported beside the final one so a run that peaks and then degrades says so.
    """
    best = max(evals, key=lambda e: e["avg_at_k"])  # max keeps the first of equal values
    return {"accuracy_best": best["avg_at_k"], "accuracy_best_step": best["step"]}


async def _evaluate(cfg: RunConfig, layout: RunLayout, checkpoint: str, test_paths: list[str], step: int) -> dict[str, Any]:
    progress.stage(f"the evaluation of step {step}", quiet=True)
    out = str(layout.eval_shard(step))
    summary = await call_verified(step_action(evaluate, step), [out], checkpoint, test_paths, out, step, cfg.evaluate,
                                  cfg.rollout, upstream=[checkpoint, layout.curate_dir])
    progress.eval_done(step, asdict(summary))
    return {"step": step, **asdict(summary)}


def _skipped_step(step: int, checkpoint: str) -> dict[str, Any]:
    """The train columns of a step that found no informative group: nothing trained, policy kept.

    Every statistic is blank (NaN for floats, 0 for counts: schemas.StepStats.blank); ``_step_row``
    then fills what rollout, scoring and sampling measured.
    """
    ckpt_id = checkpoints.read_info(checkpoint).checkpoint_id  # a URI: its metadata file alone
    return schemas.StepStats.blank(step, ckpt_id, ckpt_id).row()


def _train_row(checkpoint_dir: str) -> dict[str, Any]:
    """The train task's StepMetrics row, as published inside its checkpoint."""
    path = run_store.fetch(run_store.join(checkpoint_dir, METRICS_FILE))
    return schemas.read_shard(path, schemas.StepMetrics).to_pylist()[0]


def _step_row(trained: dict[str, Any], batch: Any, plan: StepPlan, train_s: float) -> dict[str, Any]:
    """The StepMetrics row: the train task's columns plus what rollout, scoring and sampling measured."""
    round_stats = plan.round_stats
    samples = sum(s["samples"] for s in round_stats)

    def generated_mean(key: str) -> float:
        # Over everything generated this step; NaN when carried surplus alone filled the batch.
        return sum(s[key] * s["samples"] for s in round_stats) / samples if samples else math.nan

    def batch_mean(column: str) -> float:
        return math.nan if batch is None else float(pc.mean(batch.column(column)).as_py())

    lags = plan.policy_lags()
    trained_stats = schemas.StepStats.from_row(trained)
    groups = sum(s["groups"] for s in round_stats)
    stats = dataclasses.replace(
        trained_stats,
        reward_mean=batch_mean("reward"),
        accuracy=generated_mean("accuracy"),
        response_length_mean=batch_mean("response_length"),
        truncation_ratio=generated_mean("truncation_ratio"),
        generation_rounds=plan.result.rounds,
        trained_groups=len(plan.result.kept),
        carried_groups=plan.carried_groups(),
        samples_generated=samples,
        # Per sample trained (issue 51): NaN for a step that trained nothing (skipped).
        over_generation=samples / trained_stats.samples if trained_stats.samples else math.nan,
        zero_signal_share=sum(s["zero_signal_groups"] for s in round_stats) / groups if groups else math.nan,
        max_policy_lag_steps=max(lags, default=0),
        verdict_timeouts=sum(s["verdict_timeouts"] for s in round_stats),
        verdict_errors=sum(s["verdict_errors"] for s in round_stats),
        time_rollout_s=sum(s["time_rollout_s"] for s in round_stats),
        time_score_s=sum(s["time_score_s"] for s in round_stats),
        time_train_s=train_s,
    )
    return stats.row()


async def prepare_run(cfg: RunConfig, layout: RunLayout) -> dict[str, Any]:
    """Curate, build the step-0 policy and evaluate it; returns what ``train_and_report`` starts from."""
    drv = cfg.run
    progress.begin(drv.name, drv.steps)
    progress.stage("curation")
    curated = await call_verified(curate, [layout.curate_dir], list(drv.data), str(layout.curate_dir), cfg.curate,
                                  upstream=[split_suffix(spec)[0] for spec in drv.data])
    train_paths = run_store.glob(layout.problems_dir, "train-*.parquet")
    test_paths = run_store.glob(layout.problems_dir, "test-*.parquet")
    if not train_paths or not test_paths:
        raise RuntimeError(
            f"{layout.problems_dir}: curation produced no {'train' if not train_paths else 'test'} split; "
            "give curate.test_fraction > 0 or inputs marked @train/@test"
        )
    check_curated_splits_disjoint(train_paths, test_paths)  # held-out problems are never trained on
    # Before the step-0 policy is built: a pool too small for one step is a config error.
    check_pool_size(curated.kept_by_split.get("train", 0), prompts_per_step=drv.prompts_per_step,
                    prompts_per_round=drv.prompts_per_round, max_rounds=drv.max_rounds)
    # Before the step-0 policy is built: every prompt must fit its context (the tokenizer and
    # context length are known from the bootstrap source without building the policy).
    with tempfile.TemporaryDirectory(prefix="dapo-tokenizer-") as scratch:
        _check_prompt_lengths(cfg, policy_tokenizer_folder(cfg.bootstrap.source, Path(scratch)), train_paths, test_paths)
    source = cfg.bootstrap.source
    progress.stage("the step-0 policy (" + ("bootstrap warm-up" if source == "tiny" else f"import of {source}") + ")")
    checkpoint = await call_verified(bootstrap, [layout.checkpoint(0)], train_paths, test_paths, str(layout.checkpoint(0)),
                                     cfg.bootstrap, upstream=[layout.curate_dir, *source_folders(source)])
    check_heldout_unseen(checkpoint, test_paths)
    return {
        "checkpoint": checkpoint,
        "train_paths": train_paths,
        "test_paths": test_paths,
        "problems_train": curated.kept_by_split.get("train", 0),
        "problems_test": curated.kept_by_split.get("test", 0),
        "eval0": await _evaluate(cfg, layout, checkpoint, test_paths, 0),
    }


class HeldOutSeenError(RuntimeError):
    """The step-0 policy was warmed up on problems of this run's held-out split."""


def check_heldout_unseen(checkpoint: str, test_paths: list[str]) -> None:
    """Refuse a step-0 policy whose warm-up saw any held-out problem of this run (its lineage lists
    the problems it was warmed up on: engines/bootstrap/stage.py: warmup_problem_ids), before any
    evaluation: held-out accuracy must measure what RL adds on unseen problems, not memory. A policy
    that records no warm-up problems (an imported model) is not checked."""
    seen = warmup_problem_ids(checkpoint)  # its metadata alone (a URI is not fetched whole)
    if not seen:
        return
    heldout = schemas.read_shards(run_store.fetch_all(test_paths), schemas.Problem).select(["problem_id", "problem"]).to_pylist()
    overlap = [row for row in heldout if row["problem_id"] in seen]
    if overlap:
        raise HeldOutSeenError(
            f"the step-0 policy {checkpoint} was warmed up on {len(overlap)} of the {len(heldout)} held-out problems "
            f"of this run (e.g. {overlap[0]['problem']!r}, problem_id {overlap[0]['problem_id']}): its held-out accuracy "
            "would measure memory; curate a test split it has not seen (the same synthetic data and test_fraction "
            "it was warmed up with), or warm up a new policy (bootstrap.source=tiny)"
        )


def _check_prompt_lengths(cfg: RunConfig, policy_folder: Path, train_paths: list[str], test_paths: list[str]) -> None:
    """Every prompt fits the step-0 policy's context with its response cap (training and held-out)."""
    local = policy_folder
    for paths, cap, field in ((train_paths, cfg.rollout.max_response_tokens, "rollout.max_response_tokens"),
                              (test_paths, cfg.evaluate.max_response_tokens, "evaluate.max_response_tokens")):
        problems = pa.concat_tables([schemas.read_shard(run_store.fetch(p), schemas.Problem) for p in paths])
        check_prompt_lengths(local, problems.select(["problem_id", "prompt"]).to_pylist(), max_response_tokens=cap,
                             max_model_len=cfg.rollout.max_model_len, field=field)


def generating_versions() -> dict[str, str]:
    """This code's cache versions of the stages that generate from checkpoints: what ``run.json``
    records, so that a resume with other code, or other lock pins of the libraries those stages count
    (infra/versioning.py: ``STAGE_LIBRARIES``; both are in the version), is checked against the
    checkpoints the retention policy pruned (workflows/run_binding.py: ``check_generating_code``)."""
    return {"evaluate": evaluate.cache.version_override, "rollout": rollout.cache.version_override}


def start_run_folder(cfg: RunConfig, layout: RunLayout) -> None:
    """Record the resolved config in the run folder and clear what a killed invocation left.

    A folder that already records another config is refused (workflows/run_binding.py): the
    CLIs check this before starting Flyte, with a one-line message; this guards a driver task
    launched any other way (the Flyte UI, a cluster).
    """
    versions = generating_versions()
    check_run_folder(layout, cfg.to_dict(), versions)
    # run_dir: where the folder is bound; a moved or copied folder is refused (run_binding.check_not_moved).
    _write_json(layout.run_record, {"config": cfg.to_dict(), "config_digest": cfg.digest(), "stage_versions": versions,
                                    "run_dir": str(layout.root), "python": platform.python_version()})
    # A killed earlier invocation may have left half-built checkpoints under hidden staging
    # names; they are never read (no dapo_checkpoint.json), only cleaned up here. One driver
    # per run folder at a time. (An object store has no staging folders: storage/run_store.py.)
    if not run_store.is_remote(layout.root):
        checkpoints.clean_stale_staging(layout.checkpoints_dir)


@dataclass(frozen=True)
class RunOutcome:
    """What ``dapo_pipeline`` returns. The Flyte UI shows the numbers and links the files, which
    stay where the run folder has them (referenced, not copied)."""

    summary: File  # <run>/summary.json: every figure of the run
    report: File  # <run>/report/index.html: the run page
    final_checkpoint: Dir  # <run>/checkpoints/step-NNNN: the trained policy (weights + tokenizer)
    steps_done: int
    accuracy_before: float  # held-out avg@k of the step-0 policy
    accuracy_after: float  # held-out avg@k of the final checkpoint


def stage_cores(cfg: RunConfig) -> contextlib.AbstractContextManager[None]:
    """Pipelined, rollout and training run at once: on one machine each takes half the cores (the
    vLLM engine's threads, each DeepSpeed rank's; engines/runtime/threads.py), for the whole run, since the
    engine keeps the thread count it started with. Synchronous, each takes them all in turn."""
    return threads.sharing_cores(2) if cfg.run.pipelined else contextlib.nullcontext()


@cpu_env.task(report=True)
async def dapo_pipeline(run_config: RunConfig, run_dir: str) -> RunOutcome:
    """Run or resume the DAPO pipeline described by ``run_config`` (every stage's settings, a typed
    input: the Flyte UI shows each field) into ``run_dir``."""
    started = time.perf_counter()
    layout = RunLayout(run_dir)
    start_run_folder(run_config, layout)
    # With long-lived engines named (settings/rollout.py: EngineHosting), the run's own, removed at its end.
    with stage_cores(run_config), ray_engines.hosted_for_run(run_dir):
        start_workers_early(run_config, layout)
        prepared = await prepare_run(run_config, layout)
        summary = await train_and_report(run_config, layout, prepared, started=started)
    await flyte.report.replace.aio(summary.pop("_inline_report"), do_flush=True)
    return RunOutcome(
        summary=File.from_existing_remote(str(layout.summary)), report=File.from_existing_remote(layout.report_page),
        final_checkpoint=Dir.from_existing_remote(resolve_paths(summary, layout.root)["final_checkpoint"]), steps_done=summary["steps_done"],
        accuracy_before=summary["accuracy_before"], accuracy_after=summary["accuracy_after"],
    )


def start_workers_early(cfg: RunConfig, layout: RunLayout) -> None:
    """Run locally (every task in this process), start the DeepSpeed worker group and the
    verifier pool now, beside curation, the step-0 policy and its evaluation, rather than in the
    first training step (engines/train/launch.py: start_workers) and its first scoring call
    (engines/score/verifier_pool.py: start_verifier_pool). Not on a cluster, where training and scoring
    run in pods of their own, and not when the run's last checkpoint is published already (a
    re-run of cache hits)."""
    ctx = flyte.ctx()
    if ctx is None or ctx.mode != "local" or cfg.run.steps == 0 or checkpoints.is_complete(layout.checkpoint(cfg.run.steps)):
        return
    if planned_nodes().nodes == 1:  # else the train task starts the nodes' own agents (engines/train/nodes.py)
        start_workers(cfg.train)
    start_verifier_pool(cfg.score.reward_workers or None)


def step_group(step: int) -> str:
    """The Flyte group of one DAPO step's tasks (rollout rounds, scoring, batch, train, evaluation)."""
    return f"step-{step:04d}"


def step_action(task: Any, step: int, generation_round: int | None = None) -> Any:
    """``task`` called under a readable action name: ``train-step-0042``, ``rollout-step-0042-round-01``
    (the round's shard name), so the Flyte UI and ``flyte get action`` show which step (and round) a
    call is. Only the task's short name changes: its name, interface and cache version, and so its
    cache keys and outputs, are the task's own."""
    suffix = "" if generation_round is None else f"-round-{generation_round:02d}"
    return task.override(short_name=f"{task.short_name}-{step_group(step)}{suffix}")


# The live run page is redrawn after a step when this long has passed since its last redraw, and
# after every evaluation. A redraw costs ~10 ms at 20 steps and ~34 ms at 200 (benchmarks/RESULTS.md):
# 1-2% of the tiny config's ~1.7 s steps if drawn after each. Steps longer than this redraw it after
# every step; the page a user watches is at most this long plus one step behind.
REPORT_EVERY_S = 5.0


def evaluates_after(step: int, every: int, steps: int) -> bool:
    """Whether the driver evaluates the policy right after ``step``: every ``every`` steps
    (``run.eval_every_steps``; 0 = none between), but not after the last step, whose evaluation
    ``train_and_report`` runs once the steps are done (step 0's runs in ``prepare_run``)."""
    return bool(every and step % every == 0 and step != steps)


class _PipelineStages:
    """The loop's stages as cached Flyte tasks writing into the run folder (workflows/step_loop.py)."""

    def __init__(self, cfg: RunConfig, layout: RunLayout, prepared: dict[str, Any], *, started: float,
                 live_report: bool) -> None:
        self.cfg, self.layout, self.prepared = cfg, layout, prepared
        self.started, self.live_report = started, live_report
        self.train_paths, self.test_paths = prepared["train_paths"], prepared["test_paths"]
        self.checkpoint: str = prepared["checkpoint"]
        self.policy_step = 0  # the step whose checkpoint is the current policy (skipped steps keep it)
        self.checkpoint_paths: dict[int, str] = {0: self.checkpoint}  # every published checkpoint, by step
        self.pruner = Pruner(keep_optimizer_last=cfg.run.keep_optimizer_checkpoints,
                             keep_weights_every=cfg.run.keep_weights_every_steps,
                             optimizer_state_every=cfg.train.optimizer_state_every)
        self._pruning_noted = False  # the first prune's line goes to the terminal, later ones to the log
        # The policy as it stood after each finished step: (checkpoint, the step that trained it). A
        # round asks for one by step (workflows/step_loop.py): pipelined, step N+1's rounds use the
        # policy after step N-1 while step N trains and moves self.checkpoint on.
        self.policy_after: dict[int, tuple[str, int]] = {0: (self.checkpoint, 0)}
        self.evals: list[dict[str, Any]] = [prepared["eval0"]]
        self.metrics_rows: list[dict[str, Any]] = []
        self.step_seconds: list[float] = []
        self._step_started = time.perf_counter()
        self._page_drawn_at = -math.inf  # when the live run page was last redrawn (perf_counter)
        self.tracking = open_tracking(cfg.tracking, layout.tracking_dir, run_name=cfg.run.name, run_config=cfg.to_dict())
        self.track()

    async def generate(self, step: int, generation_round: int, problem_ids: list[str], behaviour_step: int) -> GeneratedRound:
        cfg, layout = self.cfg, self.layout
        rollout_path = str(layout.rollout_shard(step, generation_round))
        progress.stage(f"step {step}/{cfg.run.steps} (rollout round {generation_round})", quiet=True)
        with flyte.group(step_group(step)):  # the Flyte UI shows each DAPO step as one unit
            return await self._generate(step, generation_round, problem_ids, rollout_path, behaviour_step)

    async def _generate(self, step: int, generation_round: int, problem_ids: list[str], rollout_path: str,
                        behaviour_step: int) -> GeneratedRound:
        cfg, layout = self.cfg, self.layout
        # The checkpoint is an input of the cached rollout task: the loop's choice of policy (never
        # "the latest"), so a re-run or resume asks for the same rollout (workflows/step_loop.py).
        checkpoint, policy_version = self.policy_after[behaviour_step]
        t = time.perf_counter()
        await call_verified(
            step_action(rollout, step, generation_round), [rollout_path, manifest_path(rollout_path)],
            checkpoint, self.train_paths, problem_ids, rollout_path, cfg.rollout,
            derive_seed(cfg.run.seed, "rollout", step, generation_round), policy_version, generation_round,
            upstream=[checkpoint, layout.curate_dir],
        )
        rollout_s = time.perf_counter() - t
        scored_path = str(layout.scored_shard(step, generation_round))
        t = time.perf_counter()
        scored = await call_verified(step_action(score, step, generation_round), [scored_path], [rollout_path],
                                     self.train_paths, scored_path, cfg.rollout.max_response_tokens, cfg.score,
                                     upstream=[rollout_path, layout.curate_dir])
        stats = {k: v for k, v in asdict(scored).items() if k != "group_decisions"}
        stats.update(time_rollout_s=rollout_s, time_score_s=time.perf_counter() - t)
        return GeneratedRound(groups=_round_groups(scored, scored_path, step, behaviour_step), stats=stats)

    async def train(self, plan: StepPlan) -> None:
        with flyte.group(step_group(plan.step)):
            await self._train(plan)

    async def _train(self, plan: StepPlan) -> None:
        """One step after its sampling: train on the batch (or keep the policy when the step is
        skipped), record the step, then what follows it (evaluation when due, tracking, retention,
        the run page). Pipelined, the next step's sampling runs beside this (workflows/step_loop.py)."""
        progress.training(plan.step, self.cfg.run.steps, trains=not plan.skipped)
        t = time.perf_counter()
        trained = _skipped_step(plan.step, self.checkpoint) if plan.skipped else await self._train_step(plan)
        self._record_step(plan, trained, time.perf_counter() - t)
        await self._after_step(plan.step)

    async def _train_step(self, plan: StepPlan) -> dict[str, Any]:
        """Assemble the step's batch, train the policy on it and make the published checkpoint the
        policy; returns the train task's StepMetrics row."""
        step, layout = plan.step, self.layout
        batch_path = await self._assemble_batch(plan)
        published = await call_verified(step_action(train, step), [layout.checkpoint(step)], self.checkpoint, [batch_path],
                                        str(layout.checkpoint(step)), step, self.cfg.train,
                                        upstream=[self.checkpoint, batch_path])
        trained = _train_row(published.checkpoint_dir)
        self._advance_policy(step, published.checkpoint_dir)
        return trained

    async def _assemble_batch(self, plan: StepPlan) -> str:
        """Write the step's batch (its kept groups) and surplus shards from the scored shards they
        come from; returns the batch shard's path."""
        step, result = plan.step, plan.result
        # Each scored shard with the step that generated it: a group is one step's (dapo_core.sampling.group_key).
        scored = sorted({(ref.source, ref.generated_step) for _, ref in [*result.kept, *result.surplus]})
        sources = [source for source, _ in scored]
        batch_path, surplus_path = str(self.layout.batch_shard(step)), str(self.layout.surplus_shard(step))
        await call_verified(
            step_action(assemble_batch, step), [batch_path, surplus_path],
            sources, [generated for _, generated in scored], [g for g, _ in result.kept], [g for g, _ in result.surplus],
            batch_path, surplus_path, upstream=sources,
        )
        return batch_path

    def _advance_policy(self, step: int, checkpoint_dir: str) -> None:
        """``step`` trained ``checkpoint_dir``: it is now the policy (what the next step trains from)."""
        self.checkpoint, self.policy_step = checkpoint_dir, step
        self.checkpoint_paths[step] = checkpoint_dir

    def _record_step(self, plan: StepPlan, trained: dict[str, Any], train_s: float) -> None:
        """Keep the policy after the step (for the rounds that ask for it), its metrics row and
        duration, and report it on the terminal."""
        self.policy_after[plan.step] = (self.checkpoint, self.policy_step)
        row = self._metrics_row(plan, trained, train_s)
        self.metrics_rows.append(finite_or_none(row))  # JSON-safe; plots and tables skip None
        self.step_seconds.append(time.perf_counter() - self._step_started)
        progress.step_done(progress.StepReport(schemas.StepStats.from_row(row), steps=self.cfg.run.steps,
                                               outcome=plan.result.outcome, seconds=self.step_seconds[-1]))

    async def _after_step(self, step: int) -> None:
        """After a recorded step: evaluate the policy when due, send the step to the trackers, prune
        older checkpoints, redraw the run page when due, and start the next step's clock."""
        evaluated = evaluates_after(step, self.cfg.run.eval_every_steps, self.cfg.run.steps)
        if evaluated:
            self.evals.append(await _evaluate(self.cfg, self.layout, self.checkpoint, self.test_paths, step))
        self.track()
        self.apply_retention(step)
        if evaluated or time.perf_counter() - self._page_drawn_at >= REPORT_EVERY_S:
            await self.refresh_report()
        self._step_started = time.perf_counter()

    def apply_retention(self, step: int) -> None:
        """Prune older checkpoints by ``run.keep_*`` (storage/retention_policy.py) once the step is done,
        on the pruner's thread while the next step runs (storage/pruner.py).

        The current policy's checkpoint is the latest and stays whole: the next step trains from it
        and a resume starts there. A re-run replays this after every step; what is pruned stays
        pruned and recorded (storage/pruning.py), so the replayed calls stay cache hits.
        """
        self.note_pruned(self.pruner.submit(step, self.checkpoint_paths, latest=self.policy_step))

    def finish_retention(self, *, raise_error: bool = True) -> None:
        """Wait for the last prune (before the summary); its error is raised, or only noted when
        the steps failed themselves."""
        try:
            self.note_pruned(self.pruner.close())
        except Exception as err:
            if raise_error:
                raise
            progress.note(f"[retention] the last prune failed too: {type(err).__name__}: {err}")

    def note_pruned(self, pruned: Pruned | None) -> None:
        """Say what a prune deleted: the run's first on the terminal, the rest in the log (stderr),
        so that a run that prunes after every step does not print a line for each."""
        if pruned is None or not pruned.files:
            return
        drv = self.cfg.run
        line = (f"[retention] after step {pruned.step}: pruned {len(pruned.files)} file(s) of older checkpoints "
                f"(run.keep_optimizer_checkpoints={drv.keep_optimizer_checkpoints}, "
                f"run.keep_weights_every_steps={drv.keep_weights_every_steps})")
        if self._pruning_noted:
            print(line, file=sys.stderr, flush=True)
        else:
            progress.note(f"{line}; later prunes are in the log")
            self._pruning_noted = True

    async def refresh_report(self) -> None:
        """Redraw the run page with the steps so far (status "running", ETA), so a user watching the
        run (report/index.html, the Flyte UI) sees its curves grow; ~10 ms (benchmarks/report_refresh.py).
        Called after a step at most every :data:`REPORT_EVERY_S` seconds, and after every evaluation."""
        summary = _summary(self.cfg, self.layout, self.prepared, self, status="running")
        inline_page = run_page.write_run_page(self.layout, title=f"DAPO run {self.cfg.run.name}", summary=summary,
                                              metrics=self.metrics_rows, evals=self.evals, samples=[], final=False)
        if self.live_report:
            await flyte.report.replace.aio(inline_page, do_flush=True)
        self._page_drawn_at = time.perf_counter()

    def track(self) -> None:
        """Send the steps and evaluations so far to the run's trackers (section ``tracking``); each
        logs only what it does not hold yet (tracking/state.py), so cache-hit replays log nothing."""
        if not self.tracking.trackers:
            return
        for e in self.evals:
            if "avg_at_k_ci95_half" not in e:
                rows = schemas.read_shard(run_store.fetch(self.layout.eval_shard(e["step"])), schemas.EvalResult)
                per_problem = {r["problem_id"]: r["avg_at_k"] for r in rows.select(["problem_id", "avg_at_k"]).to_pylist()}
                e["avg_at_k_ci95_half"] = eval_interval(list(per_problem.values()))
        self.tracking.record(self.metrics_rows, self.evals)

    def _metrics_row(self, plan: StepPlan, trained: dict[str, Any], train_s: float) -> dict[str, Any]:
        path = self.layout.metrics_shard(plan.step)
        if run_store.exists(path) and not digests.check(path):
            # Written when this step first finished; a re-run (all cache hits) must not replace
            # its measured stage timings with the near-zero time of cache lookups.
            return schemas.read_shard(run_store.fetch(path), schemas.StepMetrics).to_pylist()[0]
        batch = None if plan.skipped else schemas.read_shard(run_store.fetch(self.layout.batch_shard(plan.step)), schemas.ScoredRollout)
        row = _step_row(trained, batch, plan, train_s)
        with outputs.output(path) as local:
            schemas.write_shard([row], local, schemas.StepMetrics)
        return row


def _summary(cfg: RunConfig, layout: RunLayout, prepared: dict[str, Any], stages: "_PipelineStages", *,
             status: str) -> dict[str, Any]:
    """summary.json's content for the steps so far; a finished run adds the paired intervals
    over problems (read from the eval shards), a running one leaves them to the page's fallback.
    Paths are relative to the run folder (storage/run_summary.py resolves them when read)."""
    evals = stages.evals
    return {
        "status": status,
        "run_dir": ".",
        "config": cfg.source,
        "config_digest": cfg.digest(),
        "steps": cfg.run.steps,
        "steps_done": len(stages.metrics_rows),
        "accuracy_before": evals[0]["avg_at_k"],
        "accuracy_after": evals[-1]["avg_at_k"],
        **_best_eval(evals),
        "pass_at_k_before": evals[0]["pass_at_k"],
        "pass_at_k_after": evals[-1]["pass_at_k"],
        "eval_problems": evals[0]["problems"],
        "eval_k": evals[0]["k"],
        **(_held_out_intervals(layout, evals) if status == "finished" else {}),
        "evals": [{k: e.get(k) for k in ("step", "avg_at_k", "avg_at_k_ci95_half", "pass_at_k", "maj_at_k", "seconds")}
                  for e in evals],
        "final_checkpoint": relative_to(stages.checkpoint, layout.root),
        "report": relative_to(layout.report_page, layout.root),
        "problems_train": prepared["problems_train"],
        "problems_test": prepared["problems_test"],
        "wall_seconds": round(time.perf_counter() - stages.started, 2),
        "step_seconds": [round(s, 2) for s in stages.step_seconds],
    }


async def train_and_report(cfg: RunConfig, layout: RunLayout, prepared: dict[str, Any], *, started: float,
                           live_report: bool = True) -> dict[str, Any]:
    """The DAPO steps from ``prepared`` (see ``prepare_run``), evaluations, report and summary.json.

    The run page is redrawn after steps (at most every ``REPORT_EVERY_S`` seconds) and evaluations;
    ``live_report`` also publishes it as this task's
    Flyte report each time. Returns the summary, plus the final page inlined under
    ``_inline_report`` (for flyte.report).
    """
    drv = cfg.run
    stages = _PipelineStages(cfg, layout, prepared, started=started, live_report=live_report)
    progress.begin(drv.name, drv.steps)
    settings = LoopSettings(steps=drv.steps, prompts_per_step=drv.prompts_per_step, prompts_per_round=drv.prompts_per_round,
                            max_rounds=drv.max_rounds, on_max_rounds=drv.on_max_rounds, seed=drv.seed, pipelined=drv.pipelined,
                            round_size=drv.round_size)
    gc_heap.freeze_long_lived()  # what the steps find (engine, pools) lives as long as they run
    try:
        plans = await run_steps(settings, _problem_ids(stages.train_paths), stages)
    except BaseException:
        stages.finish_retention(raise_error=False)  # the steps' own error (or Ctrl-C) is the one to report
        raise
    finally:
        gc_heap.thaw()  # so a process running several pipelines (ablation, tests) can free each one's objects
    stages.finish_retention()
    if drv.steps > 0:
        stages.evals.append(await _evaluate(cfg, layout, stages.checkpoint, stages.test_paths, drv.steps))
    stages.track()
    stages.tracking.close()
    summary = _summary(cfg, layout, prepared, stages, status="finished")
    metrics_rows, evals = stages.metrics_rows, stages.evals
    trained_plans = [p for p in plans if not p.skipped]
    samples = run_page.sample_rows(layout, run_page.sample_steps([p.step for p in trained_plans]))
    inline_page = run_page.write_run_page(layout, title=f"DAPO run {drv.name}", summary=summary, metrics=metrics_rows,
                                          evals=evals, samples=samples, final=True)
    _write_json(layout.summary, summary)
    return {**summary, "_inline_report": inline_page}
