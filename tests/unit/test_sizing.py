"""infra/sizing.py: memory arithmetic checked against numbers worked out by hand."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infra import sizing
from infra.sizing import GB, QWEN2_5_32B

# A toy shape small enough to count by hand.
TOY = sizing.ModelArchitecture(
    name="toy", layers=2, hidden_size=8, query_heads=2, kv_heads=1, head_dim=4, intermediate_size=16,
    vocab_size=10, tied_embeddings=True, qkv_bias=False, nominal_params=0,
)


def test_parameter_count_of_a_toy_shape_by_hand() -> None:
    # attention: q 8x8=64, k 8x4=32, v 8x4=32, o 8x8=64 -> 192; mlp 3*8*16 = 384; norms 2*8 = 16
    # per layer 592, x2 layers = 1184; tied embeddings 10*8 = 80; final norm 8 -> 1272
    assert sizing.parameter_count(TOY) == 1272


def test_qwen25_32b_parameter_count_matches_the_published_size() -> None:
    # per layer: attention 5120*5120*2 + 2*5120*1024 = 62,914,560, biases 5120 + 2*1024 = 7,168,
    # mlp 3*5120*27648 = 424,673,280, norms 10,240 -> 487,605,248; x64 = 31,206,735,872
    # embeddings + untied head 2*152064*5120 = 1,557,135,360; final norm 5,120 -> 32,763,876,352
    params = sizing.parameter_count(QWEN2_5_32B)
    assert params == 32_763_876_352
    assert abs(params - QWEN2_5_32B.nominal_params) / QWEN2_5_32B.nominal_params < 0.01


def test_kv_cache_per_token_and_per_20480_token_sequence() -> None:
    # 2 (K,V) * 64 layers * 8 kv heads * 128 head dim * 2 bytes = 262,144 bytes per token
    assert sizing.kv_cache_bytes_per_token(QWEN2_5_32B) == 262_144
    # 20480 tokens * 262,144 = 5,368,709,120 bytes (exactly 5 GiB)
    assert sizing.kv_cache_bytes_per_sequence(QWEN2_5_32B, 20480) == 5 * 1024**3


def test_training_state_per_gpu_for_each_zero_stage() -> None:
    # 1000 params: weights 2000 B, grads 4000 B, optimizer 12000 B, over 4 GPUs
    assert sizing.training_state_bytes_per_gpu(1000, 1, 4) == 2000 + 4000 + 3000
    assert sizing.training_state_bytes_per_gpu(1000, 2, 4) == 2000 + (4000 + 12000) // 4
    assert sizing.training_state_bytes_per_gpu(1000, 3, 4) == 18000 // 4
    with pytest.raises(ValueError, match="zero_stage"):
        sizing.training_state_bytes_per_gpu(1000, 4, 4)


def test_activation_estimate_of_the_toy_shape() -> None:
    # 3 tokens: checkpoints 2 layers*3*8*2 B = 96; working set 3*(4*8 + 3*16)*2 = 480; logits 3*10*10 = 300
    est = sizing.activation_bytes(TOY, 3)
    assert (est.checkpoints, est.layer_working_set, est.logits, est.total) == (96, 480, 300, 876)


def test_engine_memory_and_tensor_parallel_choice() -> None:
    params = sizing.parameter_count(QWEN2_5_32B)
    # TP 2 on 80 GB at 0.85: per GPU 68e9 - 32,763,876,352 (half of 65.5 GB) - 3e9 = 32,236,123,648;
    # x2 = 64,472,247,296 B of KV; one 21504-token sequence = 21504*262,144 = 5,637,144,576 -> 11
    mem = sizing.engine_memory(QWEN2_5_32B, params, 2, tokens_per_sequence=21504, gpu_memory_bytes=80 * GB,
                               gpu_memory_utilization=0.85)
    assert mem.kv_budget_per_engine == 64_472_247_296
    assert mem.full_length_sequences == 11
    # a group of 16 needs more than TP 2 gives: TP 4 (196.9 GB - ... -> 34 sequences)
    chosen = sizing.choose_tensor_parallel(QWEN2_5_32B, params, min_sequences=16, tokens_per_sequence=21504,
                                           gpu_memory_bytes=80 * GB, gpu_memory_utilization=0.85, gpus_per_node=8)
    assert chosen.tensor_parallel == 4
    with pytest.raises(ValueError, match="divide"):
        sizing.engine_memory(QWEN2_5_32B, params, 3, tokens_per_sequence=10, gpu_memory_bytes=80 * GB,
                             gpu_memory_utilization=0.85)


def test_paper_config_plan() -> None:
    plan = sizing.plan_cluster(
        QWEN2_5_32B, zero_stage=3, micro_batch_samples=2, max_prompt_tokens=1024, max_response_tokens=20480,
        samples_per_prompt=16, configured_train_processes=8,
    )
    # micro-batch 2 x 21504 tokens: logits alone 43008*152064*10 B = 65.4 GB > 72 GB usable once
    # checkpoints (28.2 GB) are added, at any GPU count -> planned with 1 sample per micro-batch.
    assert plan.micro_batch_samples == 1
    # 1 x 21504 tokens: activations 51.2 GB + gather 2 layers 1.95 GB; states 18 B/param / N:
    # N=16 -> 36.9 GB (90.1 total, no), N=32 -> 18.4 GB (71.6 total <= 72, fits)
    assert plan.train_gpus == 32 and plan.train_nodes == 4 and plan.train_nproc_per_node == 8
    assert plan.rollout_tensor_parallel == 4 and plan.rollout_engines == 8 and plan.rollout_nodes == 4
    warnings = " ".join(plan.warnings())
    assert "micro_batch_samples=2" in warnings and "num_processes=8" in warnings
    assert "node" not in warnings  # several nodes are a PyTorch Elastic job (engines/train/rank.py), not a problem


def test_chunked_log_probs_halve_the_training_gpus() -> None:
    # Logits of one 4096-token chunk instead of 21504 tokens: 4096*152064*10 B = 6.2 GB instead
    # of 32.7 GB, so activations 24.8 GB; ZeRO-3 states at N=16: 36.9 GB, + 1.95 GB gather
    # buffer = 63.6 GB <= 72 GB -> 16 GPUs (2 nodes) instead of 32.
    plan = sizing.plan_cluster(
        QWEN2_5_32B, zero_stage=3, micro_batch_samples=1, max_prompt_tokens=1024, max_response_tokens=20480,
        samples_per_prompt=16, logprob_chunk_tokens=4096, configured_activation_checkpointing=False,
    )
    assert plan.train_gpus == 16 and plan.train_nodes == 2
    assert round(plan.train_activations_per_gpu / 1e9, 1) == 24.8 and round(plan.train_total_per_gpu / 1e9, 1) == 63.6
    assert any("activation_checkpointing" in w for w in plan.warnings())


def test_sizing_table_is_computed_not_typed() -> None:
    text = sizing.sizing_tables_markdown(QWEN2_5_32B)
    assert "| bf16 weights | 65.5 |" in text
    assert "| KV cache per sequence at 20480 tokens | 5.4 |" in text
    # ZeRO-3 on 8 GPUs does not fit: 73.7 GB states + 24.8 activations + 1.95 gather buffer
    assert "| 3 | 73.7 + 26.7 = 100.4 (no) |" in text
    assert "logits 6.2 GB = 24.8 GB per GPU (logits of the whole sequence at once: 32.7 GB, total 51.2 GB)" in text
    assert "| 4 | 16.4 | 194.5 | 34 |" in text


def test_cluster_doc_holds_the_computed_table() -> None:
    from pathlib import Path

    doc = Path(__file__).resolve().parents[2] / "docs" / "CLUSTER.md"
    assert sizing.sizing_tables_markdown(QWEN2_5_32B) in doc.read_text(), (
        "docs/CLUSTER.md is stale: regenerate its sizing section with `dapo deploy --sizing`"
    )


# ----------------------------------------------------------------------------- issue 49: pods, engines, refusals

MODEL_CONFIGS = __import__("pathlib").Path(__file__).resolve().parents[1] / "data" / "model_configs"


def _arch(name: str) -> sizing.ModelArchitecture:
    from infra import model_shape

    return model_shape.load_architecture(MODEL_CONFIGS / name)


def _paper_plan(arch: sizing.ModelArchitecture, **kwargs: object) -> sizing.ClusterPlan:
    settings: dict[str, object] = dict(zero_stage=3, micro_batch_samples=1, max_prompt_tokens=1024,
                                       max_response_tokens=20480, samples_per_prompt=16, logprob_chunk_tokens=4096)
    settings.update(kwargs)
    return sizing.plan_cluster(arch, **settings)  # type: ignore[arg-type]


def test_pod_requests_come_from_the_plan() -> None:
    # Before: no pod requests in the plan (every GPU pod asked for 64 CPUs and 900Gi, infra/environments.py).
    small = _paper_plan(_arch("Qwen2.5-0.5B"))
    assert small.train_gpus == 1 and small.train_pod.gpus == 1 and small.rollout_pod.gpus == 1
    assert small.train_pod.cpus <= 8 and small.train_pod.memory_gib <= 32
    assert small.rollout_pod.cpus <= 8 and small.rollout_pod.memory_gib <= 32
    paper = _paper_plan(QWEN2_5_32B)
    # 32B, ZeRO-3 on 16 GPUs (2 pods of 8 ranks): per rank max(fp32 load shard 8.2 GB, state shard 36.9 GB)
    # + 6 GiB runtime; + one bf16 export copy 65.5 GB + 4 GiB pod base: 8 x (36.9 + 6.4) + 65.5 + 4.3 = 416 GB
    assert paper.train_pod.gpus == 8 and paper.train_pod.cpus == 64
    expected = 4 * 2**30 + 8 * (6 * 2**30 + sizing.training_state_bytes_per_gpu(paper.params, 3, 16)) + 2 * paper.params
    assert paper.train_pod.memory_gib == -(-expected // 2**30)
    # rollout pods: 8 GPUs (2 engines x TP 4) each holding a 16.4 GB weight shard read through host memory
    assert paper.rollout_pod.gpus == 8 and paper.rollout_pod.memory_gib > small.rollout_pod.memory_gib


def test_tiny_pod_request_is_small() -> None:
    tiny = sizing.pod_request(gpus=1, host_bytes_per_gpu=0)
    assert tiny.cpus <= 8 and tiny.memory_gib <= 32 and tiny.memory == f"{tiny.memory_gib}Gi"


def test_configured_engines_size_the_rollout_apart_from_training() -> None:
    # Before: rollout GPUs = training GPUs whatever rollout.engines says (only a warning).
    arch = _arch("Qwen2.5-7B")
    planned = _paper_plan(arch)
    plan = _paper_plan(arch, configured_rollout_engines=8, configured_tensor_parallel=1)
    assert plan.rollout_tensor_parallel == 1 and plan.rollout_engines == 8 and plan.rollout_gpus == 8
    assert plan.train_gpus == planned.train_gpus  # training as planned
    assert plan.rollout_nodes == 1 and plan.rollout_pod.gpus == 8
    # a larger tensor parallel than the memory needs is honoured too: engines x TP GPUs
    wide = _paper_plan(QWEN2_5_32B, configured_rollout_engines=3, configured_tensor_parallel=8)
    assert (wide.rollout_tensor_parallel, wide.rollout_gpus, wide.rollout_nodes, wide.rollout_pod.gpus) == (8, 24, 3, 8)
    assert not any("rollout.engines" in w for w in wide.warnings())


def test_engines_fill_whole_nodes_of_equal_pods() -> None:
    # 3 engines of TP 4 on nodes of 8: 2 engines per node -> 2 pods of 8 GPUs (one engine slot idle)
    plan = _paper_plan(QWEN2_5_32B, configured_rollout_engines=3, configured_tensor_parallel=4)
    assert (plan.rollout_gpus, plan.rollout_nodes, plan.rollout_pod.gpus) == (12, 2, 8)


def test_training_that_cannot_fit_is_refused_naming_the_biggest_term() -> None:
    # Before: plan_cluster took no training GPU count; it planned the fewest GPUs that fit.
    # 32B on one 80 GB GPU, ZeRO-1: weights 65.5 + gradients 131.1 + optimizer state 393.2 GB + activations
    with pytest.raises(sizing.PlanDoesNotFit) as err:
        _paper_plan(QWEN2_5_32B, zero_stage=1, train_gpus=1, gpus_per_node=1)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("training needs ") and "(optimizer state 393.2 GB)" in message
    assert "on 80 GB GPUs" in message and "train.zero_stage=3" in message and "--train-gpus" in message
    # at ZeRO-3 the knob is more GPUs only
    with pytest.raises(sizing.PlanDoesNotFit, match=r"optimizer state 393.2 GB\).*raise --train-gpus"):
        _paper_plan(QWEN2_5_32B, train_gpus=1, gpus_per_node=1)


def test_unchunked_logits_name_the_chunk_knob() -> None:
    with pytest.raises(sizing.PlanDoesNotFit, match=r"activations: logits .*train.logprob_chunk_tokens"):
        _paper_plan(QWEN2_5_32B, train_gpus=16, logprob_chunk_tokens=0)  # logits 32.7 GB > optimizer 24.6 GB


def test_an_engine_that_cannot_hold_its_weights_and_a_group_is_refused() -> None:
    # One GPU per node: 32B weights 65.5 GB + a group's KV cache 16 x 21504 x 262,144 B = 90.2 GB + 3 GB
    # workspace = 158.7 GB > 0.85 x 80 GB; the KV cache is the biggest term
    with pytest.raises(sizing.PlanDoesNotFit) as err:
        _paper_plan(QWEN2_5_32B, train_gpus=16, gpus_per_node=1)
    message = str(err.value)
    assert message.startswith("rollout needs 158.7 GB per GPU at tensor_parallel 1 (KV cache of 16 x 21504 tokens 90.2 GB)")
    assert "rollout.samples_per_prompt" in message and "\n" not in message
    # a group of 2 short sequences: the weights are the biggest term, and the knob is a wider engine
    with pytest.raises(sizing.PlanDoesNotFit, match=r"\(weights 65.5 GB\).*raise rollout.tensor_parallel_size"):
        _paper_plan(QWEN2_5_32B, train_gpus=16, gpus_per_node=1, samples_per_prompt=2, max_response_tokens=1024)


def test_an_explicit_training_gpu_count_that_fits_is_kept() -> None:
    plan = _paper_plan(QWEN2_5_32B, train_gpus=32)
    assert plan.train_gpus == 32 and plan.train_nodes == 4
    with pytest.raises(ValueError, match="--train-gpus 12"):
        _paper_plan(QWEN2_5_32B, train_gpus=12)


def test_the_default_cluster_plan_holds_the_tiny_pods() -> None:
    # infra/environments.py types the default plan's pods (importing sizing would tie every stage's
    # cache version to it); they must be what sizing computes for one GPU and a negligible model.
    import ast
    from pathlib import Path

    source = (Path(__file__).resolve().parents[2] / "infra" / "environments.py").read_text()
    assign = next(node for node in ast.walk(ast.parse(source))
                  if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "_DEFAULT_PLAN")
    plan = ast.literal_eval(assign.value)
    pod = sizing.pod_request(gpus=1, host_bytes_per_gpu=0)
    head = sizing.rollout_head_request(sequences_per_round=0, tokens_per_sequence=0)
    assert (plan["rollout_pod_cpu"], plan["rollout_pod_memory"], plan["rollout_pod_gpus"]) == (str(pod.cpus), pod.memory, 1)
    assert (plan["train_pod_cpu"], plan["train_pod_memory"]) == (str(pod.cpus), pod.memory)
    assert (plan["rollout_head_cpu"], plan["rollout_head_memory"]) == (str(head.cpus), head.memory)


# ----------------------------------------------------------------------------- issue 49: the optimizer step's transients


def test_optimizer_step_transients_by_zero_stage_by_hand() -> None:
    # 1000 params over 4 GPUs: a rank steps 250; flat fp32 gradients 4 x 250 = 1000 B, CUDA AdamW's sqrt(v) 1000 B.
    # ZeRO-1 has freed the module's 4000 B of gradients by the update: peak max(1000, 2000 - 4000) = 1000.
    # ZeRO-2/3 keep their gradient partition: 1000 + 1000 = 2000.
    assert sizing.optimizer_step_bytes(1000, 1, 4) == sizing.OptimizerStep(1000, 1000, 4000)
    assert [sizing.optimizer_step_bytes(1000, stage, 4).peak for stage in (1, 2, 3)] == [1000, 2000, 2000]
    # one process on a CPU (the measured case): 4000 flat + 8000 scratch (sqrt(v) and its quotient) - 4000 freed
    assert sizing.optimizer_step_bytes(1000, 1, 1, adam_scratch_bytes_per_param=8).peak == 8000
    assert sizing.optimizer_step_bytes(1000, 1, 1).peak == 4000  # CUDA: max(4000, 4000 + 4000 - 4000)
    # ZeRO-3 steps one sub-group of at most 1e9 elements: 32B over 16 GPUs is 2.05e9 a rank -> 1e9 x (4 + 4)
    params = sizing.parameter_count(QWEN2_5_32B)
    assert sizing.optimizer_step_bytes(params, 3, 16).peak == 8 * 10**9
    assert sizing.optimizer_step_bytes(params, 3, 64).peak == 8 * -(-params // 64)


def test_the_step_term_is_what_the_step_needs_beyond_the_released_activations() -> None:
    # TOY, 1272 params, ZeRO-2 on one GPU: the step peaks 8 x 1272 = 10,176 B above the states; 3 tokens of
    # activations (876 B) are released before it -> the term is 9,300. At 100 tokens (29,200 B) nothing is left.
    terms = {t.name: t.bytes for t in sizing.training_terms(TOY, 1272, 2, 1, 3)}
    assert terms["optimizer step transients"] == 10_176 - 876 == 9_300
    assert sum(terms.values()) == sizing.train_bytes_per_gpu(TOY, 1272, 2, 1, 3) == 2544 + 5088 + 15264 + 10_176
    big = {t.name: t.bytes for t in sizing.training_terms(TOY, 1272, 2, 1, 100)}
    assert big["optimizer step transients"] == 0


def test_fp32_precision_doubles_the_weights_and_activations() -> None:
    # 3 tokens at fp32: checkpoints 2 x 3 x 8 x 4 = 192, one layer 3 x 80 x 4 = 960, logits 3 x 10 x 12 = 360
    terms = {t.name: t.bytes for t in sizing.training_terms(TOY, 1272, 1, 1, 3, precision="fp32")}
    assert terms["weights"] == 4 * 1272 and terms["gradients"] == 4 * 1272 and terms["optimizer state"] == 12 * 1272
    assert (terms["activations: layer inputs"], terms["activations: one layer recomputed"],
            terms["activations: logits"]) == (192, 960, 360)
    with pytest.raises(ValueError, match="precision"):
        sizing.training_terms(TOY, 1272, 1, 1, 3, precision="fp16")
    # 32B, ZeRO-3 on 64 GPUs: the fp32 weights add 2 B/param / 64 = 1.02 GB a rank
    bf16 = _paper_plan(QWEN2_5_32B, train_gpus=64)
    fp32 = _paper_plan(QWEN2_5_32B, precision="fp32", train_gpus=64)
    assert fp32.train_state_per_gpu - bf16.train_state_per_gpu == 2 * bf16.params // 64 == 1_023_871_136
    assert fp32.precision == "fp32" and "fp32" in sizing.format_plan(fp32)


def test_zero2_on_8_gpus_is_sized_by_its_optimizer_step() -> None:
    # 32B, ZeRO-2, 8 GPUs: a rank steps 4.1e9 params: flat gradients 16.4 GB + sqrt(v) 16.4 GB = 32.8 GB,
    # more than the 24.8 GB of activations released before it: the table counts 32.8, not 24.8
    assert "| 2 | 131.1 + 32.8 = 163.8 (no) |" in sizing.sizing_tables_markdown(QWEN2_5_32B)


@settings(max_examples=200, deadline=None)
@given(stage=st.sampled_from([1, 2, 3]), gpus=st.sampled_from([1, 2, 8, 64]), tokens=st.integers(1, 50_000),
       chunk=st.sampled_from([0, 1024]), precision=st.sampled_from(["bf16", "fp32"]))
def test_training_peaks_at_states_plus_the_larger_of_activations_and_the_step(
        stage: int, gpus: int, tokens: int, chunk: int, precision: str) -> None:
    """Property: the training terms add up to states + max(activations, the step's peak) (+ gather buffer)."""
    arch = QWEN2_5_32B
    params = sizing.parameter_count(arch)
    terms = {t.name: t.bytes for t in sizing.training_terms(arch, params, stage, gpus, tokens, chunk, precision=precision)}
    states = terms["weights"] + terms["gradients"] + terms["optimizer state"]
    elements = sizing.precision_bytes(precision)
    acts = sizing.activation_bytes(arch, tokens, bytes_per_element=elements.activations,
                                   logit_bytes_per_element=elements.logits, logprob_chunk_tokens=chunk).total
    step = sizing.optimizer_step_bytes(params, stage, gpus).peak
    gather = sizing.zero3_gather_bytes(arch, params, bytes_per_param=elements.weights) if stage == 3 else 0
    assert sum(terms.values()) == states + max(acts, step) + gather
