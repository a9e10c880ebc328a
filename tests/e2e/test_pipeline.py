"""The tiny pipeline end to end through Flyte locally, its cache, its lineage, and kill -9 resume.

One uninterrupted 2-step run (module fixture) is checked shard by shard against the schemas,
re-run to prove every task is a cache hit, and queried for lineage. A second run is killed with
SIGKILL while step 2 trains, re-run, and must end on the very checkpoint of the uninterrupted
run, with every earlier stage a cache hit. The uninterrupted run also answers for the action names
each step's task calls are recorded under and the lookup docs/CLUSTER.md documents (these were
test_action_names.py's, on a 1-step run of its own). Sizes are cut down from configs/tiny-cpu.yaml
so the module takes a few minutes on 2 cores.
"""

from __future__ import annotations

import getpass
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import schemas
from storage import checkpoints
from storage.run_layout import RunLayout
from storage.run_summary import read_summary
from cli.lineage import checkpoint_lineage, sample_lineage, trained_samples
from workflows.run_records import action_records, flyte_runs
from workflows.run_output import log_file

REPO = Path(__file__).resolve().parents[2]
DAPO = [sys.executable, "-m", "cli.main"]
# The default config cut small. The step-0 policy is warmed up here (bootstrap.source=tiny, a short
# warm-up) rather than imported as the default's shipped one: these runs cover the warm-up path,
# test_learning.py the shipped import.
SMALL = [
    "run.steps=2",
    "run.data=['synthetic:n=600,seed=0,min_terms=2,max_terms=2,max_operand=20,test_fraction=0.1']",
    "bootstrap.source=tiny",
    "bootstrap.seed=0",
    "bootstrap.cpu_threads=0",
    "run.prompts_per_step=8",
    "run.prompts_per_round=12",
    "run.max_rounds=2",
    "bootstrap.max_steps=60",
    "bootstrap.eval_every_steps=30",
    "bootstrap.eval_problems=16",
    "bootstrap.require_band=false",
    "rollout.samples_per_prompt=4",
    "train.micro_batch_samples=16",
    "train.updates_per_step=4",
    "evaluate.samples_per_problem=2",
    "evaluate.max_problems=16",
]

# SMALL on the default's data and shipped step-0 policy (configs/tiny-cpu.yaml): for runs that cover
# something other than the warm-up, which costs ~15 s of every fresh SMALL run (the import ~0.1 s).
SHIPPED = [item for item in SMALL if not item.startswith(("run.data=", "bootstrap."))]

pytestmark = pytest.mark.slow


def _env(temp: Path | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    if temp is not None:  # the run's system temp folder; compiled kernels stay where they were cached
        env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path(tempfile.gettempdir()) / f"torchinductor_{getpass.getuser()}"))
        env["TMPDIR"] = str(temp)
    return env


def _dapo_run(run_root: Path, name: str, *, timeout_s: float = 600, temp: Path | None = None,
              sets: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    args = [*DAPO, "run", "--config", str(REPO / "configs" / "tiny-cpu.yaml"), "--run-root", str(run_root)]
    for item in [*SMALL, *sets, f"run.name={name}"]:
        args += ["--set", item]
    proc = subprocess.run(args, cwd=REPO, env=_env(temp), capture_output=True, text=True, timeout=timeout_s)
    assert proc.returncode == 0, f"dapo run failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc


@pytest.fixture(scope="module")
def run_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="module")
def system_temp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first run's system temp folder (TMPDIR)."""
    return tmp_path_factory.mktemp("system-temp")


@pytest.fixture(scope="module")
def first_run(run_root: Path, system_temp: Path) -> subprocess.CompletedProcess[str]:
    """The first `dapo run` of the module (what a user sees: its stdout and stderr, not a terminal)."""
    return _dapo_run(run_root, "ref", temp=system_temp)


def test_a_finished_run_leaves_nothing_in_the_system_temp_folder(
        first_run: subprocess.CompletedProcess[str], system_temp: Path) -> None:
    """Flyte made a new raw-data folder there for every run, torchrun a log folder for every launch;
    neither was ever removed. Now Flyte's is in the run folder (flyte/raw) and torchrun's in the
    launch's own temp folder."""
    left = sorted(p.name for p in system_temp.iterdir())
    # torch's compile cache (precompiled headers are kept under the temp folder): made once, reused.
    assert [name for name in left if not name.startswith("torchinductor_")] == []


def test_flytes_action_folders_are_in_the_run_folder_and_only_the_report_is_kept(run_root: Path,
        first_run: subprocess.CompletedProcess[str]) -> None:
    """Local Flyte put a run's action folders under /tmp/flyte/metadata whatever TMPDIR said (the
    test above cannot see them) and kept them all, ~4 a step: they are the run's, and only the
    driver's report page holds anything."""
    actions = run_root / "ref" / "flyte" / "actions"
    assert [p.relative_to(actions).parts[2:] for p in actions.rglob("*") if p.is_file()] == [("report.html",)]
    assert [p for p in actions.rglob("*") if p.is_dir() and not any(p.iterdir())] == []


@pytest.fixture(scope="module")
def finished_run(run_root: Path, first_run: subprocess.CompletedProcess[str]) -> RunLayout:
    return RunLayout(run_root / "ref")


def test_each_steps_calls_are_named_by_step_and_round(finished_run: RunLayout) -> None:
    """Each step's task calls are recorded under readable action names, inside the step's group: local
    Flyte keeps the same records a cluster's UI lists (the action's short name, its group)."""
    db = Path(finished_run.flyte_dir) / "local-cache" / "cache.db"
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        rows = conn.execute("SELECT short_name, task_name, group_name FROM runs WHERE task_name IS NOT NULL").fetchall()
    named = {(short, task.split(".")[-1], group or "") for short, task, group in rows}
    assert {
        ("curate", "curate", ""),
        ("evaluate-step-0000", "evaluate", ""),
        ("rollout-step-0001-round-00", "rollout", "step-0001"),
        ("score-step-0001-round-00", "score", "step-0001"),
        ("assemble_batch-step-0001", "assemble_batch", "step-0001"),
        ("train-step-0001", "train", "step-0001"),
        ("rollout-step-0002-round-00", "rollout", "step-0002"),
        ("train-step-0002", "train", "step-0002"),
        ("evaluate-step-0002", "evaluate", ""),
    } <= named, sorted(named, key=str)  # (a root call has no short name)


def test_the_documented_lookup_finds_step_1s_train(finished_run: RunLayout) -> None:
    """The lookup command of docs/CLUSTER.md ("Finding and re-running one step's stage"), `dapo lineage RUN
    --checkpoint 1`: the checkpoint step 1's train wrote, its parent and its batch (the inputs its action
    received), as the how-to says."""
    proc = subprocess.run([*DAPO, "lineage", str(finished_run.root), "--checkpoint", "1"], cwd=REPO, env=_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "step-0001" in proc.stdout and "batch" in proc.stdout, proc.stdout


# What third-party libraries print on a run (vLLM, DeepSpeed, torch, Flyte, tqdm bars): the log file's.
NOISE = ("libtcmalloc", "NUMA", "reduce_op", "WARNING", "Warning", "Triton", "it/s]", "real_accelerator",
         "[warm-up]", "[rollout", "taskrunner")


def test_terminal_shows_progress_and_summary_and_the_log_file_holds_the_rest(
        first_run: subprocess.CompletedProcess[str], finished_run: RunLayout) -> None:
    lines = [*first_run.stdout.splitlines(), *first_run.stderr.splitlines()]
    noisy = [line for line in lines if any(word in line for word in NOISE)]
    assert not noisy, noisy
    # Not a terminal: one plain line per stage, step and evaluation, then the summary.
    allowed = ("[run] ", "[step ", "[eval step ", "DAPO run ", "  ")
    assert all(line.startswith(allowed) or not line.strip() for line in lines), lines
    assert [line.split("]")[0] for line in lines if line.startswith("[step ")] == ["[step 1/2", "[step 2/2"]
    # each step line holds what the update measured (issue 48); the first update names the workers' start
    assert all(" loss=" in line and " grad_norm=" in line and " tok/s=" in line for line in lines if line.startswith("[step "))
    assert [line for line in lines if "starting training workers" in line] == [
        "[run] step 1/2 (training; starting training workers, the first step only) ..."]
    assert sum(line.startswith("[eval step ") for line in lines) == 2  # step 0 and the final one
    assert len(lines) <= 20, "\n".join(lines)
    assert "run folder: " in first_run.stdout and "logs/dapo.log" in first_run.stdout
    log = (Path(finished_run.root) / "logs" / "dapo.log").read_text(errors="replace")
    for word in ("WARNING", "[warm-up]", "[rollout", "DeepSpeed workers"):
        assert word in log, word


def test_every_shard_validates_against_its_schema(finished_run: RunLayout) -> None:
    layout = finished_run
    expected = {
        "curate/problems/*.parquet": schemas.Problem,
        "curate/rejected/*.parquet": schemas.RejectedProblem,
        "steps/step-*/rollouts/*.parquet": schemas.Rollout,
        "steps/step-*/scored/*.parquet": schemas.ScoredRollout,
        "steps/step-*/batch.parquet": schemas.ScoredRollout,
        "steps/step-*/surplus.parquet": schemas.ScoredRollout,
        "steps/step-*/metrics.parquet": schemas.StepMetrics,
        "eval/*.parquet": schemas.EvalResult,
    }
    for pattern, model in expected.items():
        paths = sorted(Path(layout.root).glob(pattern))
        assert paths, f"no shard matches {pattern}"
        for path in paths:
            schemas.read_shard(path, model)  # raises ShardValidationError naming file/column/rows
    every = set(Path(layout.root).rglob("*.parquet"))
    covered = {p for pattern in expected for p in Path(layout.root).glob(pattern)}
    # train_metrics.parquet inside checkpoints is the train task's own copy of the StepMetrics row
    assert {p for p in every - covered if p.name != "train_metrics.parquet"} == set()
    for step in (0, 1, 2):
        assert checkpoints.is_complete(layout.checkpoint(step))
    summary = json.loads(Path(layout.summary).read_text())
    assert summary["steps"] == 2
    # The before/after figures are the step-0 and step-2 eval shards' mean per-problem avg@k, over the
    # 16 held-out problems at k = 2 (not another step's shard, not pass@k).
    for key, step in (("accuracy_before", 0), ("accuracy_after", 2)):
        rows = schemas.read_shard(layout.eval_shard(step), schemas.EvalResult).to_pylist()
        assert len(rows) == summary["eval_problems"] == 16 and {r["k"] for r in rows} == {summary["eval_k"]} == {2}
        assert summary[key] == pytest.approx(sum(r["avg_at_k"] for r in rows) / len(rows)), key
    assert summary["wall_seconds"] > 0
    assert (Path(layout.report_dir) / "index.html").is_file() and list(Path(layout.report_dir).glob("*.svg"))
    # no half-written leftovers anywhere
    assert not [p for p in Path(layout.root).rglob("*") if ".staging-" in p.name or p.name.endswith(".tmp")]


def test_report_page_of_a_real_run_in_chromium(finished_run: RunLayout, tmp_path: Path) -> None:
    from tests.browser import HEIGHT, WIDTH, browser, inspect_page

    summary = json.loads(Path(finished_run.summary).read_text())
    # the paired interval over problems, from the eval shards (not the binomial fallback)
    assert summary["accuracy_change_method"].startswith("paired over the 16 held-out problems")
    from dapo_core.intervals import paired_change

    per_problem = [{r["problem_id"]: r["avg_at_k"] for r in schemas.read_shard(
        finished_run.eval_shard(step), schemas.EvalResult).to_pylist()} for step in (0, 2)]
    ids = sorted(per_problem[0])
    assert sorted(per_problem[1]) == ids  # the same problems before and after, paired by id
    change, half = paired_change([per_problem[0][p] for p in ids], [per_problem[1][p] for p in ids])
    assert half is not None and half > 0
    assert summary["accuracy_change_ci95"] == pytest.approx([change - half, change + half])
    assert change == pytest.approx(summary["accuracy_after"] - summary["accuracy_before"])
    with browser() as drv:
        facts = inspect_page(drv, Path(finished_run.report_dir) / "index.html", tmp_path / "screens" / "run.png")
    assert facts["scrollWidth"] <= WIDTH and facts["images"] > 0 and not facts["broken"]
    assert not facts["console_errors"], facts["console_errors"]
    for id_, key in [("hl-before", "accuracy_before"), ("hl-after", "accuracy_after"), ("hl-steps", "steps")]:
        assert float(facts["pos"][id_]["value"]) == summary[key] and facts["pos"][id_]["top"] < HEIGHT


def test_second_run_is_all_cache_hits(finished_run: RunLayout, run_root: Path) -> None:
    layout = finished_run
    before = {p: p.stat().st_mtime_ns for p in Path(layout.root).rglob("*.parquet")}
    _dapo_run(run_root, "ref")
    runs = flyte_runs(layout)
    assert len(runs) >= 2
    last = [r for r in action_records(layout) if r.run_name == runs[-1] and r.cache_enabled]
    assert {r.task_name.split(".")[-1] for r in last} >= {"curate", "bootstrap", "rollout", "score", "assemble_batch", "train", "evaluate"}
    assert all(r.cache_hit for r in last), [(r.task_name, r.cache_hit) for r in last if not r.cache_hit]
    # Each DAPO step's tasks ran inside one Flyte group, as the UI shows them.
    groups = {(r.task_name.split(".")[-1], r.group) for r in action_records(layout) if r.run_name == runs[0]}
    assert {("train", "step-0001"), ("train", "step-0002"), ("rollout", "step-0001"), ("score", "step-0002")} <= groups, groups
    assert ("curate", "") in groups
    after = {p: p.stat().st_mtime_ns for p in Path(layout.root).rglob("*.parquet")}
    assert after == before  # nothing was rewritten


def test_lineage_answers_for_a_trained_sample(finished_run: RunLayout) -> None:
    layout = finished_run
    rollout_id = trained_samples(layout, 2)[0]
    info = sample_lineage(layout, rollout_id)
    assert info["trained"]["step"] == 2
    assert info["trained"]["produced_checkpoint"] == checkpoints.read_info(layout.checkpoint(2)).checkpoint_id
    assert info["generation"]["checkpoint_id"] == checkpoints.read_info(layout.checkpoint(1)).checkpoint_id
    assert info["problem"]["source"] == "synthetic" and info["problem"]["split"] == "train"
    # The reward record is this sample's own row of the scored shard it names, under today's reward.
    from dapo_core.rewards import REWARD_VERSION

    scored = [r for r in schemas.read_shard(info["reward"]["scored_shard"], schemas.ScoredRollout).to_pylist()
              if r["rollout_id"] == rollout_id]
    assert len(scored) == 1 and info["reward"]["reward_version"] == REWARD_VERSION
    for key in ("verdict_status", "reward", "reward_version"):
        assert info["reward"][key] == scored[0][key], key
    assert info["filter"]["final"].startswith("trained at step 2")
    chain = checkpoint_lineage(layout, "2")["ancestry"]
    assert [c["step"] for c in chain] == [2, 1, 0]
    assert chain[0]["batch"]["samples"] > 0 and "metrics" in chain[0]
    # the CLI prints the same
    proc = subprocess.run([*DAPO, "lineage", str(layout.root), "--sample", rollout_id], cwd=REPO, env=_env(),
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout)["trained"]["step"] == 2


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


# The killed run writes the optimizer state only at even steps, so step 1 has none and the warm group that
# held it dies with the kill: the re-run's step 2 rebuilds it by replaying step 1 (engines/train/replay.py).
STATE_EVERY_2 = ("train.optimizer_state_every=2",)


def test_sigkill_during_training_then_rerun_matches_uninterrupted(finished_run: RunLayout, run_root: Path) -> None:
    name = "killed"
    layout = RunLayout(run_root / name)
    args = [*DAPO, "run", "--config", str(REPO / "configs" / "tiny-cpu.yaml"), "--run-root", str(run_root)]
    for item in [*SMALL, *STATE_EVERY_2, f"run.name={name}"]:
        args += ["--set", item]
    temp = run_root / f"{name}-system-temp"  # the killed run's and its re-run's TMPDIR
    temp.mkdir()
    proc = subprocess.Popen(args, cwd=REPO, env=_env(temp), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + 600
    try:
        # Step 2's training has begun once its staging folder exists (made before the workers
        # start updating); a warm worker group needs only ~1 s per step, so look often.
        while not list(Path(layout.checkpoints_dir).glob(".step-0002.staging-*")):
            assert proc.poll() is None, "the run ended before step 2 trained"
            assert time.monotonic() < deadline, "step 2 never started training"
            time.sleep(0.01)
    finally:
        # kill -9 the whole tree at once, as a lost machine would: driver, torchrun, workers
        for pid in [proc.pid, *_descendants(proc.pid)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()
    assert not checkpoints.is_complete(layout.checkpoint(2)), "killed too late: step 2 already published"
    # The run page was redrawn after step 1: a user watching saw the run in progress.
    page = (Path(layout.report_dir) / "index.html").read_text()
    assert "id='hl-status' data-value='&#x27;running, step 1/2" in page, page[:3000]

    killed_left = sorted(p.name for p in temp.iterdir())
    assert not (Path(layout.checkpoint(1)) / "ds_state").exists()
    _dapo_run(run_root, name, temp=temp, sets=STATE_EVERY_2)
    assert "[train] step 1: replaying it from bootstrap-0000-" in log_file(layout).read_text()
    # What the kill left in the temp folder: the train launch's folder, removed by the re-run (its
    # owner is gone), and the in-process vLLM engine's rendezvous file, which names no owner and stays.
    assert any(n.startswith("dapo-train-") for n in killed_left), killed_left
    left = [p.name for p in temp.iterdir() if not p.name.startswith("torchinductor_")]
    assert [n for n in left if not n.startswith("vllm_dist_")] == [], left
    runs = flyte_runs(layout)
    last = [r for r in action_records(layout) if r.run_name == runs[-1] and r.cache_enabled]
    ran = [r.task_name.split(".")[-1] for r in last if not r.cache_hit]
    # only step 2's training and what follows it re-executed
    assert ran == ["train", "evaluate"], ran
    for task in ("curate", "bootstrap"):
        assert any(r.task_name.endswith(task) and r.cache_hit for r in last)
    # The killed driver's actions are closed in the run records, not left "running" forever.
    records = action_records(layout)
    assert not [r for r in records if r.status == "running"], [(r.run_name, r.task_name) for r in records if r.status == "running"]
    assert any(r.run_name == runs[0] and r.status == "failed" and r.task_name.endswith("train") for r in records)
    ref = checkpoints.read_info(finished_run.checkpoint(2))
    got = checkpoints.read_info(layout.checkpoint(2))
    assert got.checkpoint_id == ref.checkpoint_id  # same weights digest: training continued exactly
    assert checkpoints.weights_digest(layout.checkpoint(2)) == checkpoints.weights_digest(finished_run.checkpoint(2))


def test_rerun_remakes_deleted_and_damaged_outputs(finished_run: RunLayout, run_root: Path) -> None:
    """A deleted final checkpoint, a flipped batch shard and a truncated scored shard: a re-run
    names them, makes them again and ends on a checkpoint that exists; `dapo verify` then passes."""
    from storage import digests
    from cli.verify import verify_run

    layout = finished_run
    t = time.perf_counter()
    problems, checked = verify_run(layout.root)
    assert problems == [] and checked > 0
    print(f"\n[timing] dapo verify of the intact run: {checked} files, {time.perf_counter() - t:.2f} s", flush=True)
    # (An intact cached re-run is test_second_run_is_all_cache_hits's: it is not started again here.)

    final = Path(layout.checkpoint(2))
    shutil.rmtree(final)
    batch = Path(layout.batch_shard(1))
    data = bytearray(batch.read_bytes())
    data[len(data) // 2:len(data) // 2 + 4] = bytes(b ^ 0xFF for b in data[len(data) // 2:len(data) // 2 + 4])
    batch.write_bytes(bytes(data))
    scored = Path(layout.scored_shard(2, 0))
    scored.write_bytes(scored.read_bytes()[:100])
    verify = subprocess.run([*DAPO, "verify", str(layout.root)], cwd=REPO, env=_env(), capture_output=True, text=True)
    assert verify.returncode == 1
    for path in (final / checkpoints.METADATA_FILE, batch, scored):
        assert str(path) in verify.stdout, verify.stdout

    proc = _dapo_run(run_root, "ref")
    for path in (final, batch, scored):
        assert str(path) in proc.stderr  # the re-run names what it makes again
    summary = read_summary(layout.root)
    assert summary["final_checkpoint"] == str(final) and checkpoints.is_complete(final)
    assert digests.check(final) == [] and digests.check(batch) == [] and digests.check(scored) == []
    schemas.read_shard(batch, schemas.ScoredRollout)
    assert subprocess.run([*DAPO, "verify", str(layout.root)], cwd=REPO, env=_env()).returncode == 0
    # Each re-made call has a cache entry of its own (storage/remakes.py): the next resume is all cache
    # hits of those entries, so what it returns describes the re-made outputs, not the first ones.
    from storage import remakes

    assert all(Path(remakes.record_path(path)).is_file() for path in (final, batch, scored))
    _dapo_run(run_root, "ref")
    last = [r for r in action_records(layout) if r.run_name == flyte_runs(layout)[-1] and r.cache_enabled]
    assert last and all(r.cache_hit for r in last), [(r.task_name, r.cache_hit) for r in last if not r.cache_hit]
