"""The tiny pipeline with its run folder in an object store (a local S3 server, moto).

What a cluster without a shared filesystem does: `dapo run --run-root s3://...` writes every
shard, checkpoint, record and the report to S3 through storage/run_store.py, and `dapo lineage`
reads the run back from S3. Checked: every shard in the store validates against its schema, each
checkpoint has its marker and names its S3 inputs, nothing half-written (temp or staging names)
reaches the store, a re-run is all cache hits, and lineage names S3 URIs.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import schemas
from storage import checkpoints, run_store
from storage.run_layout import RunLayout
from storage.run_summary import read_summary

sys.path.insert(0, str(Path(__file__).parent))
from test_pipeline import DAPO, REPO, SHIPPED, SMALL, _env  # noqa: E402

pytestmark = pytest.mark.slow


def _dapo(args: list[str], env: dict[str, str], timeout_s: float = 900) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([*DAPO, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)
    assert proc.returncode == 0, f"dapo {args[0]} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc


@pytest.fixture(scope="module")
def s3_run(s3, tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = f"s3://dapo-test/runs-{uuid.uuid4().hex[:8]}"
    env = {**_env(), **s3.env, run_store.MIRROR_ENV: str(tmp_path_factory.mktemp("mirror"))}
    args = ["run", "--config", str(REPO / "configs" / "tiny-cpu.yaml"), "--run-root", root]
    for item in [*SMALL, "run.steps=1", "run.name=s3"]:
        args += ["--set", item]
    first = _dapo(args, env)
    second = _dapo(args, env)  # a re-run: every task a cache hit
    return {"layout": RunLayout(run_store.join(root, "s3")), "env": env, "first": first, "second": second, "s3": s3}


@pytest.fixture
def store(s3_run: dict, monkeypatch: pytest.MonkeyPatch) -> RunLayout:
    """The run's layout, with this test process pointed at the same S3 server and mirror."""
    for key in (*s3_run["s3"].env, run_store.MIRROR_ENV):
        monkeypatch.setenv(key, s3_run["env"][key])
    run_store._filesystem.cache_clear()
    return s3_run["layout"]


def test_every_shard_in_the_store_validates(store: RunLayout) -> None:
    expected = {
        "curate/problems/*.parquet": schemas.Problem,
        "curate/rejected/*.parquet": schemas.RejectedProblem,
        "steps/step-0001/rollouts/*.parquet": schemas.Rollout,
        "steps/step-0001/scored/*.parquet": schemas.ScoredRollout,
        "steps/step-0001/batch.parquet": schemas.ScoredRollout,
        "steps/step-0001/surplus.parquet": schemas.ScoredRollout,
        "steps/step-0001/metrics.parquet": schemas.StepMetrics,
        "eval/*.parquet": schemas.EvalResult,
        "checkpoints/step-0001/train_metrics.parquet": schemas.StepMetrics,  # the train task's copy
    }
    for pattern, model in expected.items():
        paths = run_store.glob(store.root, pattern)
        assert paths, f"no {pattern} in {store.root}"
        for path in paths:
            assert path.startswith("s3://")
            schemas.read_shard(run_store.fetch(path), model)
    every = set(run_store.glob(store.root, "**/*.parquet"))
    covered = {p for pattern in expected for p in run_store.glob(store.root, pattern)}
    assert every == covered, f"shards outside the layout: {sorted(every - covered)}"
    names = run_store.glob(store.root, "**")
    assert not [n for n in names if ".staging-" in n or n.endswith(".tmp") or ".fetch-" in n]
    for manifest in run_store.glob(store.root, "steps/step-0001/rollouts/*.manifest.json"):
        assert json.loads(run_store.read_text(manifest))["checkpoint_dir"] == store.checkpoint(0)


def test_checkpoints_and_records_live_in_the_store(store: RunLayout) -> None:
    written = json.loads(run_store.read_text(store.summary))  # paths relative to the run folder
    assert (written["run_dir"], written["final_checkpoint"], written["report"]) == (".", "checkpoints/step-0001", "report/index.html")
    summary = read_summary(store.root)
    assert summary["run_dir"] == store.root and summary["final_checkpoint"] == store.checkpoint(1)
    assert summary["report"] == run_store.join(store.report_dir, "index.html") and run_store.exists(summary["report"])
    assert run_store.exists(store.run_record)
    step0 = checkpoints.read_info(run_store.fetch(store.checkpoint(0)))
    step1 = checkpoints.read_info(run_store.fetch(store.checkpoint(1)))
    assert step1.parent_checkpoint_id == step0.checkpoint_id
    assert step1.inputs["scored_shards"] == [store.batch_shard(1)]  # lineage names the store, not a mirror


def test_a_rerun_is_all_cache_hits(store: RunLayout) -> None:
    from workflows.run_records import action_records, flyte_runs

    records = action_records(store)  # the Flyte records live in the driving machine's mirror
    runs = flyte_runs(store)
    assert len(runs) == 2
    second = [r for r in records if r.run_name == runs[1] and r.cache_enabled]
    # every cached stage took part (a stage that lost its cache would drop out of `second` unnoticed)
    assert {r.task_name.split(".")[-1] for r in second} >= {
        "curate", "bootstrap", "rollout", "score", "assemble_batch", "train", "evaluate"}
    assert all(r.cache_hit for r in second), [(r.task_name, r.cache_hit) for r in second]


def test_lineage_reads_the_run_from_the_store(store: RunLayout, s3_run: dict) -> None:
    step = json.loads(_dapo(["lineage", store.root, "--step", "1", "--json"], s3_run["env"]).stdout)
    ids = [sample["rollout_id"] for sample in step["samples"]]
    assert ids and step["checkpoint"]["step"] == 1
    traced = json.loads(_dapo(["lineage", store.root, "--sample", ids[0]], s3_run["env"]).stdout)
    assert traced["trained"]["step"] == 1
    assert traced["generation"]["checkpoint_dir"] == store.checkpoint(0)
    assert traced["reward"]["scored_shard"].startswith(store.root + "/steps/step-0001/scored/")
    chain = json.loads(_dapo(["lineage", store.root, "--checkpoint", "1", "--json"], s3_run["env"]).stdout)["ancestry"]
    assert [c["folder"] for c in chain] == [store.checkpoint(1), store.checkpoint(0)]


def test_a_stage_reruns_alone_against_the_store(store: RunLayout, s3_run: dict) -> None:
    # `dapo score` on the run's S3 shards, into S3: the same table the pipeline's score task wrote.
    config = json.loads(run_store.read_text(store.run_record))["config"]
    out = f"s3://dapo-test/rerun-{uuid.uuid4().hex[:8]}/scored.parquet"
    proc = _dapo(["score", store.rollout_shard(1, 0), "--problems", *run_store.glob(store.problems_dir, "train-*.parquet"),
                  "--out", out, "--max-response-tokens", str(config["rollout"]["max_response_tokens"]),
                  "--config", str(REPO / "configs" / "tiny-cpu.yaml")], s3_run["env"])
    stats = json.loads(proc.stdout)  # stdout is the stats alone (`| jq`); "wrote ..." is on stderr
    again = schemas.read_shard(run_store.fetch(out), schemas.ScoredRollout)
    stored = schemas.read_shard(run_store.fetch(store.scored_shard(1, 0)), schemas.ScoredRollout)
    assert stats["groups"] == len(set(stored.column("problem_id").to_pylist()))
    assert again.num_rows > 0 and again.equals(stored)


def test_a_step_already_published_in_the_store_is_reused(store: RunLayout) -> None:
    # Killed after the upload but before Flyte recorded the result: the retry must return the
    # published checkpoint, not train again (training is not bit-reproducible across launches).
    from engines.train.launch import train_step_in_store
    from workflows.config import config_from_dict

    cfg = config_from_dict(json.loads(run_store.read_text(store.run_record))["config"], source="run.json")
    result = train_step_in_store(store.checkpoint(0), [store.batch_shard(1)], store.checkpoint(1), step=1,
                                 config=cfg.train)
    assert result.checkpoint_dir == store.checkpoint(1)
    assert result.checkpoint_id == checkpoints.read_info(run_store.fetch(store.checkpoint(1))).checkpoint_id
    assert result.worker_metrics == []  # nothing was trained


def test_a_fresh_rollout_node_fetches_the_checkpoint_without_its_optimizer_state(
    store: RunLayout, s3_run: dict, tmp_path: Path
) -> None:
    # A rollout node with an empty mirror downloads the weights, config and tokenizer it generates
    # from, not ds_state/ (storage.checkpoints.fetch_policy): 65.5 of 458.7 GB at paper scale.
    checkpoint = store.checkpoint(1)
    assert any("/ds_state/" in key for key in run_store.folder_files(checkpoint))  # the store holds it
    node = tmp_path / "engine-node"
    out = f"s3://dapo-test/fresh-{uuid.uuid4().hex[:8]}/rollout.parquet"
    proc = _dapo(["rollout", checkpoint, *run_store.glob(store.problems_dir, "train-*.parquet"), "--out", out,
                  "--limit", "2", "--config", str(REPO / "configs" / "tiny-cpu.yaml")],
                 {**s3_run["env"], run_store.MIRROR_ENV: str(node)})
    # stdout is the manifest alone (`dapo rollout ... | jq`): vLLM's logs, which it writes to stdout by
    # default, and C++ and worker output go to stderr (cli/result_stdout.py).
    assert json.loads(proc.stdout)["prompts"] == 2 and "WARNING" in proc.stderr
    mirrored = node / "s3" / checkpoint.split("://", 1)[1]
    assert (mirrored / "model.safetensors").is_file() and (mirrored / checkpoints.METADATA_FILE).is_file()
    assert not (mirrored / "ds_state").exists()
    assert schemas.read_shard(run_store.fetch(out), schemas.Rollout).num_rows > 0


def test_a_pipelined_run_trains_through_the_store(s3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``run.pipelined`` on an object store, what docs/CLUSTER.md prices as "pipelined (as
    implemented)": step N+1's rounds (from the policy after step N-1) are generated while step N
    trains, both sides reading and publishing through S3 and one node's mirror, where the rollout
    side evicts old copies while the train side reads its parent. Every step publishes, the rounds
    record the policy they came from, and a re-run is all cache hits."""
    from workflows.run_records import action_records, flyte_runs

    root = f"s3://dapo-test/pipelined-{uuid.uuid4().hex[:8]}"
    env = {**_env(), **s3.env, run_store.MIRROR_ENV: str(tmp_path / "mirror")}
    args = ["run", "--config", str(REPO / "configs" / "tiny-cpu.yaml"), "--run-root", root]
    # The shipped step-0 policy: the warm-up into the store is s3_run's to cover (~15 s a run).
    for item in [*SHIPPED, "run.steps=4", "run.pipelined=true", "run.name=pipe"]:
        args += ["--set", item]
    _dapo(args, env)
    _dapo(args, env)
    for key in (*s3.env, run_store.MIRROR_ENV):  # this process reads the same store and mirror
        monkeypatch.setenv(key, env[key])
    run_store._filesystem.cache_clear()
    layout = RunLayout(run_store.join(root, "pipe"))
    versions = {}
    for step in range(1, 5):
        assert checkpoints.is_complete(layout.checkpoint(step)), step
        rows = schemas.read_shards([run_store.fetch(p) for p in run_store.glob(layout.step_dir(step), "rollouts/*.parquet")],
                                   schemas.Rollout)
        versions[step] = sorted(set(rows.column("policy_version").to_pylist()))
    # Step N's rounds came from the policy after step N-2 (step 1's and 2's from the step-0 policy).
    assert versions == {1: [0], 2: [0], 3: [1], 4: [2]}
    runs, records = flyte_runs(layout), action_records(layout)  # in the driving machine's mirror
    assert len(runs) == 2
    second = [r for r in records if r.run_name == runs[1] and r.cache_enabled]
    # every cached stage took part (a stage that lost its cache would drop out of `second` unnoticed)
    assert {r.task_name.split(".")[-1] for r in second} >= {
        "curate", "bootstrap", "rollout", "score", "assemble_batch", "train", "evaluate"}
    assert all(r.cache_hit for r in second), [(r.task_name, r.cache_hit) for r in second]

