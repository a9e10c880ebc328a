"""The driver task: the DAPO loop as plain Python over cached Flyte tasks.

See workflows/pipeline.py for how it is launched. Everything the loop decides (which
problems a round generates, which groups fill the batch, which are surplus) is a pure function
of the config and of task outputs, so a re-run replays it exactly over cache hits.
"""

from __future__ import annotations

import json
import math
import platform
import time
from typing import Any

import flyte
import flyte.report
import pyarrow.compute as pc

import schemas
from dapo_core.sampling import DynamicSamplingAccumulator
from infra.environments import cpu_env
from tasks.batch import assemble_batch
from tasks import checkpoints, run_store
from tasks.bootstrap import bootstrap
from tasks.curate import curate
from tasks.evaluate import evaluate
from tasks.rollout import rollout
from tasks.score import group_keys_of, score
from tasks.train import train
from workflows.config import RunConfig, config_from_dict
from workflows.problem_order import draw_problems
from workflows.report import nan_to_none, write_report
from workflows.run_layout import RunLayout
from workflows.seeds import derive_seed


def _write_json(path: str, payload: dict[str, Any]) -> None:
    """Atomic (temp-then-rename, or one object PUT) JSON record in the run store."""
    run_store.write_text(path, json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n")


def _round_groups(scored_path: str) -> list[tuple[str, str, object]]:
    """``(group_key, reason, payload)`` per group of a scored round, in first-row order."""
    table = schemas.read_shard(run_store.fetch(scored_path), schemas.ScoredRollout)
    seen: dict[str, str] = {}
    for key, reason in zip(group_keys_of(table), table.column("filter_reason").to_pylist()):
        seen.setdefault(key, reason)
    return [(key, reason, scored_path) for key, reason in seen.items()]


def _problem_ids(paths: list[str]) -> list[str]:
    return schemas.read_shards(run_store.fetch_all(paths), schemas.Problem).column("problem_id").to_pylist()


def _fmt3(value: float | None) -> str:
    """A metric for the step line: a NaN written to the metrics shard reads back as None."""
    return "nan" if value is None else f"{value:.3f}"


def _sample_responses(batch_path: str, count: int = 4) -> list[dict[str, Any]]:
    table = schemas.read_shard(run_store.fetch(batch_path), schemas.ScoredRollout)
    cols = ["problem_id", "response_text", "reward", "correct", "filter_reason", "response_length", "finish_reason"]
    return table.select(cols).slice(0, count).to_pylist()


async def _evaluate(cfg: RunConfig, layout: RunLayout, checkpoint: str, test_paths: list[str], step: int) -> dict[str, Any]:
    text = await evaluate.aio(checkpoint, test_paths, str(layout.eval_shard(step)), step, cfg.evaluate, cfg.rollout)
    return {"step": step, **json.loads(text)}


def _step_row(
    trained: dict[str, Any],
    batch: Any,
    round_stats: list[dict[str, Any]],
    rounds: int,
    rollout_s: float,
    score_s: float,
    train_s: float,
) -> dict[str, Any]:
    """The StepMetrics row: the train task's columns plus what rollout and scoring measured."""
    samples = sum(s["samples"] for s in round_stats)

    def generated_mean(key: str) -> float:
        # Over everything generated this step; NaN when carried surplus alone filled the batch.
        return sum(s[key] * s["samples"] for s in round_stats) / samples if samples else math.nan

    row = {k: v for k, v in trained.items() if k not in ("checkpoint_dir", "timings")}
    row.update(
        reward_mean=float(pc.mean(batch.column("reward")).as_py()),
        accuracy=generated_mean("accuracy"),
        response_length_mean=float(pc.mean(batch.column("response_length")).as_py()),
        truncation_ratio=generated_mean("truncation_ratio"),
        generation_rounds=rounds,
        verdict_timeouts=sum(s["verdict_timeouts"] for s in round_stats),
        verdict_errors=sum(s["verdict_errors"] for s in round_stats),
        time_rollout_s=rollout_s,
        time_score_s=score_s,
        time_train_s=train_s,
    )
    return row


async def prepare_run(cfg: RunConfig, layout: RunLayout) -> dict[str, Any]:
    """Curate, build the step-0 policy and evaluate it; returns what ``train_and_report`` starts from."""
    drv = cfg.run
    curated = await curate.aio(list(drv.data), str(layout.curate_dir), cfg.curate)
    train_paths = run_store.glob(layout.problems_dir, "train-*.parquet")
    test_paths = run_store.glob(layout.problems_dir, "test-*.parquet")
    if not train_paths or not test_paths:
        raise RuntimeError(
            f"{layout.problems_dir}: curation produced no {'train' if not train_paths else 'test'} split; "
            "give curate.test_fraction > 0 or inputs marked @train/@test"
        )
    checkpoint = await bootstrap.aio(train_paths, test_paths, str(layout.checkpoint(0)), cfg.bootstrap)
    return {
        "checkpoint": checkpoint,
        "train_paths": train_paths,
        "test_paths": test_paths,
        "problems_train": curated.kept_by_split.get("train", 0),
        "problems_test": curated.kept_by_split.get("test", 0),
        "eval0": await _evaluate(cfg, layout, checkpoint, test_paths, 0),
    }


def start_run_folder(cfg: RunConfig, layout: RunLayout) -> None:
    """Record the resolved config in the run folder and clear what a killed invocation left."""
    _write_json(layout.run_record, {"config": cfg.to_dict(), "config_digest": cfg.digest(), "python": platform.python_version()})
    # A killed earlier invocation may have left half-built checkpoints under hidden staging
    # names; they are never read (no dapo_checkpoint.json), only cleaned up here. One driver
    # per run folder at a time. (An object store has no staging folders: tasks/run_store.py.)
    if not run_store.is_remote(layout.root):
        checkpoints.clean_stale_staging(layout.checkpoints_dir)


@cpu_env.task(report=True)
async def dapo_pipeline(config_json: str, run_dir: str, config_source: str = "") -> str:
    """Run or resume the DAPO pipeline into ``run_dir``; returns ``summary.json``'s content.

    ``config_json`` is ``RunConfig.to_dict()`` as JSON; ``config_source`` names the YAML it came
    from (recorded only).
    """
    started = time.perf_counter()
    cfg = config_from_dict(json.loads(config_json), source=config_source or "dapo_pipeline input")
    layout = RunLayout(run_dir)
    start_run_folder(cfg, layout)
    prepared = await prepare_run(cfg, layout)
    summary = await train_and_report(cfg, layout, prepared, started=started)
    await flyte.report.replace.aio(summary.pop("_inline_report"), do_flush=True)
    return json.dumps(summary, sort_keys=True)


async def train_and_report(cfg: RunConfig, layout: RunLayout, prepared: dict[str, Any], *, started: float) -> dict[str, Any]:
    """The DAPO steps from ``prepared`` (see ``prepare_run``), evaluations, report and summary.json.

    Returns the summary, plus the report page inlined under ``_inline_report`` (for flyte.report).
    """
    drv = cfg.run
    checkpoint, train_paths, test_paths = prepared["checkpoint"], prepared["train_paths"], prepared["test_paths"]
    train_ids = _problem_ids(train_paths)
    evals = [prepared["eval0"]]

    cursor = 0
    carried: list[tuple[str, object]] = []
    metrics_rows: list[dict[str, Any]] = []
    step_seconds: list[float] = []
    for step in range(1, drv.steps + 1):
        step_started = time.perf_counter()
        acc = DynamicSamplingAccumulator(
            target_groups=drv.prompts_per_step, max_rounds=drv.max_rounds, on_max_rounds=drv.on_max_rounds,
            carried=carried,
        )
        scored_paths = sorted({str(p) for _, p in carried})
        rollout_s = score_s = 0.0
        round_stats: list[dict[str, Any]] = []
        while acc.needs_more():
            rnd = acc.rounds
            ids = draw_problems(train_ids, seed=drv.seed, start=cursor, count=drv.prompts_per_round)
            cursor += len(ids)
            rollout_path = str(layout.rollout_shard(step, rnd))
            t = time.perf_counter()
            await rollout.aio(
                checkpoint, train_paths, ids, rollout_path, cfg.rollout,
                derive_seed(drv.seed, "rollout", step, rnd), step - 1, rnd,
            )
            rollout_s += time.perf_counter() - t
            scored_path = str(layout.scored_shard(step, rnd))
            t = time.perf_counter()
            stats = json.loads(
                await score.aio([rollout_path], train_paths, scored_path, cfg.rollout.max_response_tokens, cfg.score)
            )
            score_s += time.perf_counter() - t
            round_stats.append(stats)
            scored_paths.append(scored_path)
            acc.add_round(_round_groups(scored_path))
        result = acc.finish()
        carried = list(result.surplus)
        await assemble_batch.aio(
            scored_paths, [g for g, _ in result.kept], [g for g, _ in result.surplus],
            str(layout.batch_shard(step)), str(layout.surplus_shard(step)),
        )
        t = time.perf_counter()
        trained = json.loads(
            await train.aio(checkpoint, [str(layout.batch_shard(step))], str(layout.checkpoint(step)), step, cfg.train)
        )
        train_s = time.perf_counter() - t
        checkpoint = trained["checkpoint_dir"]

        batch = schemas.read_shard(run_store.fetch(layout.batch_shard(step)), schemas.ScoredRollout)
        if run_store.exists(layout.metrics_shard(step)):
            # Written when this step first finished; a re-run (all cache hits) must not replace
            # its measured stage timings with the near-zero time of cache lookups.
            row = schemas.read_shard(run_store.fetch(layout.metrics_shard(step)), schemas.StepMetrics).to_pylist()[0]
        else:
            row = _step_row(trained, batch, round_stats, result.rounds, rollout_s, score_s, train_s)
            with run_store.output(layout.metrics_shard(step)) as local:
                schemas.write_shard([row], local, schemas.StepMetrics)
        metrics_rows.append(nan_to_none(row))
        step_seconds.append(time.perf_counter() - step_started)
        print(
            f"[step {step}/{drv.steps}] rounds={result.rounds} batch={batch.num_rows} samples "
            f"acc={_fmt3(row['accuracy'])} reward={_fmt3(row['reward_mean'])} entropy={_fmt3(row['entropy'])} "
            f"({step_seconds[-1]:.1f} s)",
            flush=True,
        )
        if drv.eval_every_steps and step % drv.eval_every_steps == 0 and step != drv.steps:
            evals.append(await _evaluate(cfg, layout, checkpoint, test_paths, step))

    if drv.steps > 0:
        evals.append(await _evaluate(cfg, layout, checkpoint, test_paths, drv.steps))

    summary = {
        "run_dir": str(layout.root),
        "config": cfg.source,
        "config_digest": cfg.digest(),
        "steps": drv.steps,
        "accuracy_before": evals[0]["avg_at_k"],
        "accuracy_after": evals[-1]["avg_at_k"],
        "pass_at_k_before": evals[0]["pass_at_k"],
        "pass_at_k_after": evals[-1]["pass_at_k"],
        "eval_problems": evals[0]["problems"],
        "eval_k": evals[0]["k"],
        "evals": [{k: e.get(k) for k in ("step", "avg_at_k", "pass_at_k", "maj_at_k")} for e in evals],
        "final_checkpoint": checkpoint,
        "problems_train": prepared["problems_train"],
        "problems_test": prepared["problems_test"],
        "wall_seconds": round(time.perf_counter() - started, 2),
        "step_seconds": [round(s, 2) for s in step_seconds],
    }
    samples = _sample_responses(layout.batch_shard(drv.steps)) if drv.steps > 0 else []
    with run_store.output(layout.report_dir, folder=True) as report_dir:
        page, inline_page = write_report(
            report_dir, title=f"DAPO run {drv.name}", summary=summary, metrics=metrics_rows, evals=evals, samples=samples
        )
    summary["report"] = run_store.join(layout.report_dir, page.name)
    _write_json(layout.summary, summary)
    return {**summary, "_inline_report": inline_page}
