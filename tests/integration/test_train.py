"""The training stage end to end: torchrun + DeepSpeed workers on a tiny Qwen2, on CPU (gloo).

Launches are the expensive part (~10-25 s each on 2 cores), so a module-scoped fixture runs each
distinct configuration once and the tests compare what they produced:

- A: 1 process, micro-batch = whole mini-batch, step 1 (also probes logits for the export test)
- B: 2 processes, same step                     -> same weights as A (rank split + DeepSpeed averaging)
- C: 1 process, micro-batch 1, via the Flyte task -> same weights as A (accumulation scaling)
- D: step 2 from A's published checkpoint (its digest record written), via `dapo train` (optimizer
  state restored from ds_state/)
- E: steps 1 and 2 in one engine                -> same weights as D (optimizer state really carried)
- a plain-torch re-implementation of the step (AdamW, clipping, warm-up)  -> same weights as A

A, C and D run on the warm worker group (``keep_workers_warm``, the default; every config change
restarts it), B and E with one launch per step (the cold path). The warm-group tests at the end
compare 2 warm steps with 2 cold steps bitwise (weights and optimizer state), re-run steps from
parents that are not the group's last output, and check the group's lifecycle (config change,
owner killed, dead or hung group replaced by a cold launch).

The first DeepSpeed launch on a fresh machine JIT-compiles a shared-memory comm op (~50 s, cached
under TORCH_EXTENSIONS_DIR / ~/.cache/torch_extensions).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import shutil
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).parent))
from train_fixtures import assert_published_whole, optimizer_state, random_batch, same_state, write_scored  # noqa: E402

from dapo_core.losses import policy_loss  # noqa: E402
from engines.train import batch as tb
from engines.train import server as train_server
from engines.bootstrap.tiny_policy import build_random_checkpoint  # noqa: E402
from engines.train.engine import warmup_lr_factor  # noqa: E402
from engines.train.launch import _worker_env, _worker_spec, start_workers, train_step, train_steps
from engines.train.publish import METRICS_FILE, TrainStepError
from engines.train.spec import DS_STATE_DIR  # noqa: E402
from settings.train import TrainConfig  # noqa: E402
from storage import checkpoints, digests


# A warm-up of 4 updates and tight clipping so the LR schedule and clipping both matter.
CONFIG = TrainConfig(
    num_processes=1,
    micro_batch_samples=4,
    updates_per_step=2,
    lr=3e-3,
    weight_decay=0.1,
    warmup_steps=2,  # = 4 optimizer updates (2 per step)
    grad_clip_norm=1.0,
    tis_cap=2.0,  # truncated importance sampling on: the fixture's rollout log-probs are random
    seed=7,
)
ATOL = 2e-5  # fp32: different summation orders only


def _weights(folder: str | Path) -> dict[str, torch.Tensor]:
    return load_file(str(Path(folder) / "model.safetensors"))


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


@pytest.fixture(scope="module")
def ck0(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A published step-0 checkpoint: random 2-layer, hidden-32 Qwen2 over the tiny vocabulary."""
    root = tmp_path_factory.mktemp("ck0")
    return build_random_checkpoint(root / "ck0", seed=0, num_layers=2, hidden_size=32, num_heads=2)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, ck0: Path) -> dict:
    root = tmp_path_factory.mktemp("train")
    vocab = json.loads((ck0 / "config.json").read_text())["vocab_size"]
    # Step 1: 9 kept samples (mini-batches of 5 and 4: ranks and micro-batches get uneven shares),
    # sample 3 overlong-filtered, plus 2 rows that dynamic sampling dropped.
    rows1 = random_batch(1, 9, vocab=vocab, masked=(3,))
    dropped = random_batch(9, 2, vocab=vocab, prefix="dropped")
    for r in dropped:
        r.update(kept=False, filter_reason="all_wrong", correct=False, rule_reward=-1.0, reward=-1.0, advantage=0.0)
    shard1 = write_scored(root / "batch1.parquet", rows1 + dropped)
    shard2 = write_scored(root / "batch2.parquet", random_batch(2, 8, vocab=vocab))
    probe = [[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16]]

    out: dict = {"root": root, "ck0": ck0, "shard1": shard1, "shard2": shard2, "vocab": vocab, "probe": probe}
    out["A"] = train_steps(ck0, [(1, [shard1])], root / "A1", config=CONFIG, probe_input_ids=probe,
                           probe_path=root / "probe_A.pt")
    # 2 ranks x micro-batch 2: mini-batch 0 (5 samples) gives rank 0 three samples (2 micro-batches)
    # and rank 1 two (1 micro-batch + 1 zero-weight filler).
    out["B"] = train_step(ck0, [shard1], root / "B1", step=1,
                          config=replace(CONFIG, num_processes=2, micro_batch_samples=2, keep_workers_warm=False))

    import flyte

    from tasks.train import train as train_task

    from workflows.local_flyte import run_local

    flyte.init()
    # Uncached: without a run folder's config the cache is the user's (~/.flyte), and a later suite
    # whose temp folders repeat these paths (pytest numbers them afresh once /tmp/pytest-of-* is
    # cleared) would get this call's old result, whose folder is gone.
    inputs = {"checkpoint_dir": str(ck0), "scored_shards": [str(shard1)], "out_dir": str(root / "C1"), "step": 1,
              "config": replace(CONFIG, micro_batch_samples=1)}
    published = run_local(train_task.override(cache="disable"), inputs, raw_data=root / "flyte-raw",
                          actions=root / "flyte-actions")
    import schemas

    row = schemas.read_shard(Path(published.checkpoint_dir) / METRICS_FILE, schemas.StepMetrics).to_pylist()[0]
    out["C"] = {**row, "checkpoint_dir": published.checkpoint_dir, "returned_id": published.checkpoint_id}

    from cli.main import main as dapo_main

    sets = [f"train.{k}={v}" for k, v in (("micro_batch_samples", 4), ("updates_per_step", 2), ("lr", 3e-3),
                                           ("weight_decay", 0.1), ("warmup_steps", 2), ("tis_cap", 2.0), ("seed", 7))]
    # Published as the pipeline publishes (tasks/train.py records its digests): `dapo train` resumes
    # only optimizer state that a digest record vouches for.
    digests.record(root / "A1")
    argv = ["train", str(root / "A1"), str(shard2), "--out", str(root / "D2"), "--step", "2"]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        out["D_rc"] = dapo_main(argv + [a for s in sets for a in ("--set", s)])
    out["D_stdout"] = printed.getvalue()
    out["E"] = train_steps(ck0, [(1, [shard1]), (2, [shard2])], root / "E2", config=replace(CONFIG, keep_workers_warm=False))
    return out


def test_step_publishes_a_complete_checkpoint(runs: dict) -> None:
    a = runs["A"]
    folder = assert_published_whole(a.checkpoint_dir, a.checkpoint_id, runs["ck0"], step=1)
    m = a.metrics
    # 11 rows: 2 dropped (kept=False) are excluded, 1 of the 9 kept is overlong-filtered.
    assert (m["samples"], m["masked_samples"]) == (9, 1)
    kept = tb.load_rows([runs["shard1"]])
    assert m["tokens"] == sum(len(r.response_token_ids) for r in kept if not r.loss_masked)
    assert math.isnan(m["reward_mean"]) and m["time_train_s"] > 0
    assert m["lr"] == pytest.approx(3e-3 * warmup_lr_factor(1, 4))  # 2nd update of 4 warm-up updates
    for key in ("load_s", "old_log_probs_s", "updates_s", "save_export_s", "time_train_s"):
        assert a.timings[key] >= 0, key
    import schemas

    table = schemas.read_shard(folder / METRICS_FILE, schemas.StepMetrics)
    assert table.column("checkpoint_id").to_pylist() == [a.checkpoint_id]
    # The first update starts exactly at pi_old (recomputed by the trainer): no clipping possible
    # on it, and the ratio drift after 2 updates is small but positive.
    assert m["approx_kl"] > 0 and m["entropy"] > 0
    w = a.worker_metrics[0]
    # Fixture rollout log-probs are random in [-3, 0]: a real mismatch, and TIS weights capped at 2
    # (tis_cap = behaviour correction "always"), recorded in StepMetrics.
    assert 0 < w["logprob_mismatch_mean_abs"] <= w["logprob_mismatch_max_abs"]
    assert 0 < w["behaviour_weight_mean"] <= 2.0
    assert m["behaviour_weight_mean"] == pytest.approx(w["behaviour_weight_mean"])
    assert (m["policy_lag_max"], m["stale_sample_fraction"]) == (0, 0.0)  # policy_version 0, parent step 0


def test_rerun_of_a_published_step_returns_it_without_training(runs: dict) -> None:
    again = train_step(runs["ck0"], [runs["shard1"]], runs["root"] / "A1", step=1, config=CONFIG)
    assert again.checkpoint_id == runs["A"].checkpoint_id and again.worker_metrics == []  # no launch
    assert again.metrics["tokens"] == runs["A"].metrics["tokens"]
    with pytest.raises(TrainStepError, match=r"step 5: .*A1 already holds train-0001-"):
        train_step(runs["ck0"], [runs["shard1"]], runs["root"] / "A1", step=5, config=CONFIG)


def test_a_published_step_from_another_config_or_batch_is_trained_again(runs: dict) -> None:
    """Reuse compares what produced the step (config, batch content), not only step and parent."""
    import shutil

    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    stale = runs["root"] / "A1-stale"
    shutil.copytree(runs["A"].checkpoint_dir, stale)
    other = replace(CONFIG, lr=CONFIG.lr * 2)
    again = train_step(runs["ck0"], [runs["shard1"]], stale, step=1, config=other)
    assert again.worker_metrics != [] and again.checkpoint_id != runs["A"].checkpoint_id
    assert checkpoints.read_info(stale).inputs["config"]["lr"] == other.lr
    shutil.rmtree(stale)
    shutil.copytree(runs["A"].checkpoint_dir, stale)
    changed = runs["root"] / "shard1-rescored.parquet"
    table = pq.read_table(runs["shard1"])
    column = table.schema.get_field_index("advantage")
    table = table.set_column(column, "advantage", pc.negate(table.column("advantage")))
    pq.write_table(table, changed)
    again = train_step(runs["ck0"], [changed], stale, step=1, config=CONFIG)
    assert again.worker_metrics != [] and again.checkpoint_id != runs["A"].checkpoint_id


def test_two_processes_give_the_same_update(runs: dict) -> None:
    a, b = runs["A"], runs["B"]
    assert (b.worker_metrics[0]["world_size"], b.worker_metrics[0]["accumulation_steps"]) == (2, 2)
    # Grad norms are before clipping: equal only if DeepSpeed's averaging over ranks is undone.
    assert b.worker_metrics[0]["grad_norms"] == pytest.approx(a.worker_metrics[0]["grad_norms"], rel=1e-5)
    assert _max_diff(_weights(a.checkpoint_dir), _weights(b.checkpoint_dir)) < ATOL
    assert b.metrics["loss"] == pytest.approx(a.metrics["loss"], abs=1e-6)


def test_micro_batch_size_does_not_change_the_update(runs: dict) -> None:
    c = runs["C"]
    assert c["step"] == 1 and c["checkpoint_dir"].endswith("C1") and c["returned_id"] == c["checkpoint_id"]
    assert _max_diff(_weights(runs["A"].checkpoint_dir), _weights(c["checkpoint_dir"])) < ATOL
    assert c["grad_norm"] == pytest.approx(runs["A"].metrics["grad_norm"], rel=1e-5)


def _reference_step(ck0: Path, shard: Path, *, config: TrainConfig, step: int) -> tuple[dict[str, torch.Tensor], list[float]]:
    """The same step in plain torch: full mini-batch forward, TIS, AdamW, clip, linear warm-up.

    The loss is aggregated over each whole mini-batch with ``config.loss_agg``.
    """
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(ck0, dtype=torch.float32)
    batch = tb.collate(tb.load_rows([shard]), pad_token_id=int(model.config.pad_token_id))
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=config.lr, betas=(config.beta1, config.beta2), eps=config.adam_eps,
                            weight_decay=config.weight_decay)
    warmup = config.warmup_steps * config.updates_per_step * config.epochs_per_step
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda u: warmup_lr_factor(u, warmup))
    model.eval()
    with torch.no_grad():
        old = tb.token_log_probs(model(input_ids=batch.input_ids, attention_mask=batch.attention_mask.long()).logits,
                                 batch.input_ids)
    norms = []
    minis = tb.mini_batches(batch.num_samples, config.updates_per_step, seed=config.seed + step)
    for mini in [mini for _ in range(config.epochs_per_step) for mini in minis]:
        mb = tb.select(batch, mini)
        lp = tb.token_log_probs(model(input_ids=mb.input_ids, attention_mask=mb.attention_mask.long()).logits,
                                mb.input_ids)
        old_mb = old[mini][:, : lp.shape[1]]
        # Truncated importance sampling: per-token weight min(pi_old / pi_rollout, cap) on the loss.
        tis = torch.clamp(torch.exp(old_mb - mb.rollout_log_probs), max=config.tis_cap)
        loss, _ = policy_loss(lp, old_mb, mb.advantages * tis, mb.loss_mask, agg=config.loss_agg,
                              max_response_tokens=config.loss_norm_tokens or None)
        opt.zero_grad()
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(params, config.grad_clip_norm)))
        opt.step()
        sched.step()
    state = {k: v.detach().clone() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    return state, norms


def test_deepspeed_step_matches_a_plain_torch_reference(runs: dict) -> None:
    ref, norms = _reference_step(runs["ck0"], runs["shard1"], config=CONFIG, step=1)
    assert runs["A"].worker_metrics[0]["grad_norms"] == pytest.approx(norms, rel=1e-4)
    got = _weights(runs["A"].checkpoint_dir)
    assert _max_diff({k: got[k] for k in ref}, ref) < 1e-4
    assert _max_diff({k: got[k] for k in ref}, _weights(runs["ck0"])) > 1e-3  # it did move


def test_several_passes_over_the_mini_batches_match_the_reference(runs: dict, tmp_path: Path) -> None:
    # epochs_per_step=3 (verl's ppo_epochs): the same 2 mini-batches 3 times, each update clipped
    # around the parent's log-probs, split over 2 ranks; warm-up counts all 6 updates.
    config = replace(CONFIG, epochs_per_step=3)
    got = train_step(runs["ck0"], [runs["shard1"]], tmp_path / "P1", step=1,
                     config=replace(config, num_processes=2, micro_batch_samples=2, keep_workers_warm=False))
    ref, norms = _reference_step(runs["ck0"], runs["shard1"], config=config, step=1)
    metrics = got.worker_metrics[0]
    assert metrics["updates"] == 6 and len(norms) == 6
    assert metrics["grad_norms"] == pytest.approx(norms, rel=1e-4)
    weights = _weights(got.checkpoint_dir)
    assert _max_diff({k: weights[k] for k in ref}, ref) < 1e-4
    # Later passes are off-policy against pi_old: the clip binds there, not in a single pass's first update.
    assert metrics["clip_frac_low"] + metrics["clip_frac_high"] > 0
    assert metrics["approx_kl"] > runs["A"].worker_metrics[0]["approx_kl"]


@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_sample_level_losses_split_over_ranks_match_the_whole_mini_batch(runs: dict, tmp_path: Path, agg: str) -> None:
    # 2 ranks x micro-batches of 2 with an overlong-filtered sample: the sequence counts must be
    # those of the whole mini-batch (all-reduced), or the update would depend on the split.
    config = replace(CONFIG, loss_agg=agg, loss_norm_tokens=12 if agg.endswith("sum-norm") else 0)
    got = train_step(runs["ck0"], [runs["shard1"]], tmp_path / "S1", step=1,
                     config=replace(config, num_processes=2, micro_batch_samples=2, keep_workers_warm=False))
    ref, norms = _reference_step(runs["ck0"], runs["shard1"], config=config, step=1)
    assert got.worker_metrics[0]["grad_norms"] == pytest.approx(norms, rel=1e-4)
    weights = _weights(got.checkpoint_dir)
    assert _max_diff({k: weights[k] for k in ref}, ref) < 1e-4
    token_mean = _weights(runs["A"].checkpoint_dir)
    assert _max_diff({k: weights[k] for k in ref}, {k: token_mean[k] for k in ref}) > 1e-4  # a different loss


def test_ranks_started_by_an_elastic_agent_train_like_the_torchrun_launch(runs: dict, tmp_path: Path) -> None:
    # What the Flyte PyTorch plugin does on a cluster: the agent starts N copies of the task body,
    # each one a rank (engines/train/rank.py). 2 ranks here must give run A's update (1 process).
    import subprocess
    from dataclasses import asdict

    config = replace(CONFIG, num_processes=2, micro_batch_samples=2, keep_workers_warm=False)
    args = {"checkpoint": str(runs["ck0"]), "shards": [str(runs["shard1"])], "out": str(tmp_path / "R1"), "step": 1,
            "config": asdict(config), "result_path": str(tmp_path / "result.json")}
    (tmp_path / "args.json").write_text(json.dumps(args))
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         f"--log-dir={tmp_path / 'torchelastic'}",  # else a torchelastic_* folder in /tmp per launch
         str(Path(__file__).parent / "elastic_rank_main.py"), str(tmp_path / "args.json")],
        cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads((tmp_path / "result.json").read_text())
    info = checkpoints.read_info(tmp_path / "R1")
    assert info.checkpoint_id == result["checkpoint_id"] and info.step == 1
    assert result["worker_metrics"][0]["world_size"] == 2
    assert _max_diff(_weights(tmp_path / "R1"), _weights(runs["A"].checkpoint_dir)) < ATOL
    assert not list(tmp_path.glob(".R1.staging-*"))  # staging and work folders cleaned up


def _two_node_step(tmp_path: Path, args: dict) -> tuple[dict, list[str]]:
    """One train step as two elastic agents, one per "node", each with its own local mirror (no
    shared folder); returns rank 0's result and both agents' logs."""
    import socket
    import subprocess

    from storage import run_store

    (tmp_path / "args.json").write_text(json.dumps(args))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    repo = Path(__file__).resolve().parents[2]
    agents = [
        subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", str(node),
             "--nproc_per_node", "1", "--master_addr", "127.0.0.1", "--master_port", str(port),
             f"--log-dir={tmp_path / f'torchelastic-{node}'}",  # else a torchelastic_* folder in /tmp
             str(Path(__file__).parent / "elastic_rank_main.py"), str(tmp_path / "args.json")],
            cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(repo),
                 run_store.MIRROR_ENV: str(tmp_path / f"node-{node}")},
        )
        for node in (0, 1)
    ]
    logs = [agent.communicate(timeout=600)[0] for agent in agents]
    assert [a.returncode for a in agents] == [0, 0], "\n".join(log[-3000:] for log in logs)
    return json.loads(Path(args["result_path"]).read_text()), logs


@pytest.mark.parametrize("zero_stage", [1, 3])  # 3: the paper config's (every rank's model states apart too)
def test_two_nodes_without_a_shared_filesystem_publish_through_the_object_store_and_resume_from_it(
    runs: dict, tmp_path: Path, s3_env, monkeypatch: pytest.MonkeyPatch, zero_stage: int
) -> None:
    # Step 1: each node fetches the parent from S3, node 1 uploads its rank's optimizer shard, rank
    # 0 adds the marker last (engines/train/rank.py). Same update as run A; both ranks' state in
    # the store. Step 2 resumes from it: each node fetches only its own rank's optimizer partition.
    from dataclasses import asdict

    from storage import run_store

    root = f"s3://dapo-test/two-nodes-zero{zero_stage}"  # a store folder of its own per case
    run_store.upload_folder(runs["ck0"], f"{root}/ck0")
    run_store.upload_file(runs["shard1"], f"{root}/batch.parquet")
    run_store.upload_file(runs["shard2"], f"{root}/batch2.parquet")
    config = replace(CONFIG, num_processes=2, micro_batch_samples=2, keep_workers_warm=False, zero_stage=zero_stage)
    args = {"checkpoint": f"{root}/ck0", "shards": [f"{root}/batch.parquet"], "out": f"{root}/step-0001", "step": 1,
            "config": asdict(config), "result_path": str(tmp_path / "result.json")}
    result, _ = _two_node_step(tmp_path, args)
    assert result["checkpoint_dir"] == f"{root}/step-0001"
    names = [u.removeprefix(f"{root}/step-0001/") for u in run_store._find(f"{root}/step-0001")]
    assert any("rank_1" in n for n in names if n.startswith(DS_STATE_DIR)), names  # uploaded by node 1
    assert any("rank_0" in n for n in names if n.startswith(DS_STATE_DIR)), names
    node1_store = tmp_path / "node-1" / "s3" / "dapo-test" / f"two-nodes-zero{zero_stage}"  # node 1's mirror
    assert (node1_store / "ck0" / "model.safetensors").is_file()  # fetched
    fresh = tmp_path / "reader"
    monkeypatch.setenv(run_store.MIRROR_ENV, str(fresh))
    published = run_store.fetch(f"{root}/step-0001")
    assert published.is_relative_to(fresh)
    info = checkpoints.read_info(published)
    assert info.checkpoint_id == result["checkpoint_id"] and info.inputs["scored_shards"] == [f"{root}/batch.parquet"]
    assert _max_diff(_weights(published), _weights(runs["A"].checkpoint_dir)) < ATOL

    shutil.rmtree(tmp_path / "node-1")  # node 1 is a fresh pod for step 2: nothing of step 1 in its mirror
    args2 = {**args, "checkpoint": f"{root}/step-0001", "shards": [f"{root}/batch2.parquet"], "out": f"{root}/step-0002",
             "step": 2, "result_path": str(tmp_path / "result2.json")}
    result2, _ = _two_node_step(tmp_path, args2)
    node1_parent = node1_store / "step-0001"
    state_files = [p.name for p in (node1_parent / DS_STATE_DIR).rglob("*") if p.is_file()]
    assert any("zero_pp_rank_1_mp_rank_" in n for n in state_files), state_files  # its own partition
    assert not any("zero_pp_rank_0_mp_rank_" in n for n in state_files), state_files  # not node 0's
    # Nor the parent's HF weights: the engine is built from its config and its weights come with the
    # DeepSpeed state it resumes (65.5 GB a train node a step for Qwen2.5-32B).
    assert (node1_parent / "config.json").is_file() and not list(node1_parent.glob("*.safetensors"))
    assert result2["worker_metrics"][0]["updates_done"] == 4  # resumed: 2 updates of step 1 + 2 of step 2
    monkeypatch.setenv(run_store.MIRROR_ENV, str(tmp_path / "reader2"))
    assert _max_diff(_weights(run_store.fetch(f"{root}/step-0002")), _weights(runs["E"].checkpoint_dir)) < ATOL


def test_chunked_log_probs_and_activation_checkpointing_do_not_change_the_update(runs: dict, tmp_path: Path) -> None:
    # The memory savers for long samples (docs/CLUSTER.md) must be pure memory/time trades:
    # chunks of 5 positions (fixture responses are 3-12 tokens after 4 prompt tokens), layers
    # recomputed in backward; same update and metrics as run A up to float rounding.
    config = replace(CONFIG, logprob_chunk_tokens=5, activation_checkpointing=True, keep_workers_warm=False)
    got = train_step(runs["ck0"], [runs["shard1"]], tmp_path / "K1", step=1, config=config)
    a = runs["A"]
    assert got.worker_metrics[0]["grad_norms"] == pytest.approx(a.worker_metrics[0]["grad_norms"], rel=1e-5)
    assert _max_diff(_weights(got.checkpoint_dir), _weights(a.checkpoint_dir)) < ATOL
    assert got.metrics["entropy"] == pytest.approx(a.metrics["entropy"], rel=1e-5)
    assert got.metrics["tokens"] == a.metrics["tokens"]


def test_loss_agg_is_checked() -> None:
    with pytest.raises(ValueError, match="loss_agg='mean'"):
        TrainConfig(loss_agg="mean")
    with pytest.raises(ValueError, match="loss_norm_tokens=0"):
        TrainConfig(loss_agg="seq-mean-token-sum-norm")


def test_dapo_train_prints_strict_json(runs: dict) -> None:
    """Its metrics hold NaN where a step has no figure (no rollout accuracy or reward): printed as null,
    not as the bare NaN Python writes, which is not JSON (jq and other parsers refuse the document)."""
    def refuse(constant: str) -> None:
        raise AssertionError(f"not JSON: {constant}")

    printed = json.loads(runs["D_stdout"], parse_constant=refuse)
    assert printed["checkpoint"] == str(runs["root"] / "D2") and printed["accuracy"] is None


def test_optimizer_state_carries_over_through_the_checkpoint(runs: dict) -> None:
    assert runs["D_rc"] == 0
    d_dir, e = runs["root"] / "D2", runs["E"]
    info = checkpoints.read_info(d_dir)
    assert info.inputs["resumed_optimizer_state"] is True
    assert info.parent_checkpoint_id == runs["A"].checkpoint_id
    assert e.worker_metrics[1]["updates_done"] == 4
    assert _max_diff(_weights(d_dir), _weights(e.checkpoint_dir)) < ATOL
    # Without the carried state (fresh Adam moments, warm-up restarted) step 2 would differ a lot.
    assert _max_diff(_weights(d_dir), _weights(runs["A"].checkpoint_dir)) > 1e-3


def test_exported_checkpoint_reloads_with_identical_logits(runs: dict) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = runs["A"].checkpoint_dir
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor(runs["probe"])).logits
    engine_logits = torch.load(runs["root"] / "probe_A.pt")
    assert torch.equal(logits, engine_logits)
    assert len(AutoTokenizer.from_pretrained(folder)) == runs["vocab"]


def _mean_response_log_prob(folder: str | Path, batch: tb.TrainBatch, rows: torch.Tensor) -> float:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        lp = tb.token_log_probs(model(input_ids=batch.input_ids, attention_mask=batch.attention_mask.long()).logits,
                                batch.input_ids)
    mask = batch.loss_mask & rows[:, None]
    return float(lp[mask].mean())


def test_positive_advantage_samples_become_more_likely(runs: dict) -> None:
    batch = tb.collate(tb.load_rows([runs["shard1"]]), pad_token_id=0)
    positive = batch.advantages.max(dim=1).values > 0
    negative = batch.advantages.min(dim=1).values < 0
    before_pos = _mean_response_log_prob(runs["ck0"], batch, positive)
    after_pos = _mean_response_log_prob(runs["A"].checkpoint_dir, batch, positive)
    before_neg = _mean_response_log_prob(runs["ck0"], batch, negative)
    after_neg = _mean_response_log_prob(runs["A"].checkpoint_dir, batch, negative)
    assert after_pos > before_pos + 0.01
    assert after_neg < before_neg - 0.01


@pytest.mark.parametrize(
    "case, match",
    [
        ("empty", "step 3: bad training batch: step 3: empty training batch"),
        ("all_dropped", "step 3: bad training batch: step 3: empty training batch"),
        ("all_masked", "all 4 kept samples are loss_masked"),
        # NaN is refused by the ScoredRollout schema itself (as a null), inf by the batch builder.
        ("nan_advantage", r"(?s)step 3: bad training batch: .*bad.parquet.*'advantage'"),
        ("inf_advantage", r"bad.parquet: row 1 \(rollout_id 'r5-1'\): field 'advantage' is inf"),
        ("positive_log_prob", r"row 2 \(rollout_id 'r5-2'\): field 'rollout_log_probs' has non-finite or positive"),
    ],
)
def test_bad_batches_stop_before_launch_and_publish_nothing(ck0: Path, tmp_path: Path, case: str, match: str) -> None:
    vocab = json.loads((ck0 / "config.json").read_text())["vocab_size"]
    rows = random_batch(5, 4, vocab=vocab)
    if case == "empty":
        rows = []
    elif case == "all_dropped":
        for r in rows:
            r.update(kept=False, filter_reason="all_wrong")
    elif case == "all_masked":
        for r in rows:
            r.update(loss_masked=True)
    elif case == "nan_advantage":
        rows[1]["advantage"] = float("nan")
    elif case == "inf_advantage":
        rows[1]["advantage"] = float("inf")
    elif case == "positive_log_prob":
        rows[2]["rollout_log_probs"][1] = 0.5
    # Bad values are written as raw Parquet: the schema-validating writer would refuse some.
    shard = write_scored(tmp_path / "bad.parquet", rows, validate=case in ("empty", "all_dropped", "all_masked"))
    with pytest.raises(TrainStepError, match=match):
        train_step(ck0, [shard], tmp_path / "ck3", step=3, config=CONFIG)
    assert not (tmp_path / "ck3").exists() and not list(tmp_path.glob(".*staging*"))


def test_non_finite_loss_stops_the_step_and_publishes_nothing(ck0: Path, tmp_path: Path) -> None:
    """A diverged parent (a NaN weight) gives a NaN loss inside the workers: clear error, no checkpoint."""
    import shutil

    from safetensors.torch import save_file

    bad = tmp_path / "ck_nan"
    shutil.copytree(ck0, bad)
    weights = _weights(bad)
    key = next(k for k in weights if "embed_tokens" in k)
    weights[key][5, 0] = float("nan")
    save_file(weights, str(bad / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(TrainStepError, match=r"step 4: training failed: TrainStepFailure: step 4: loss is not finite"):
        vocab = json.loads((ck0 / "config.json").read_text())["vocab_size"]
        shard = write_scored(tmp_path / "batch.parquet", random_batch(1, 4, vocab=vocab))
        train_step(bad, [shard], tmp_path / "ck4", step=4, config=CONFIG)
    assert not (tmp_path / "ck4").exists() and not list(tmp_path.glob(".*staging*"))
    assert train_server.active_group() is None  # a failed warm group is not reused


# --- the warm worker group (keep_workers_warm) -----------------------------------------------------

COLD = replace(CONFIG, keep_workers_warm=False)


def _same_weights(a: str | Path, b: str | Path) -> bool:
    wa, wb = _weights(a), _weights(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def _ds_meta(folder: str | Path) -> dict:
    return json.loads((Path(folder) / DS_STATE_DIR / "dapo_ds_meta.json").read_text())


def _gone(pids: list[int]) -> bool:
    """True when none of ``pids`` runs any more (a zombie waiting to be reaped counts as gone)."""
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            return False
    return True


def _wait_gone(pids: list[int], timeout_s: float) -> bool:
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _gone(pids):
            return True
        time.sleep(0.1)
    return _gone(pids)


@pytest.fixture(scope="module")
def warm_vs_cold(runs: dict) -> dict:
    """Steps 1 and 2 through one warm group, and the same two steps with one launch each."""
    root, ck0, s1, s2 = runs["root"] / "warm_vs_cold", runs["ck0"], runs["shard1"], runs["shard2"]
    train_server.stop_active()  # the first warm step must start the group
    out: dict = {"root": root}
    out["w1"] = train_step(ck0, [s1], root / "w1", step=1, config=CONFIG)
    out["group"] = train_server.active_group()
    out["w2"] = train_step(out["w1"].checkpoint_dir, [s2], root / "w2", step=2, config=CONFIG)
    out["history"] = list(out["group"].history)
    out["c1"] = train_step(ck0, [s1], root / "c1", step=1, config=COLD)
    out["c2"] = train_step(out["c1"].checkpoint_dir, [s2], root / "c2", step=2, config=COLD)
    return out


def test_warm_steps_equal_cold_steps_bitwise(warm_vs_cold: dict) -> None:
    r = warm_vs_cold
    # Step 1 starts the group and builds the engine from ck0; step 2 continues from memory.
    assert r["history"] == ["reloaded", "continued"]
    assert (r["w1"].timings["group_started"], r["w2"].timings["group_started"]) == (1.0, 0.0)
    assert (r["w1"].timings["continued_in_memory"], r["w2"].timings["continued_in_memory"]) == (0.0, 1.0)
    assert r["c2"].timings["warm_group"] == 0.0
    for warm, cold in (("w1", "c1"), ("w2", "c2")):
        assert _same_weights(r[warm].checkpoint_dir, r[cold].checkpoint_dir), warm
        assert r[warm].checkpoint_id == r[cold].checkpoint_id  # the id digests the weight bytes
        for name in ("config.json", "generation_config.json"):  # the warm export reuses its HF model
            assert (Path(r[warm].checkpoint_dir) / name).read_bytes() == (Path(r[cold].checkpoint_dir) / name).read_bytes()
        # 2 updates per step: 2 after step 1, 4 after step 2, on both paths.
        assert _ds_meta(r[warm].checkpoint_dir)["updates_done"] == _ds_meta(r[cold].checkpoint_dir)["updates_done"]
        assert same_state(optimizer_state(r[warm].checkpoint_dir), optimizer_state(r[cold].checkpoint_dir)) == []
    assert _ds_meta(r["w2"].checkpoint_dir)["updates_done"] == 4
    assert r["w2"].metrics["grad_norm"] == r["c2"].metrics["grad_norm"]
    # The warm step 2 skipped process start and engine construction.
    assert r["w2"].timings["load_s"] < r["c2"].timings["load_s"]


# Micro-batches of 2 samples, 2 updates per step: batches of 8, 12 and 10 samples (partial batches,
# as dynamic sampling's ``on_max_rounds: train_on_partial`` gives) need 2, 3 and 3 micro-batches per
# update. A counter carried over from the previous step (8 micro-batches after step 1) would put the
# optimizer step after micro-batch 2 of 3 in step 2, and carry the third one's gradient over.
GAS_CONFIG = replace(CONFIG, micro_batch_samples=2)
GAS_BATCH_SIZES = (8, 12, 10)


def test_warm_group_reloads_a_parent_that_is_not_its_last_output(runs: dict, warm_vs_cold: dict) -> None:
    r, root = warm_vs_cold, warm_vs_cold["root"]
    group = train_server.active_group()
    assert group is r["group"] and group.last_checkpoint_id == r["w2"].checkpoint_id
    # Step 2 re-run from step 0's checkpoint (no optimizer state: a fresh optimizer, as cold).
    again = train_step(runs["ck0"], [runs["shard2"]], root / "x2", step=2, config=CONFIG)
    cold = train_step(runs["ck0"], [runs["shard2"]], root / "x2cold", step=2, config=COLD)
    assert _same_weights(again.checkpoint_dir, cold.checkpoint_dir)
    assert same_state(optimizer_state(again.checkpoint_dir), optimizer_state(cold.checkpoint_dir)) == []
    # Step 2 re-run from the warm step 1 (an older output of this group): ds_state reloaded.
    rerun = train_step(r["w1"].checkpoint_dir, [runs["shard2"]], root / "y2", step=2, config=CONFIG)
    assert _same_weights(rerun.checkpoint_dir, r["c2"].checkpoint_dir)
    assert same_state(optimizer_state(rerun.checkpoint_dir), optimizer_state(r["c2"].checkpoint_dir)) == []
    assert train_server.active_group() is group and group.history[-2:] == ["reloaded", "reloaded"]


def test_config_change_restarts_the_group_and_a_dead_group_falls_back_to_cold(runs: dict, warm_vs_cold: dict) -> None:
    import signal

    root = warm_vs_cold["root"]
    old = train_server.active_group()
    assert old is not None and old.alive
    old_pids = old.pids()
    assert len(old_pids) == 2  # torchrun + 1 rank
    other = replace(CONFIG, lr=1e-3)
    first = train_step(runs["ck0"], [runs["shard1"]], root / "lr1", step=1, config=other)
    new = train_server.active_group()
    assert new is not None and new is not old and not old.alive and _wait_gone(old_pids, 5.0)
    # Kill the new group behind the owner's back: the next step warns and runs cold, same result.
    os.killpg(new.proc.pid, signal.SIGKILL)
    new.proc.wait()
    with pytest.warns(RuntimeWarning, match=r"(?s)step 1: the warm worker group exited with -9 while idle.*cold launch"):
        again = train_step(runs["ck0"], [runs["shard1"]], root / "lr1-again", step=1, config=other)
    assert again.timings["warm_fallback"] == 1.0 and train_server.active_group() is None
    assert _same_weights(first.checkpoint_dir, again.checkpoint_dir)


def test_hung_group_is_killed_and_the_step_runs_cold(runs: dict, warm_vs_cold: dict, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import signal

    first = train_step(runs["ck0"], [runs["shard1"]], tmp_path / "h1", step=1, config=CONFIG)
    group = train_server.active_group()
    assert group is not None and group.ready
    pids = group.pids()
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)  # frozen: alive, but never answers
    monkeypatch.setattr(train_server, "ACK_TIMEOUT_S", 2.0)
    with pytest.warns(RuntimeWarning, match=r"did not take request 1 within 2 s \(hung\).*cold launch"):
        res = train_step(first.checkpoint_dir, [runs["shard2"]], tmp_path / "h2", step=2, config=CONFIG)
    assert _wait_gone(pids, 5.0) and train_server.active_group() is None
    assert _same_weights(res.checkpoint_dir, warm_vs_cold["c2"].checkpoint_dir)


def test_the_owner_is_woken_by_the_result_not_by_its_polling_timer(runs: dict, warm_vs_cold: dict, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    # The owner now looks for the result only every 2 minutes on its own: rank 0's poke of the
    # owner's FIFO (engines/train/mailbox_wake.py) must end the wait as soon as the result is written.
    monkeypatch.setattr(train_server, "_POLL_S", 120.0)
    t0 = time.monotonic()
    res = train_step(runs["ck0"], [runs["shard1"]], tmp_path / "woken", step=1, config=CONFIG)
    assert time.monotonic() - t0 < 60.0, "the result did not wake the owner"
    assert _same_weights(res.checkpoint_dir, warm_vs_cold["c1"].checkpoint_dir)


_OWNER_SCRIPT = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
from dataclasses import replace
from engines.train.launch import train_step
from settings.train import TrainConfig
from engines.train import server as train_server
config = TrainConfig(**json.loads(sys.argv[5]))
train_step(sys.argv[2], [sys.argv[3]], sys.argv[4], step=1, config=config)
print("PIDS", json.dumps(train_server.active_group().pids()), flush=True)
time.sleep(600)
"""


def test_workers_exit_when_the_owner_is_killed(runs: dict, tmp_path: Path) -> None:
    import dataclasses
    import subprocess

    repo = Path(__file__).resolve().parents[2]
    owner = subprocess.Popen(
        [sys.executable, "-c", _OWNER_SCRIPT, str(repo), str(runs["ck0"]), str(runs["shard1"]), str(tmp_path / "o1"),
         json.dumps(dataclasses.asdict(CONFIG))],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    try:
        line = owner.stdout.readline()  # blocks until the step is published (or the owner fails: EOF)
        assert line.startswith("PIDS"), owner.stderr.read()[-3000:] if owner.poll() is not None else line
        pids = json.loads(line.split(" ", 1)[1])
        assert len(pids) == 2 and not _gone(pids)
        owner.kill()  # SIGKILL: no atexit hook runs
        owner.wait()
        assert _wait_gone(pids, 5.0), "workers outlived their owner"
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
    assert checkpoints.is_complete(tmp_path / "o1")


def test_a_group_started_ahead_serves_the_first_step_as_a_cold_launch_would(runs: dict, warm_vs_cold: dict) -> None:
    """start_workers (the local driver calls it when a run begins) starts the group without a parent;
    the first step then finds it up, builds its engine from its parent and gives the cold weights."""
    r = warm_vs_cold
    train_server.stop_active()
    start_workers(CONFIG)
    group = train_server.active_group()
    assert group is not None and group.alive and group.history == []
    start_workers(CONFIG)  # already up: the same group
    assert train_server.active_group() is group
    step1 = train_step(runs["ck0"], [runs["shard1"]], r["root"] / "ahead1", step=1, config=CONFIG)
    assert train_server.active_group() is group and group.history == ["reloaded"]
    assert step1.timings["group_started"] == 0.0 and step1.timings["warm_group"] == 1.0
    assert _same_weights(step1.checkpoint_dir, r["c1"].checkpoint_dir)
    assert same_state(optimizer_state(step1.checkpoint_dir), optimizer_state(r["c1"].checkpoint_dir)) == []
    start_workers(COLD)  # workers not kept warm: nothing starts, the group stays
    assert train_server.active_group() is group


def test_launches_leave_nothing_in_the_temp_folder(runs: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cold launch, and a warm group once stopped, leave no folder in the system temp folder: torchrun
    made a ``torchelastic_*`` log folder there for every launch and never removed it (hundreds after a
    day of runs and tests)."""
    temp = tmp_path / "system-temp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))  # the workers' (torchrun's) temp folder
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # this process's (the launch's work folder)
    train_server.stop_active()  # the warm group below starts with this TMPDIR
    train_step(runs["ck0"], [runs["shard1"]], tmp_path / "cold1", step=1, config=COLD)
    assert sorted(p.name for p in temp.iterdir()) == []
    train_step(runs["ck0"], [runs["shard1"]], tmp_path / "warm1", step=1, config=CONFIG)
    assert train_server.active_group() is not None
    train_server.stop_active()
    assert sorted(p.name for p in temp.iterdir()) == []


def test_zero3_ranks_never_hold_the_whole_model(ck0: Path, tmp_path: Path) -> None:
    """Under ZeRO-3 the policy reaches DeepSpeed already partitioned: built inside zero.Init, each rank
    holds its share of the weights from the start. Each rank used to load the parent whole in fp32
    and hand it to DeepSpeed to partition: 8 ranks x 131 GB of host memory at once on a node of the
    paper config, whose train pods request 900 GiB (infra/environments.py)."""
    import subprocess

    config = replace(CONFIG, num_processes=2, micro_batch_samples=2, zero_stage=3)
    spec = _worker_spec(ck0, [], tmp_path / "staging", tmp_path, config=config, resume=False)
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    probe = Path(__file__).parent / "zero3_build_probe.py"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           f"--log-dir={tmp_path / 'torchelastic'}", str(probe), str(tmp_path / "spec.json"), str(tmp_path)]
    proc = subprocess.run(cmd, env=_worker_env(2), cwd=Path(__file__).parents[2], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    full = ranks[0]["full_elements"]
    assert full == sum(p.numel() for p in _weights(ck0).values())  # tied embeddings: once, as in the file
    for seen in ranks:
        assert seen["partitioned"], seen
        assert seen["local_elements"] == 0  # partitioned parameters hold no full tensor
        assert seen["trained_elements"] == full


@pytest.mark.slow
@pytest.mark.parametrize("zero_stage,chunked", [(2, False), (3, False), (3, True)])
def test_zero_stages_2_and_3_give_the_same_update(runs: dict, tmp_path: Path, zero_stage: int, chunked: bool) -> None:
    # chunked: under ZeRO-3 the output head's weight exists whole only inside lm_head's forward,
    # which the chunked log-probs call outside the model's own forward (and again in backward).
    extra = {"logprob_chunk_tokens": 4, "activation_checkpointing": True} if chunked else {}
    res = train_step(runs["ck0"], [runs["shard1"]], tmp_path / "ck", step=1,
                     config=replace(CONFIG, num_processes=2, zero_stage=zero_stage, micro_batch_samples=1, **extra))
    assert _max_diff(_weights(runs["A"].checkpoint_dir), _weights(res.checkpoint_dir)) < ATOL


@pytest.mark.slow
@pytest.mark.parametrize("zero_stage,processes", [(1, 1), (3, 2)])  # (3, 2): the paper config's bf16 + ZeRO-3
def test_bf16_step_exports_a_loadable_bf16_checkpoint(runs: dict, tmp_path: Path, zero_stage: int, processes: int) -> None:
    from transformers import AutoModelForCausalLM

    config = replace(CONFIG, precision="bf16", zero_stage=zero_stage, num_processes=processes,
                     micro_batch_samples=4 // processes)
    res = train_step(runs["ck0"], [runs["shard1"]], tmp_path / "ck", step=1, config=config)
    assert all(v.dtype == torch.bfloat16 for v in _weights(res.checkpoint_dir).values())
    AutoModelForCausalLM.from_pretrained(res.checkpoint_dir)
    # bf16 rounding only: the step moves the weights like the fp32 step A. The update is ~2e-3 per
    # weight, so the error is measured against it (a zeroed update gives cosine 0 and relative error
    # 1, a sign-flipped one cosine -1; bf16 gives ~0.997 and ~0.08 on this model).
    w0 = _weights(runs["ck0"])
    delta_fp32 = torch.cat([(w.float() - w0[k]).flatten() for k, w in _weights(runs["A"].checkpoint_dir).items()])
    delta_bf16 = torch.cat([(w.float() - w0[k]).flatten() for k, w in _weights(res.checkpoint_dir).items()])
    assert float(torch.nn.functional.cosine_similarity(delta_bf16, delta_fp32, dim=0)) > 0.95
    assert float((delta_bf16 - delta_fp32).norm()) < 0.25 * float(delta_fp32.norm())


_VLLM_SCRIPT = """
import json, os, sys
os.environ.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_OMP_THREADS_BIND="nobind", VLLM_CPU_KVCACHE_SPACE="1")
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
llm = LLM(model=sys.argv[1], dtype="float32", max_model_len=64, enforce_eager=True)
ids = json.loads(sys.argv[2])
out = llm.generate([TokensPrompt(prompt_token_ids=ids)], SamplingParams(max_tokens=1, prompt_logprobs=0))
print("PROMPT_LOGPROBS", json.dumps([None if d is None else d[t].logprob for d, t in zip(out[0].prompt_logprobs, ids)]))
"""


@pytest.mark.slow
def test_exported_checkpoint_loads_in_vllm_with_the_same_log_probs(tmp_path: Path) -> None:
    """vLLM (CPU build) serves the exported folder and scores tokens like transformers (fp32)."""
    import subprocess

    from transformers import AutoModelForCausalLM

    pytest.importorskip("vllm")
    # The tiny default size (head dim 64): vLLM's CPU attention does not take the test model's 16.
    ck = build_random_checkpoint(tmp_path / "ck0", seed=0)
    vocab = json.loads((ck / "config.json").read_text())["vocab_size"]
    shard = write_scored(tmp_path / "b.parquet", random_batch(1, 4, vocab=vocab))
    res = train_step(ck, [shard], tmp_path / "ck1", step=1, config=replace(CONFIG, updates_per_step=1))
    ids = [5, 6, 7, 8, 9, 10, 11, 12]
    proc = subprocess.run([sys.executable, "-c", _VLLM_SCRIPT, res.checkpoint_dir, json.dumps(ids)],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    line = next((l for l in proc.stdout.splitlines() if l.startswith("PROMPT_LOGPROBS")), None)
    assert line is not None, proc.stderr[-3000:]
    vllm_lp = json.loads(line.split(" ", 1)[1])[1:]  # position 0 has no log-prob
    model = AutoModelForCausalLM.from_pretrained(res.checkpoint_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        hf_lp = tb.token_log_probs(model(input_ids=torch.tensor([ids])).logits, torch.tensor([ids]))[0, 1:]
    assert torch.allclose(torch.tensor(vllm_lp), hf_lp, atol=1e-3)


# Runs last: a step under another config (GAS_CONFIG) replaces the module's warm group, which
# the tests above share through the warm_vs_cold fixture.
@pytest.mark.slow
def test_warm_steps_equal_cold_steps_bitwise_when_the_batch_size_changes(ck0: Path, tmp_path: Path) -> None:
    """With gradient accumulation > 1, a warm engine steps the optimizer on the same micro-batch as a
    freshly built one, whatever the previous step's batch size.

    Steps 2 and 3 continue in memory; each is re-run cold (a new engine) from the same parent, the
    warm step before it (step 1 builds its engine like a cold launch: see the test above).
    """
    vocab = json.loads((ck0 / "config.json").read_text())["vocab_size"]
    shards = [write_scored(tmp_path / f"batch{i}.parquet", random_batch(20 + i, n, vocab=vocab, max_response=6))
              for i, n in enumerate(GAS_BATCH_SIZES, start=1)]
    warm: list = []
    train_server.stop_active()  # the first warm step must start the group
    try:
        for step, shard in enumerate(shards, start=1):
            parent = warm[-1].checkpoint_dir if warm else ck0
            warm.append(train_step(parent, [shard], tmp_path / f"w{step}", step=step, config=GAS_CONFIG))
        group = train_server.active_group()
        history = list(group.history) if group is not None else []
    finally:
        train_server.stop_active()
    assert history == ["reloaded", "continued", "continued"]
    assert [r.worker_metrics[0]["accumulation_steps"] for r in warm] == [2, 3, 3]
    for step in (2, 3):
        w = warm[step - 1]
        c = train_step(warm[step - 2].checkpoint_dir, [shards[step - 1]], tmp_path / f"c{step}", step=step,
                       config=replace(GAS_CONFIG, keep_workers_warm=False))
        wm, cm = w.worker_metrics[0], c.worker_metrics[0]
        assert wm["updates_done"] == cm["updates_done"] == 2 * step
        assert _same_weights(w.checkpoint_dir, c.checkpoint_dir), step
        assert same_state(optimizer_state(w.checkpoint_dir), optimizer_state(c.checkpoint_dir)) == [], step
        assert wm["grad_norms"] == cm["grad_norms"], step


# Also after the tests that share the module's warm group (it replaces it).
@pytest.mark.slow
def test_a_bf16_zero3_step_resumed_from_disk_equals_the_one_continued_in_memory(runs: dict, tmp_path: Path) -> None:
    """The paper config's precision and ZeRO stage on 2 ranks: step 2 continued by the warm group
    from memory, and the same step launched cold, whose engine is built from the parent's config and
    takes every weight from the parent's DeepSpeed state (the parent's HF weights are not read:
    engines/train/engine.load_policy), publish the same weights."""
    config = replace(CONFIG, precision="bf16", zero_stage=3, num_processes=2, micro_batch_samples=2)
    train_server.stop_active()
    try:
        w1 = train_step(runs["ck0"], [runs["shard1"]], tmp_path / "w1", step=1, config=config)
        w2 = train_step(w1.checkpoint_dir, [runs["shard2"]], tmp_path / "w2", step=2, config=config)
    finally:
        train_server.stop_active()
    cold_parent = tmp_path / "cold-parent"  # the parent without its HF weights: the cold step must not need them
    shutil.copytree(w1.checkpoint_dir, cold_parent, ignore=shutil.ignore_patterns("*.safetensors"))
    c2 = train_step(cold_parent, [runs["shard2"]], tmp_path / "c2", step=2,
                    config=replace(config, keep_workers_warm=False))
    assert w2.timings["continued_in_memory"] == 1.0 and c2.timings["warm_group"] == 0.0
    assert _same_weights(w2.checkpoint_dir, c2.checkpoint_dir)
    assert w2.checkpoint_id == c2.checkpoint_id
