"""infra/handoff.py: bytes and seconds of the checkpoint hand-off per step, checked by hand.

Five paths (issue 50): a) in-process warm on one machine, b) persistent engine actors with fresh
train pods, c) open-source Flyte without a persistent cluster (a fresh RayJob per rollout/evaluate
call), d) persistent engines and persistent train ranks (the train host) publishing every checkpoint
whole before the step returns, the engines taking the weights from the host's memory, e) the designed
in-memory hand-off (a broadcast from the ranks, the publish in the background). Which orderings hold for every plan and which only under a stated condition: see the
property tests at the end.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infra import handoff, sizing
from infra.sizing import GB, QWEN2_5_32B

W, O = 65_527_752_704, 393_166_516_224  # Qwen2.5-32B: bf16 export, fp32 master + Adam m, v


def paper_plan() -> sizing.ClusterPlan:
    # configs/qwen2.5-32b-dapo.yaml as `dapo deploy --dry-run` sizes it: 4 engines x TP 4 on 2
    # nodes, ZeRO-3 on 16 GPUs = 2 nodes
    return sizing.plan_cluster(QWEN2_5_32B, zero_stage=3, micro_batch_samples=1, max_prompt_tokens=1024,
                               max_response_tokens=20480, samples_per_prompt=16, logprob_chunk_tokens=4096)


def paper_cost(**kw: object) -> handoff.StepHandoff:
    # the paper config evaluates every 5 steps (run.eval_every_steps: 5)
    args = dict(prompts_per_step=512, prompts_per_round=1536, samples_per_prompt=16, precision="bf16",
                evaluate_every_steps=5)
    args.update(kw)
    return handoff.step_handoff(paper_plan(), **args)  # type: ignore[arg-type]


# The default assumptions, by hand: store 1.25 GB/s a node, 20 GB/s in all; local disk 5 GB/s;
# vLLM init 145 s (compiled); weights into the GPUs at 0.875 GB/s a GPU; a RayJob's pods 60 s; a train group 60 s
UPLOAD = (W + O / 2) / 1.25e9  # rank 0's node: the export + half the state, 209.7 s
FETCH = W / 1.25e9  # a node fetches the weights, 52.4 s (the store: 3 x 65.5 / 20 = 9.8 s)
TRAIN_FETCH = O / 2 / 1.25e9  # a train node fetches half the state, 157.3 s
LOAD = W / 4 / 0.875e9  # an engine's 4 GPUs load a quarter of the weights each, 18.7 s
BROADCAST = W / 12.5e9  # the weights over one 100 Gb/s link (a pipelined broadcast: each link carries them once), 5.2 s
HOST_PUT = W / 5e9  # the train host reads the export back from its disk (5 GB/s) into its object store, 13.1 s
HOST_PULL = 2 * W / 12.5e9  # 2 engine nodes pull it from the train host's node over its 100 Gb/s link, 10.5 s
CALLS = 1 + 1 / 5  # one rollout round a step, an evaluation every 5 steps
STEP = 4096.0 + 1066.1  # generation + training


def test_checkpoint_bytes_by_precision() -> None:
    params = 32_763_876_352
    # bf16: HF export 2 B/param; ds_state 12 B/param (fp32 master + Adam m, v), partitioned over ranks
    assert handoff.checkpoint_bytes(params, "bf16") == (W, O)
    # fp32: the export is fp32 (4 B/param); the fp32 weights are the master copy: still 12 B/param of state
    assert handoff.checkpoint_bytes(params, "fp32") == (131_055_505_408, O)
    with pytest.raises(ValueError, match="precision"):
        handoff.checkpoint_bytes(params, "fp8")


def test_transfer_time_is_bound_by_the_busiest_node_or_the_store() -> None:
    bw = handoff.Bandwidth(per_node_bytes_per_s=1 * GB, aggregate_bytes_per_s=10 * GB, interconnect_bytes_per_s=10 * GB)
    # 40 GB over 4 nodes of 10 GB each: nodes at 1 GB/s -> 10 s; the store at 10 GB/s -> 4 s
    assert handoff.transfer_seconds(40 * GB, 10 * GB, bw) == 10.0
    # 400 GB over 40 nodes of 10 GB: the store's 40 s dominates the nodes' 10 s
    assert handoff.transfer_seconds(400 * GB, 10 * GB, bw) == 40.0


def test_modelled_step_time_of_the_paper_config() -> None:
    cost = paper_cost()
    t = handoff.Throughput()
    # generation: 1 round x 1536 prompts x 16 samples x 2000 tokens = 49,152,000 tokens over
    # 16 rollout GPUs x 750 tok/s = 12,000 tok/s -> 4,096 s
    assert cost.generation_s == pytest.approx(49_152_000 / 12_000)
    # training: 512 x 16 samples x (200 + 2000) tokens = 18,022,400 tokens x 32.76e9 params x
    # 10 FLOPs (2 old log-probs + 6 forward/backward + 2 recompute) = 5.905e18 FLOPs over 16 GPUs
    # x 989e12 x 0.35 = 5.538e15 FLOP/s -> 1,066 s
    flops = 18_022_400 * 32_763_876_352 * 10
    assert cost.training_s == pytest.approx(flops / (16 * t.train_flops_per_s_per_gpu))
    assert round(cost.training_s) == 1066 and round(cost.step_s) == 4096 + 1066


def test_engine_start_assumptions_by_hand() -> None:
    start = handoff.EngineStart()
    # 16.4 GB a GPU (65.5 GB over tensor parallel 4) at 0.875 GB/s a GPU -> 18.7 s; a start adds vLLM's init
    assert start.load_s(W, 4) == pytest.approx(LOAD) and round(LOAD, 1) == 18.7
    assert start.start_s(W, 4) == pytest.approx(145.0 + LOAD)
    with pytest.raises(ValueError, match="tensor_parallel"):
        start.load_s(W, 0)
    cost = paper_cost()
    assert cost.calls_per_step == pytest.approx(1.2)
    assert paper_cost(evaluate_every_steps=0).calls_per_step == 1.0


def test_a_in_process_warm_by_hand() -> None:
    a = paper_cost().in_process
    # the warm group writes the whole checkpoint to local disk (fsync) before the step returns:
    # 458.7 GB at 5 GB/s = 91.7 s; the engines reload the weights from it: 18.7 s
    assert a.critical_path_s == pytest.approx((W + O) / 5e9 + LOAD)
    assert a.share == pytest.approx(110.46 / (STEP + 110.46), rel=1e-3)
    assert (a.written_bytes, a.read_bytes) == (W + O, W)


def test_b_persistent_engines_fresh_train_pods_by_hand() -> None:
    b = paper_cost().persistent_engines
    # train uploads the checkpoint whole; 2 engine nodes fetch the weights once a step (a task body
    # reads config and tokenizer alone) and the 4 warm engines reload them; 2 fresh train pods start
    # the group and fetch half the optimizer state each
    expected = UPLOAD + FETCH + LOAD + TRAIN_FETCH + 60.0
    assert b.critical_path_s == pytest.approx(expected)
    assert round(expected) == 498
    assert b.share == pytest.approx(expected / (STEP + expected), rel=1e-4)
    assert b.written_bytes == W + O
    assert b.read_bytes == 2 * W + O
    assert all(p.implemented for p in b.parts)


def test_c_a_fresh_rayjob_every_call_by_hand() -> None:
    cost = paper_cost()
    c = cost.fresh_rayjobs
    # every one of the 1.2 calls a step: the RayJob's pods start (60 s), its nodes fetch the
    # weights into empty mirrors (52.4 s), every engine starts (145 s init + 18.7 s load)
    per_call = 60.0 + FETCH + 145.0 + LOAD
    expected = UPLOAD + CALLS * per_call + TRAIN_FETCH + 60.0
    assert c.critical_path_s == pytest.approx(expected)
    assert round(expected) == 758
    assert c.read_bytes == int(CALLS * 3 * W + O)
    # what c pays beyond b: the RayJob's and the engines' starts of every call, and the further
    # calls' fetches and loads (b's engines fetch and load each checkpoint once)
    extra = CALLS * (60.0 + 145.0) + (CALLS - 1) * (FETCH + LOAD)
    assert c.critical_path_s - cost.persistent_engines.critical_path_s == pytest.approx(extra)


def test_d_persistent_engines_and_train_ranks_by_hand() -> None:
    cost = paper_cost()
    d = cost.persistent_ranks
    # No group start (60 s) and no fetch of the parent's optimizer state (157.3 s: the warm ranks hold it,
    # and the parent is in their node's mirror, published from there). The weights reach the engines in
    # memory: the host reads the export back into its object store (13.1 s), the 2 engine nodes pull it over
    # the interconnect (10.5 s), the engines load it (18.7 s); nothing is read from the store. What stays:
    # the warm group publishes the whole checkpoint every step before the step returns (209.7 s)
    expected = UPLOAD + HOST_PUT + HOST_PULL + LOAD
    assert d.critical_path_s == pytest.approx(expected)
    assert round(expected, 1) == 252.0
    assert d.share == pytest.approx(expected / (STEP + expected), rel=1e-4)
    assert round(100 * d.share, 1) == 4.7 and d.share > handoff.SHARE_GOAL  # the path as built: not at 3%
    assert (d.written_bytes, d.read_bytes) == (W + O, 0)
    assert all(p.implemented for p in d.parts)
    # the store bandwidth at which it would be: 3% allows 159.7 s, the in-memory parts' 42.3 s are fixed,
    # so the upload's 209.7 s must fit in 117.4 s: 1.79x the assumed store
    need = handoff.store_bandwidth_for_share(d, cost.step_s, handoff.Bandwidth(), 0.03)
    assert need is not None
    factor = UPLOAD / (0.03 * cost.step_s / 0.97 - HOST_PUT - HOST_PULL - LOAD)
    assert need.per_node_bytes_per_s / (1.25 * GB) == pytest.approx(factor) and round(factor, 2) == 1.79
    assert paper_cost(bandwidth=need).persistent_ranks.share == pytest.approx(0.03)


def test_d_with_the_optimizer_state_every_10_steps_by_hand() -> None:
    cost = paper_cost()
    d, d10 = cost.persistent_ranks, cost.persistent_ranks_state_every_k
    assert d10 is not None and cost.optimizer_upload_every_steps == 10
    # d, but the warm group publishes the export alone (52.4 s through rank 0's node) on 9 steps in 10 and the
    # whole checkpoint (209.7 s) on the tenth: 68.1 s a step instead of 209.7 s
    upload = FETCH + (UPLOAD - FETCH) / 10
    expected = upload + HOST_PUT + HOST_PULL + LOAD
    assert d10.critical_path_s == pytest.approx(expected)
    assert round(expected, 1) == 110.5
    assert round(100 * d10.share, 1) == 2.1 and d10.share <= handoff.SHARE_GOAL  # the path as built: at 3%
    assert (d10.written_bytes, d10.read_bytes) == (W + O // 10, d.read_bytes)
    assert all(p.implemented for p in d10.parts)
    # k = 1 is d itself
    assert paper_cost(optimizer_upload_every_steps=1).persistent_ranks_state_every_k == d


@given(k=st.integers(1, 50))
@settings(max_examples=30, deadline=None)
def test_d_with_the_state_every_k_steps_is_never_dearer_and_falls_with_k(k: int) -> None:
    d_k = paper_cost(optimizer_upload_every_steps=k).persistent_ranks_state_every_k
    d_next = paper_cost(optimizer_upload_every_steps=k + 1).persistent_ranks_state_every_k
    assert d_k is not None and d_next is not None
    assert d_next.critical_path_s < d_k.critical_path_s <= paper_cost().persistent_ranks.critical_path_s + 1e-9


def test_e_designed_in_memory_by_hand() -> None:
    cost = paper_cost()
    e = cost.designed
    # rank 0's node broadcasts the weights to the engine nodes in memory (5.2 s over 100 Gb/s) and the
    # engines load them (18.7 s); the export (each train node half: 26.2 s) and, every 10 steps, the
    # optimizer state (157.3 s) go to the store in the background, 183.5 s hidden by 4,096 s of rollout
    assert e.critical_path_s == pytest.approx(BROADCAST + LOAD)
    assert round(100 * e.share, 2) == 0.46
    assert e.written_bytes == W + O // 10
    assert e.read_bytes == 0  # nothing of the hand-off is read back from the store
    assert not any(p.implemented for p in e.parts)  # modelled only


def test_paper_shares_order_e_a_d_b_c_at_the_default_assumptions() -> None:
    cost = paper_cost()
    a, b, c, d, e = (p.share for p in cost.paths)
    # 0.5% < 2.1% < 4.7% < 8.8% < 12.8%: at 5 GB/s of local disk, path a's synchronous write of the whole
    # checkpoint costs less than d's upload of it through one node's 1.25 GB/s (a <= d is not guaranteed)
    assert e < a < d < b < c
    assert [round(100 * s, 1) for s in (e, a, d, b, c)] == [0.5, 2.1, 4.7, 8.8, 12.8]


def test_the_store_bandwidth_at_which_b_meets_three_percent() -> None:
    cost = paper_cost()
    b = cost.persistent_engines
    need = handoff.store_bandwidth_for_share(b, cost.step_s, handoff.Bandwidth(), 0.03)
    assert need is not None
    # by hand: 3% of a step allows 0.03 x 5,162.1 / 0.97 = 159.7 s; b's fixed parts (reload 18.7 s,
    # train start 60 s) are 78.7 s whatever the store, leaving 81.0 s for its store transfers (419.4 s
    # at the assumed store): the store must be 419.4 / 81.0 = 5.2x as fast
    allowed = 0.03 * cost.step_s / 0.97
    store = UPLOAD + FETCH + TRAIN_FETCH
    factor = store / (allowed - LOAD - 60.0)
    assert factor == pytest.approx(5.18, abs=0.01)
    assert need.per_node_bytes_per_s == pytest.approx(1.25 * GB * factor)
    assert need.aggregate_bytes_per_s == pytest.approx(20 * GB * factor)
    assert need.interconnect_bytes_per_s == handoff.Bandwidth().interconnect_bytes_per_s
    # and the model itself, run at that bandwidth, lands on 3%
    assert paper_cost(bandwidth=need).persistent_engines.share == pytest.approx(0.03)
    with pytest.raises(ValueError, match="share"):
        handoff.store_bandwidth_for_share(b, cost.step_s, handoff.Bandwidth(), 1.0)


def test_no_store_bandwidth_brings_c_to_three_percent() -> None:
    cost = paper_cost()
    # c's starts take 1.2 x (60 + 145 + 18.7) + 60 = 328.4 s whatever the store: more than the
    # 159.7 s that 3% of a step allows
    assert handoff.store_bandwidth_for_share(cost.fresh_rayjobs, cost.step_s, handoff.Bandwidth(), 0.03) is None
    text = handoff.format_handoff(cost)
    assert "no store bandwidth reaches 3%: its starts and loads alone take 328 s" in text


def test_pipelined_on_b_by_hand() -> None:
    cost = paper_cost()
    pipelined = cost.pipelined
    b = cost.persistent_engines
    # The same transfers as b (run.pipelined changes only what overlaps)
    assert (pipelined.written_bytes, pipelined.read_bytes) == (b.written_bytes, b.read_bytes)
    # train lane: fetch 157.3 s + start 60 s + train 1,066 s + upload 209.7 s = 1,493 s; rollout
    # lane: fetch 52.4 s + reload 18.7 s + generation 4,096 s = 4,167.2 s. A pipelined step lasts
    # max(4,096, 1,066) = 4,096 s without the hand-off: the rollout lane's 71.1 s wait, shared by its
    # parts in proportion to their seconds
    assert TRAIN_FETCH + 60.0 + cost.training_s + UPLOAD < cost.generation_s
    assert cost.pipelined_step_s == pytest.approx(cost.generation_s)
    rollout_lane = FETCH + LOAD
    assert pipelined.critical_path_s == pytest.approx(rollout_lane)
    assert pipelined.share == pytest.approx(rollout_lane / (cost.generation_s + rollout_lane))
    assert pipelined.share <= handoff.SHARE_GOAL < b.share
    train_parts = [p for p in pipelined.parts if p.what.startswith("train")]
    assert train_parts and all(p.critical_s == 0.0 for p in train_parts)


def test_a_train_lane_longer_than_the_rollout_lane_puts_the_train_transfers_on_the_critical_path() -> None:
    slow = handoff.Bandwidth(per_node_bytes_per_s=0.1 * GB, aggregate_bytes_per_s=20 * GB, interconnect_bytes_per_s=1 * GB)
    cost = paper_cost(bandwidth=slow)
    upload, fetch = (W + O / 2) / 0.1e9, O / 2 / 0.1e9  # 2,621 s and 1,966 s through rank 0's node
    train_lane = fetch + 60.0 + cost.training_s + upload  # 5,713 s
    rollout_lane = 1.2 * W / 0.1e9 + LOAD + cost.generation_s  # 786 + 18.7 + 4,096 = 4,901 s
    assert train_lane > rollout_lane
    excess = train_lane - cost.generation_s
    assert cost.pipelined.critical_path_s == pytest.approx(excess)
    by_what = {p.what: p for p in cost.pipelined.parts}
    assert all(p.critical_s == 0.0 for p in cost.pipelined.parts if not p.what.startswith("train"))
    train = [p for p in by_what.values() if p.what.startswith("train")]
    # shared by their seconds: each train part carries excess x its seconds / the lane's transfer seconds
    for p in train:
        assert p.critical_s == pytest.approx(excess * p.seconds / (fetch + 60.0 + upload))


def test_a_background_upload_longer_than_the_rollout_spills_onto_the_critical_path() -> None:
    slow = handoff.Bandwidth(per_node_bytes_per_s=0.01 * GB, aggregate_bytes_per_s=20 * GB, interconnect_bytes_per_s=1 * GB)
    cost = paper_cost(bandwidth=slow)
    export = next(p for p in cost.designed.parts if "export" in p.what)
    state_upload = next(p for p in cost.designed.parts if "optimizer" in p.what)
    # the export, half from each train node at 10 MB/s: 3,276.4 s, hidden by 4,096 s of rollout every step;
    # every 10th step the optimizer state follows it (393.2 GB / 2 nodes: 19,658 s), and what the two
    # take beyond the rollout waits, once every 10 steps
    assert export.seconds == pytest.approx(W / 2 / 0.01e9) and export.critical_s == 0.0
    assert state_upload.seconds == pytest.approx(O / 2 / 0.01e9)
    assert state_upload.critical_s == pytest.approx((export.seconds + state_upload.seconds - cost.generation_s) / 10)


def test_mirror_disk_per_node_by_hand() -> None:
    cost = paper_cost()
    # an engine node keeps the weights of its last 3 checkpoints; rank 0's train node holds half the
    # parent's state (2 train nodes; not its weights), and the step's output: weights and half the state
    assert cost.mirror_rollout_node_bytes == 3 * W
    assert cost.mirror_train_node_bytes == O // 2 + (W + O // 2)
    assert "rollout 196.6 GB" in handoff.format_handoff(cost) and "train 458.7 GB" in handoff.format_handoff(cost)


def test_handoff_table_is_computed_and_prints_its_assumptions() -> None:
    text = handoff.format_handoff(paper_cost())
    for row in ("a) in-process warm, one machine", "b) persistent engine actors", "c) open-source Flyte",
                "d) persistent engines and train ranks", "e) designed (modelled)", "pipelined on b (run.pipelined: true)"):
        assert row in text, row
    assert "vLLM init 145 s" in text and "0.875 GB/s per GPU" in text and "a fresh RayJob's pods 60 s" in text
    assert "1.2 rollout/evaluate call(s) a step" in text and "local disk 5 GB/s" in text
    assert "node to node 12.5 GB/s" in text  # the in-memory broadcast's (path e)


def test_run_storage_with_and_without_retention_by_hand() -> None:
    w, o = 10, 100
    # 5 steps, keep all: step 0 weights only (imported, no optimizer) + 5 x 110 = 560
    assert handoff.run_storage_bytes(5, w, o, keep_optimizer_last=0, keep_weights_every=0) == 560
    # K=1, M=2: step 0 weights 10, step 5 whole 110, weights of 2 and 4: 20 -> 140
    assert handoff.run_storage_bytes(5, w, o, keep_optimizer_last=1, keep_weights_every=2) == 140


def test_run_storage_counts_optimizer_state_only_on_steps_that_write_it() -> None:
    w, o = 10, 100
    # 7 steps, E=5, keep all: weights of steps 0..7 (80) + optimizer state of step 5 only (100) = 180
    assert handoff.run_storage_bytes(7, w, o, keep_optimizer_last=0, keep_weights_every=0,
                                     optimizer_state_every=5) == 180
    # K=1, M=0: every step's weights (80); step 7 (latest) and step 5 (replay origin) whole, but only 5 wrote state
    assert handoff.run_storage_bytes(7, w, o, keep_optimizer_last=1, keep_weights_every=0,
                                     optimizer_state_every=5) == 180


def test_deploy_prints_the_handoff_and_the_storage_of_the_paper_config() -> None:
    from cli.deploy import describe_handoff
    from workflows.config import load_config

    cfg = load_config(Path(__file__).resolve().parents[2] / "configs" / "qwen2.5-32b-dapo.yaml")
    text = describe_handoff(cfg, paper_plan())
    assert handoff.format_handoff(paper_cost()) in text  # the config's evaluate_every_steps reaches the model
    assert f"{cfg.run.steps} steps keep" in text and "TB keeping all" in text
    # The paper plan's 2 train nodes: row d is the train host group of a member per node, as built.
    assert "this config: run.pipelined: false (synchronous): row d with a persistent Ray cluster " \
           "(--engines-ray-address: the train task a client of the train host), row c without" in text
    assert "the train host as built is a group of one member per node" in text
    group = describe_handoff(cfg, paper_plan(), train_on_host=True)
    assert "row d: the train task is a client of the train host (a group of 2 members, one per train node)" in group
    pipelined = describe_handoff(dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, pipelined=True)), paper_plan())
    assert "this config: run.pipelined: true, so the pipelined row is what it does" in pipelined
    one_node = describe_handoff(cfg, dataclasses.replace(paper_plan(), train_nodes=1))
    assert "row d with a persistent Ray cluster (--engines-ray-address: the train task a client of the train host)" \
        in one_node
    on_host = describe_handoff(cfg, dataclasses.replace(paper_plan(), train_nodes=1), train_on_host=True)
    assert "this config: row d: the train task is a client of the train host" in on_host


def test_cluster_doc_holds_the_computed_retention_table_and_handoff() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "CLUSTER.md").read_text()
    w, o = handoff.checkpoint_bytes(sizing.parameter_count(QWEN2_5_32B), "bf16")
    assert handoff.retention_table_markdown(w, o) in doc, "docs/CLUSTER.md: regenerate the retention table"
    assert handoff.format_handoff(paper_cost()) in doc, "docs/CLUSTER.md: regenerate the hand-off lines"


def test_step_handoff_refuses_impossible_inputs() -> None:
    with pytest.raises(ValueError, match="optimizer_upload_every_steps"):
        paper_cost(optimizer_upload_every_steps=0)
    with pytest.raises(ValueError, match="evaluate_every_steps"):
        paper_cost(evaluate_every_steps=-1)
    with pytest.raises(ValueError, match="generation_rounds"):
        paper_cost(throughput=handoff.Throughput(generation_rounds=0.5))


# ----------------------------------------------------------------------------- orderings over drawn plans

_RATE = st.floats(min_value=0.01, max_value=100.0, allow_subnormal=False)  # GB/s
_SECONDS = st.floats(min_value=0.0, max_value=1000.0, allow_subnormal=False)  # torch flushes denormals


@st.composite
def _cases(draw: st.DrawFn) -> tuple[sizing.ClusterPlan, handoff.Bandwidth, handoff.Throughput, handoff.EngineStart, dict]:
    """A plan of any size and shape, any bandwidths, throughputs and start costs, any K, rounds and
    evaluation period: the model's inputs, drawn independently."""
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    engines = draw(st.integers(1, 64))
    train_gpus = draw(st.integers(1, 512))
    plan = dataclasses.replace(
        paper_plan(), params=draw(st.integers(10**6, 10**12)), rollout_tensor_parallel=tp, rollout_engines=engines,
        rollout_gpus=engines * tp, rollout_nodes=draw(st.integers(1, 64)), train_gpus=train_gpus,
        train_nodes=draw(st.integers(1, 64)),
    )
    bandwidth = handoff.Bandwidth(per_node_bytes_per_s=draw(_RATE) * GB, aggregate_bytes_per_s=draw(_RATE) * GB,
                                  interconnect_bytes_per_s=draw(_RATE) * GB, local_disk_bytes_per_s=draw(_RATE) * GB)
    throughput = handoff.Throughput(generated_tokens_per_s_per_gpu=draw(st.floats(1.0, 1e5, allow_subnormal=False)),
                                    train_flops_per_s_per_gpu=draw(st.floats(1e12, 1e16, allow_subnormal=False)),
                                    mean_response_tokens=draw(st.integers(1, 30000)),
                                    generation_rounds=draw(st.floats(1.0, 10.0, allow_subnormal=False)))
    start = handoff.EngineStart(engine_init_s=draw(_SECONDS),
                                load_bytes_per_s_per_gpu=draw(_RATE) * GB,
                                ray_cluster_start_s=draw(_SECONDS),
                                train_group_start_s=draw(_SECONDS))
    args = dict(prompts_per_step=draw(st.integers(1, 4096)), prompts_per_round=draw(st.integers(1, 8192)),
                samples_per_prompt=draw(st.integers(1, 64)), precision=draw(st.sampled_from(["bf16", "fp32"])),
                optimizer_upload_every_steps=draw(st.integers(1, 100)), evaluate_every_steps=draw(st.integers(0, 50)))
    return plan, bandwidth, throughput, start, args


def _paths(case: tuple) -> handoff.StepHandoff:
    plan, bandwidth, throughput, start, args = case
    return handoff.step_handoff(plan, bandwidth=bandwidth, throughput=throughput, engine_start=start, **args)


def _at_most(x: float, y: float) -> bool:
    return x <= y * (1 + 1e-12) + 1e-9  # sums of the same terms in another order


@settings(max_examples=300, deadline=None)
@given(_cases())
def test_b_at_most_c_for_every_plan_and_d_at_most_b_when_memory_beats_the_store(case: tuple) -> None:
    """Guaranteed: each of b's parts is at most one of c's (c starts what b keeps warm, every call).
    Not guaranteed: d hands the weights over in memory (the host's read-back at the disk's rate, the engine
    nodes' pull over the interconnect) where b fetches them from the store, and drops b's train start and
    state fetch. Sufficient: the in-memory transfers take no longer than one node's fetch from the store."""
    plan, bandwidth, *_ = case
    h = _paths(case)
    a, b, c, d, e = h.paths
    assert _at_most(b.critical_path_s, c.critical_path_s) and _at_most(b.share, c.share)
    w = h.weights_bytes
    in_memory = w / bandwidth.local_disk_bytes_per_s + plan.rollout_nodes * w / bandwidth.interconnect_bytes_per_s
    if in_memory <= w / bandwidth.per_node_bytes_per_s:
        assert _at_most(d.critical_path_s, b.critical_path_s) and _at_most(d.share, b.share)
    for cost in (a, b, c, d, e):
        assert cost.critical_path_s == pytest.approx(sum(p.critical_s for p in cost.parts))
        assert 0.0 <= cost.share < 1.0


@settings(max_examples=300, deadline=None)
@given(_cases())
def test_e_at_most_d_for_every_plan(case: tuple) -> None:
    """Guaranteed: e's broadcast carries the weights over each link once where d's engine nodes pull them all
    from the host's node (and d first reads them back from disk); e's background uploads never take longer
    than d's synchronous one, a factor per byte common to the export and the state."""
    h = _paths(case)
    assert _at_most(h.designed.critical_path_s, h.persistent_ranks.critical_path_s)


@settings(max_examples=300, deadline=None)
@given(_cases())
def test_a_is_cheapest_only_when_the_local_disk_keeps_up(case: tuple) -> None:
    """Not guaranteed: path a writes the whole checkpoint to one machine's disk every step, d and b move
    it through the store and fetch the weights back. Sufficient: a <= d when that write takes no longer
    than one node's fetch of the weights ((W + O) / disk <= W / per-node store), and a <= b when the disk
    is at least as fast as the whole store ((W + O) / disk <= (W + O) / aggregate <= b's upload)."""
    plan, bandwidth, *_ = case
    h = _paths(case)
    w, o = h.weights_bytes, h.optimizer_bytes
    disk = bandwidth.local_disk_bytes_per_s
    if (w + o) / disk <= w / bandwidth.per_node_bytes_per_s:
        assert _at_most(h.in_process.critical_path_s, h.persistent_ranks.critical_path_s)
    if disk >= bandwidth.aggregate_bytes_per_s:
        assert _at_most(h.in_process.critical_path_s, h.persistent_engines.critical_path_s)


def test_a_above_d_and_b_is_possible() -> None:
    # the counter-example the property above allows: a slow local disk (0.5 GB/s) against the
    # default store: 458.7 GB / 0.5 GB/s = 917 s, more than b's 509 s and d's 291 s
    cost = paper_cost(bandwidth=handoff.Bandwidth(local_disk_bytes_per_s=0.5 * GB))
    assert cost.in_process.critical_path_s > cost.persistent_engines.critical_path_s > cost.persistent_ranks.critical_path_s
