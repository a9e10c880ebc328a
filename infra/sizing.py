"""GPU sizing arithmetic for a cluster run: memory per GPU for rollout and training, GPUs per stage.

Pure functions over integers and floats (stdlib only): no flyte, torch or config objects. The
deploy command (cli/deploy.py) unpacks a RunConfig into these scalars, and the table in
docs/CLUSTER.md is printed by ``dapo deploy --sizing`` from the same functions, never typed by
hand. ``plan_shared_gpu`` sizes a local run that shares one GPU between the vLLM engine and a
training rank. A plan that cannot fit raises PlanDoesNotFit: one line naming the biggest term and
the setting that fixes it.

Design notes (the memory model per GPU, host memory per pod): docs/CLUSTER.md,
"Sizing arithmetic (infra/sizing.py)".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GB = 10**9  # decimal gigabyte: GPU vendors' "80 GB" is ~80e9 usable bytes (H100 SXM: 81,559 MiB)
GIB = 2**30  # Kubernetes' "Gi", the unit of pod memory requests
BF16_BYTES = 2
FP32_BYTES = 4
GRAD_BYTES = 4  # fp32 gradients (bf16 runs accumulate in fp32: infra/deepspeed.py's grad_accum_dtype)
OPTIMIZER_BYTES = 12  # fp32 master copy + Adam's first and second moments
ADAM_SCRATCH_BYTES_CUDA = 4  # torch AdamW's foreach path (CUDA): one fp32 sqrt(v) buffer, then in place
ADAM_SCRATCH_BYTES_CPU = 8  # its single-tensor path (CPU): sqrt(v) and sqrt(v) / bias correction at once
ZERO3_SUB_GROUP_ELEMENTS = 10**9  # DeepSpeed's zero_optimization.sub_group_size default (infra/deepspeed.py keeps it)
CPUS_PER_GPU = 8  # data loading, tokenisation, NCCL and the runtime's threads of one GPU process
HOST_BYTES_PER_GPU_PROCESS = 6 * GIB  # CUDA context, torch/vLLM imports, NCCL and pinned buffers
HOST_BYTES_PER_POD = 4 * GIB  # the pod's own agent (Flyte, Ray or the elastic launcher)


class PlanDoesNotFit(ValueError):
    """The resources given cannot hold the run; the message is one line: the need, its biggest term, the fix."""


@dataclass(frozen=True)
class ModelArchitecture:
    """The shape numbers of a decoder-only transformer that decide its memory."""

    name: str  # human name, printed in tables
    layers: int  # transformer blocks
    hidden_size: int  # model width
    query_heads: int  # attention query heads
    kv_heads: int  # key/value heads (grouped-query attention)
    head_dim: int  # width of one head
    intermediate_size: int  # SwiGLU MLP width
    vocab_size: int  # embedding rows (and LM-head columns)
    tied_embeddings: bool  # LM head shares the embedding matrix
    qkv_bias: bool  # q/k/v projections carry a bias (Qwen2 does)
    nominal_params: int  # the parameter count its publisher states, for cross-checking
    qk_norm: bool = False  # an RMSNorm over each query and key head (Qwen3)


# Qwen2.5-32B, from its published config.json (Qwen/Qwen2.5-32B on the Hugging Face hub:
# num_hidden_layers 64, hidden_size 5120, num_attention_heads 40, num_key_value_heads 8,
# intermediate_size 27648, vocab_size 152064, tie_word_embeddings false; head dim 5120 / 40 = 128)
# and the Qwen2.5 technical report (arXiv 2412.15115, table 1: 32.5B parameters, 31.0B without
# embeddings; counting the untied LM head as well gives ~32.8B).
QWEN2_5_32B = ModelArchitecture(
    name="Qwen2.5-32B",
    layers=64,
    hidden_size=5120,
    query_heads=40,
    kv_heads=8,
    head_dim=128,
    intermediate_size=27648,
    vocab_size=152064,
    tied_embeddings=False,
    qkv_bias=True,
    nominal_params=32_800_000_000,
)


def parameter_count(arch: ModelArchitecture) -> int:
    """Parameters derived from the shape: embeddings, attention, SwiGLU MLP, RMSNorms, LM head."""
    h = arch.hidden_size
    q_width = arch.query_heads * arch.head_dim
    kv_width = arch.kv_heads * arch.head_dim
    attention = h * q_width + 2 * h * kv_width + q_width * h
    if arch.qkv_bias:
        attention += q_width + 2 * kv_width
    mlp = 3 * h * arch.intermediate_size  # gate, up and down projections
    norms = 2 * h  # input and post-attention RMSNorm weights
    if arch.qk_norm:
        norms += 2 * arch.head_dim  # one q_norm and one k_norm, shared across heads
    per_layer = attention + mlp + norms
    embeddings = arch.vocab_size * h * (1 if arch.tied_embeddings else 2)
    return arch.layers * per_layer + embeddings + h  # + the final RMSNorm


def weight_bytes(params: int, bytes_per_param: int = BF16_BYTES) -> int:
    """Bytes of one copy of the weights (bf16 by default)."""
    return params * bytes_per_param


@dataclass(frozen=True)
class PrecisionBytes:
    """Bytes an element of ``train.precision`` takes in the training terms that depend on it."""

    weights: int  # the module's parameters
    activations: int  # layer inputs and one recomputed layer
    logits: int  # per logit: logits + fp32 log-softmax + its fp32 gradient


TRAIN_PRECISION_BYTES = {
    "bf16": PrecisionBytes(weights=BF16_BYTES, activations=BF16_BYTES, logits=10),
    "fp32": PrecisionBytes(weights=FP32_BYTES, activations=FP32_BYTES, logits=12),
}


def precision_bytes(precision: str) -> PrecisionBytes:
    """The element sizes of ``train.precision`` (``bf16`` or ``fp32``)."""
    if precision not in TRAIN_PRECISION_BYTES:
        raise ValueError(f"precision must be one of {tuple(TRAIN_PRECISION_BYTES)}, got {precision!r}")
    return TRAIN_PRECISION_BYTES[precision]


def kv_cache_bytes_per_token(arch: ModelArchitecture, bytes_per_element: int = BF16_BYTES) -> int:
    """KV-cache bytes one token occupies in every layer: 2 (K, V) x layers x kv heads x head dim x bytes."""
    return 2 * arch.layers * arch.kv_heads * arch.head_dim * bytes_per_element


def kv_cache_bytes_per_sequence(arch: ModelArchitecture, tokens: int, bytes_per_element: int = BF16_BYTES) -> int:
    """KV-cache bytes of one sequence of ``tokens`` tokens (prompt + response)."""
    return tokens * kv_cache_bytes_per_token(arch, bytes_per_element)


def training_state_bytes_per_gpu(
    params: int,
    zero_stage: int,
    gpus: int,
    *,
    weight_bytes_per_param: int = BF16_BYTES,
    grad_bytes_per_param: int = GRAD_BYTES,
    optimizer_bytes_per_param: int = OPTIMIZER_BYTES,
) -> int:
    """Weights + gradients + optimizer state held by one of ``gpus`` data-parallel GPUs.

    ZeRO-1 partitions the optimizer state (fp32 master + Adam moments), ZeRO-2 also the
    gradients, ZeRO-3 also the weights (DeepSpeed's ZeRO paper, arXiv 1910.02054, sec. 5).
    """
    if zero_stage not in (1, 2, 3):
        raise ValueError(f"zero_stage must be 1, 2 or 3, got {zero_stage}")
    if gpus < 1:
        raise ValueError(f"gpus must be >= 1, got {gpus}")
    weights = params * weight_bytes_per_param
    grads = params * grad_bytes_per_param
    optimizer = params * optimizer_bytes_per_param
    if zero_stage == 1:
        return weights + grads + math.ceil(optimizer / gpus)
    if zero_stage == 2:
        return weights + math.ceil((grads + optimizer) / gpus)
    return math.ceil((weights + grads + optimizer) / gpus)


@dataclass(frozen=True)
class ActivationEstimate:
    """Rough activation memory of one micro-batch on one GPU (bytes)."""

    checkpoints: int  # every layer's input, kept by activation checkpointing
    layer_working_set: int  # one layer's activations while it is recomputed for backward
    logits: int  # bf16 logits + fp32 log-softmax + its fp32 gradient (of one chunk when chunked)
    total: int


def activation_bytes(
    arch: ModelArchitecture,
    tokens_per_micro_batch: int,
    *,
    bytes_per_element: int = BF16_BYTES,
    logit_bytes_per_element: int = 10,
    logprob_chunk_tokens: int = 0,
) -> ActivationEstimate:
    """Rough activation bytes of a micro-batch of ``tokens_per_micro_batch`` tokens (see module doc);
    ``logprob_chunk_tokens`` > 0: log-probs computed that many positions at a time."""
    t = tokens_per_micro_batch
    checkpoints = arch.layers * t * arch.hidden_size * bytes_per_element
    working = t * (4 * arch.hidden_size + 3 * arch.intermediate_size) * bytes_per_element
    logit_tokens = min(t, logprob_chunk_tokens) if logprob_chunk_tokens > 0 else t
    logits = logit_tokens * arch.vocab_size * logit_bytes_per_element
    return ActivationEstimate(checkpoints, working, logits, checkpoints + working + logits)


def zero3_gather_bytes(arch: ModelArchitecture, params: int, prefetch_layers: int = 2,
                       bytes_per_param: int = BF16_BYTES) -> int:
    """ZeRO-3 working buffer: the parameters (bf16 by default) of ``prefetch_layers`` gathered layers."""
    embeddings = arch.vocab_size * arch.hidden_size * (1 if arch.tied_embeddings else 2)
    per_layer = (params - embeddings) / arch.layers
    return int(prefetch_layers * per_layer * bytes_per_param)


@dataclass(frozen=True)
class OptimizerStep:
    """What one rank allocates at ``optimizer.step`` beside its states (bytes; see the module doc)."""

    flat_gradients: int  # the fp32 flat copy of the gradient partition (sub-group) the optimizer steps
    adam_scratch: int  # AdamW's temporaries over that partition
    released_gradients: int  # the module's gradients, freed before the update (ZeRO-1 only)

    @property
    def peak(self) -> int:
        """Above the states: the flat copy beside the gradients, or during the update the copy and the
        scratch less the gradients freed by then."""
        return max(self.flat_gradients, self.flat_gradients + self.adam_scratch - self.released_gradients)


def optimizer_step_bytes(params: int, zero_stage: int, gpus: int, *,
                         adam_scratch_bytes_per_param: int = ADAM_SCRATCH_BYTES_CUDA) -> OptimizerStep:
    """The step's transients on one of ``gpus`` ranks. ZeRO-1/2 step the rank's whole partition at once
    (stage_1_and_2.py: step), ZeRO-3 one sub-group at a time (stage3.py: _prepare_fp32_grad_for_sub_group);
    ZeRO-2/3 keep their gradient partition through the step, ZeRO-1 frees the module's gradients
    (free_grad_in_param_list) before ``optimizer.step``."""
    stepped = math.ceil(params / gpus)
    if zero_stage == 3:
        stepped = min(stepped, ZERO3_SUB_GROUP_ELEMENTS)
    released = params * GRAD_BYTES if zero_stage == 1 else 0
    return OptimizerStep(stepped * FP32_BYTES, stepped * adam_scratch_bytes_per_param, released)


def train_bytes_per_gpu(
    arch: ModelArchitecture, params: int, zero_stage: int, gpus: int, tokens_per_micro_batch: int,
    logprob_chunk_tokens: int = 0, *, precision: str = "bf16",
) -> int:
    """Training memory of one GPU: the sum of ``training_terms``."""
    return sum(t.bytes for t in training_terms(arch, params, zero_stage, gpus, tokens_per_micro_batch,
                                               logprob_chunk_tokens, precision=precision))


@dataclass(frozen=True)
class MemoryTerm:
    """One named part of a per-GPU memory need, and the setting that shrinks it (for refusals)."""

    name: str
    bytes: int
    knob: str


def training_terms(
    arch: ModelArchitecture, params: int, zero_stage: int, gpus: int, tokens_per_micro_batch: int,
    logprob_chunk_tokens: int = 0, *, states_knob: str = "", precision: str = "bf16",
    adam_scratch_bytes_per_param: int = ADAM_SCRATCH_BYTES_CUDA,
) -> tuple[MemoryTerm, ...]:
    """The parts of ``train_bytes_per_gpu``: each state partitioned as its ZeRO stage does, the activations,
    the optimizer step's transients beyond them. ``states_knob``: what shrinks the states where the GPU
    count is not a flag (a local run); default the cluster's ``--train-gpus``. ``precision``:
    ``train.precision``; ``adam_scratch_bytes_per_param``: ADAM_SCRATCH_BYTES_CPU for a rank on a CPU."""
    more_gpus = states_knob or "raise --train-gpus" + ("" if zero_stage == 3 else " or use train.zero_stage=3")
    shard = lambda per_param, partitioned: math.ceil(params * per_param / gpus) if partitioned else params * per_param  # noqa: E731
    elements = precision_bytes(precision)
    acts = activation_bytes(arch, tokens_per_micro_batch, bytes_per_element=elements.activations,
                            logit_bytes_per_element=elements.logits, logprob_chunk_tokens=logprob_chunk_tokens)
    step = optimizer_step_bytes(params, zero_stage, gpus, adam_scratch_bytes_per_param=adam_scratch_bytes_per_param)
    shorter = "lower rollout.max_response_tokens (the micro-batch is already 1 sample)"
    terms = [
        MemoryTerm("weights", shard(elements.weights, zero_stage == 3), more_gpus),
        MemoryTerm("gradients", shard(GRAD_BYTES, zero_stage >= 2), more_gpus),
        MemoryTerm("optimizer state", shard(OPTIMIZER_BYTES, True), more_gpus),
        MemoryTerm("activations: logits", acts.logits,
                   "lower train.logprob_chunk_tokens" if logprob_chunk_tokens else "set train.logprob_chunk_tokens=4096"),
        MemoryTerm("activations: layer inputs", acts.checkpoints, shorter),
        MemoryTerm("activations: one layer recomputed", acts.layer_working_set, shorter),
        MemoryTerm("optimizer step transients", max(0, step.peak - acts.total), more_gpus),
    ]
    if zero_stage == 3:
        terms.append(MemoryTerm("ZeRO-3 gather buffer", zero3_gather_bytes(arch, params, bytes_per_param=elements.weights),
                                more_gpus))
    return tuple(terms)


def refusal(stage: str, terms: tuple[MemoryTerm, ...], *, gpus: str, gpu_memory_bytes: int, usable_bytes: float,
            usable_note: str = "") -> PlanDoesNotFit:
    """The one-line refusal: what ``stage`` needs per GPU, its biggest term, and that term's knob."""
    biggest = max(terms, key=lambda t: t.bytes)
    need = sum(t.bytes for t in terms)
    return PlanDoesNotFit(
        f"{stage} needs {need / GB:.1f} GB per GPU at {gpus} ({biggest.name} {biggest.bytes / GB:.1f} GB) on "
        f"{gpu_memory_bytes / GB:.0f} GB GPUs, {usable_bytes / GB:.1f} GB usable{usable_note}: {biggest.knob}"
    )


@dataclass(frozen=True)
class PodRequest:
    """What one Kubernetes pod of a stage asks for: CPUs, host memory (whole GiB) and GPUs."""

    cpus: int
    memory_gib: int
    gpus: int

    @property
    def memory(self) -> str:
        """The memory request as Kubernetes writes it."""
        return f"{self.memory_gib}Gi"


def pod_request(*, gpus: int, host_bytes_per_gpu: int, host_bytes_per_pod: int = 0) -> PodRequest:
    """A pod of ``gpus`` GPU processes each holding ``host_bytes_per_gpu`` on the host (see module doc)."""
    memory = HOST_BYTES_PER_POD + host_bytes_per_pod + gpus * (HOST_BYTES_PER_GPU_PROCESS + host_bytes_per_gpu)
    return PodRequest(cpus=CPUS_PER_GPU * gpus, memory_gib=math.ceil(memory / GIB), gpus=gpus)


def rollout_head_request(*, sequences_per_round: int, tokens_per_sequence: int) -> PodRequest:
    """The Ray head, where the rollout task drives the engines: it receives a whole round's token ids and
    log-probs (4 + 4 bytes a token), once in Ray's object store (capped at 30% of the pod's memory) and
    once in the driver's heap; plus a fixed allowance for Ray's head services and the driver."""
    round_bytes = sequences_per_round * tokens_per_sequence * 8
    memory = 2 * HOST_BYTES_PER_POD + math.ceil(round_bytes / 0.3) + round_bytes
    return PodRequest(cpus=CPUS_PER_GPU, memory_gib=math.ceil(memory / GIB), gpus=0)


def train_host_bytes_per_rank(params: int, zero_stage: int, gpus: int) -> int:
    """Host bytes of one training rank: the larger of its fp32 load and its training-state shard."""
    load = params * FP32_BYTES if zero_stage < 3 else math.ceil(params * FP32_BYTES / gpus)
    return max(load, training_state_bytes_per_gpu(params, zero_stage, gpus))


@dataclass(frozen=True)
class EngineMemory:
    """Memory of one vLLM engine spread over ``tensor_parallel`` GPUs (bytes)."""

    tensor_parallel: int
    weights_per_gpu: int
    kv_budget_per_engine: int  # what vLLM may give the KV cache, over the whole TP group
    kv_per_sequence: int
    full_length_sequences: int  # sequences of the full length whose KV cache fits at once


def engine_memory(
    arch: ModelArchitecture,
    params: int,
    tensor_parallel: int,
    *,
    tokens_per_sequence: int,
    gpu_memory_bytes: int,
    gpu_memory_utilization: float,
    workspace_bytes_per_gpu: int = 3 * GB,
) -> EngineMemory:
    """KV-cache budget of one engine: utilisation x GPU memory - weights shard - workspace, per GPU.

    ``workspace_bytes_per_gpu`` stands for vLLM's activation peak, CUDA graphs and the sampler's
    logits (a rough allowance; vLLM measures its own at start-up).
    """
    if tensor_parallel < 1 or arch.kv_heads % tensor_parallel:
        raise ValueError(f"tensor_parallel={tensor_parallel} must divide the {arch.kv_heads} KV heads")
    weights = math.ceil(weight_bytes(params) / tensor_parallel)
    per_gpu_free = int(gpu_memory_bytes * gpu_memory_utilization) - weights - workspace_bytes_per_gpu
    budget = max(0, per_gpu_free) * tensor_parallel
    per_seq = kv_cache_bytes_per_sequence(arch, tokens_per_sequence)
    return EngineMemory(tensor_parallel, weights, budget, per_seq, budget // per_seq)


def choose_tensor_parallel(
    arch: ModelArchitecture,
    params: int,
    *,
    min_sequences: int,
    tokens_per_sequence: int,
    gpu_memory_bytes: int,
    gpu_memory_utilization: float,
    gpus_per_node: int,
    at_least: int = 1,
) -> EngineMemory:
    """The smallest tensor-parallel size, ``at_least`` (rollout.tensor_parallel_size) or more, whose engine
    holds ``min_sequences`` full-length sequences (one group: eq. 9's G, generated together).

    Candidates are the divisors of the KV-head count up to ``gpus_per_node`` (an engine stays in
    one node). Raises PlanDoesNotFit when even the largest does not fit.
    """
    candidates = [tp for tp in range(1, gpus_per_node + 1) if arch.kv_heads % tp == 0]
    if at_least not in candidates:
        raise ValueError(f"rollout.tensor_parallel_size={at_least}: must divide {arch.name}'s {arch.kv_heads} KV heads "
                         f"and be at most --gpus-per-node {gpus_per_node}")
    candidates = [tp for tp in candidates if tp >= at_least]
    for tp in candidates:
        memory = engine_memory(
            arch, params, tp, tokens_per_sequence=tokens_per_sequence, gpu_memory_bytes=gpu_memory_bytes,
            gpu_memory_utilization=gpu_memory_utilization,
        )
        if memory.full_length_sequences >= min_sequences:
            return memory
    tp = candidates[-1]
    wider = f"raise rollout.tensor_parallel_size (at most --gpus-per-node {gpus_per_node}, a divisor of {arch.kv_heads})"
    terms = (
        MemoryTerm("weights", math.ceil(weight_bytes(params) / tp), wider),
        MemoryTerm(f"KV cache of {min_sequences} x {tokens_per_sequence} tokens",
                   math.ceil(min_sequences * kv_cache_bytes_per_sequence(arch, tokens_per_sequence) / tp),
                   "lower rollout.max_response_tokens or rollout.samples_per_prompt, or " + wider),
        MemoryTerm("workspace", 3 * GB, "raise rollout.gpu_memory_utilization"),
    )
    raise refusal("rollout", terms, gpus=f"tensor_parallel {tp}", gpu_memory_bytes=gpu_memory_bytes,
                  usable_bytes=gpu_memory_bytes * gpu_memory_utilization,
                  usable_note=f" (gpu_memory_utilization {gpu_memory_utilization})")


def choose_train_gpus(
    arch: ModelArchitecture,
    params: int,
    *,
    zero_stage: int,
    tokens_per_micro_batch: int,
    gpu_memory_bytes: int,
    usable_fraction: float,
    gpus_per_node: int,
    max_nodes: int = 64,
    logprob_chunk_tokens: int = 0,
    train_gpus: int = 0,
    precision: str = "bf16",
) -> int:
    """The fewest GPUs (whole nodes once past one node) whose per-GPU training memory fits; with
    ``train_gpus`` > 0 (``dapo deploy --train-gpus``) that count only. Raises PlanDoesNotFit.

    ``usable_fraction`` leaves room for the allocator's fragmentation and NCCL buffers.
    """
    limit = gpu_memory_bytes * usable_fraction
    if train_gpus:
        if train_gpus > gpus_per_node and train_gpus % gpus_per_node:
            raise ValueError(f"--train-gpus {train_gpus}: past one node, training takes whole nodes of "
                             f"--gpus-per-node {gpus_per_node} GPUs")
        candidates = [train_gpus]
    else:
        candidates = [g for g in (1, 2, 4) if g < gpus_per_node] + [gpus_per_node * n for n in range(1, max_nodes + 1)]
    for gpus in candidates:
        if train_bytes_per_gpu(arch, params, zero_stage, gpus, tokens_per_micro_batch, logprob_chunk_tokens,
                               precision=precision) <= limit:
            return gpus
    terms = training_terms(arch, params, zero_stage, candidates[-1], tokens_per_micro_batch, logprob_chunk_tokens,
                           precision=precision)
    raise refusal("training", terms, gpus=f"{candidates[-1]} GPU(s), ZeRO-{zero_stage}",
                  gpu_memory_bytes=gpu_memory_bytes, usable_bytes=limit)


@dataclass(frozen=True)
class ClusterPlan:
    """Resolved resources of a run on a cluster of identical GPU nodes."""

    model: str
    params: int
    gpu_memory_bytes: int
    gpus_per_node: int
    # rollout
    tokens_per_sequence: int  # prompt cap + response cap
    rollout_tensor_parallel: int
    rollout_engines: int
    rollout_gpus: int
    rollout_nodes: int
    rollout_weights_per_gpu: int
    rollout_kv_per_sequence: int
    rollout_sequences_per_engine: int  # full-length sequences whose KV cache fits at once
    # training
    zero_stage: int
    micro_batch_samples: int  # samples per forward/backward the plan assumes (may be below the config's)
    tokens_per_micro_batch: int
    train_gpus: int
    train_nodes: int
    train_nproc_per_node: int
    train_state_per_gpu: int
    train_activations_per_gpu: int
    train_total_per_gpu: int  # states + activations + the optimizer step beyond them (+ ZeRO-3 gather buffer)
    # as configured, for comparison (0 = not given)
    configured_train_processes: int
    configured_micro_batch_samples: int
    configured_rollout_engines: int
    configured_tensor_parallel: int
    logprob_chunk_tokens: int = 0  # train.logprob_chunk_tokens the activations were sized with (0 = whole sequence)
    configured_activation_checkpointing: bool | None = None  # train.activation_checkpointing (None = not given)
    precision: str = "bf16"  # train.precision the weights and activations were sized with
    train_step_beyond_activations_per_gpu: int = 0  # the "optimizer step transients" term (training_terms)
    # what each pod asks of Kubernetes (rollout: one Ray worker per node; training: one elastic pod per node)
    rollout_pod: PodRequest = PodRequest(cpus=0, memory_gib=0, gpus=0)
    train_pod: PodRequest = PodRequest(cpus=0, memory_gib=0, gpus=0)

    def warnings(self) -> list[str]:
        """Where the run config disagrees with the plan (printed by ``dapo deploy``)."""
        out = []
        if self.micro_batch_samples < self.configured_micro_batch_samples:
            out.append(
                f"train.micro_batch_samples={self.configured_micro_batch_samples} does not fit one "
                f"{self.gpu_memory_bytes / GB:.0f} GB GPU at {self.tokens_per_sequence} tokens per sample at any GPU "
                f"count; planned with {self.micro_batch_samples} (set --set train.micro_batch_samples="
                f"{self.micro_batch_samples})"
            )
        if self.configured_tensor_parallel and self.configured_tensor_parallel != self.rollout_tensor_parallel:
            out.append(
                f"rollout.tensor_parallel_size={self.configured_tensor_parallel} but a {self.tokens_per_sequence}-token "
                f"group needs {self.rollout_tensor_parallel} GPUs per engine (set --set rollout.tensor_parallel_size="
                f"{self.rollout_tensor_parallel})"
            )
        if self.configured_train_processes and self.configured_train_processes < self.train_gpus:
            out.append(
                f"train.num_processes={self.configured_train_processes} but ZeRO-{self.zero_stage} needs "
                f"{self.train_gpus} GPUs of {self.gpu_memory_bytes / GB:.0f} GB at {self.tokens_per_micro_batch} "
                "tokens per micro-batch"
            )
        if self.configured_activation_checkpointing is False:
            out.append("train.activation_checkpointing is off but the activation estimate assumes it "
                       "(set --set train.activation_checkpointing=true)")
        return out


def plan_cluster(
    arch: ModelArchitecture,
    *,
    zero_stage: int,
    micro_batch_samples: int,
    max_prompt_tokens: int,
    max_response_tokens: int,
    samples_per_prompt: int,
    gpu_memory_bytes: int = 80 * GB,
    gpus_per_node: int = 8,
    gpu_memory_utilization: float = 0.85,
    usable_fraction: float = 0.9,
    rollout_gpus: int = 0,
    train_gpus: int = 0,
    configured_train_processes: int = 0,
    configured_rollout_engines: int = 0,
    configured_tensor_parallel: int = 0,
    logprob_chunk_tokens: int = 0,
    configured_activation_checkpointing: bool | None = None,
    precision: str = "bf16",
) -> ClusterPlan:
    """GPUs per stage for a run, each sized apart: engines x tensor parallel for rollout, nodes x GPUs
    for training, and the pod requests of both. Raises PlanDoesNotFit (one line) when either cannot fit.

    Training: ``train_gpus`` (``dapo deploy --train-gpus``) when given, else the fewest that fit.
    Rollout: an engine must hold one whole group (``samples_per_prompt`` sequences, eq. 9's G) at
    the full length at once, so its tensor parallel is the configured one or the smallest larger
    one that does; ``configured_rollout_engines`` (rollout.engines) engines when given, else
    ``rollout_gpus`` worth, else as many GPUs as training (the stages run one after the other).
    """
    params = parameter_count(arch)
    tokens = max_prompt_tokens + max_response_tokens
    # Training first: its refusal names the usual fix (more GPUs, ZeRO-3) before the engine's.
    train_gpus, micro = _plan_training(
        arch, params, zero_stage=zero_stage, micro_batch_samples=micro_batch_samples, tokens=tokens,
        gpu_memory_bytes=gpu_memory_bytes, usable_fraction=usable_fraction, gpus_per_node=gpus_per_node,
        logprob_chunk_tokens=logprob_chunk_tokens, train_gpus=train_gpus, precision=precision,
    )
    mb_tokens = micro * tokens
    engine = choose_tensor_parallel(
        arch, params, min_sequences=samples_per_prompt, tokens_per_sequence=tokens,
        gpu_memory_bytes=gpu_memory_bytes, gpu_memory_utilization=gpu_memory_utilization,
        gpus_per_node=gpus_per_node, at_least=max(1, configured_tensor_parallel),
    )
    tp = engine.tensor_parallel
    engines = configured_rollout_engines or max(1, (rollout_gpus or max(train_gpus, tp)) // tp)
    engines_per_node = gpus_per_node // tp
    train_per_node = min(train_gpus, gpus_per_node)
    terms = {t.name: t.bytes for t in training_terms(arch, params, zero_stage, train_gpus, mb_tokens,
                                                     logprob_chunk_tokens, precision=precision)}
    state = sum(terms[name] for name in STATE_TERMS)
    acts = sum(size for name, size in terms.items() if name.startswith("activations"))
    return ClusterPlan(
        model=arch.name,
        params=params,
        gpu_memory_bytes=gpu_memory_bytes,
        gpus_per_node=gpus_per_node,
        tokens_per_sequence=tokens,
        rollout_tensor_parallel=tp,
        rollout_engines=engines,
        rollout_gpus=engines * tp,
        rollout_nodes=math.ceil(engines / engines_per_node),
        rollout_weights_per_gpu=engine.weights_per_gpu,
        rollout_kv_per_sequence=engine.kv_per_sequence,
        rollout_sequences_per_engine=engine.full_length_sequences,
        zero_stage=zero_stage,
        micro_batch_samples=micro,
        tokens_per_micro_batch=mb_tokens,
        train_gpus=train_gpus,
        train_nodes=math.ceil(train_gpus / gpus_per_node),
        train_nproc_per_node=train_per_node,
        train_state_per_gpu=state,
        train_activations_per_gpu=acts,
        train_total_per_gpu=sum(terms.values()),
        configured_train_processes=configured_train_processes,
        configured_micro_batch_samples=micro_batch_samples,
        configured_rollout_engines=configured_rollout_engines,
        configured_tensor_parallel=configured_tensor_parallel,
        logprob_chunk_tokens=logprob_chunk_tokens,
        configured_activation_checkpointing=configured_activation_checkpointing,
        precision=precision,
        train_step_beyond_activations_per_gpu=terms["optimizer step transients"],
        rollout_pod=pod_request(gpus=min(engines, engines_per_node) * tp, host_bytes_per_gpu=engine.weights_per_gpu),
        train_pod=pod_request(gpus=train_per_node, host_bytes_per_gpu=train_host_bytes_per_rank(params, zero_stage, train_gpus),
                              host_bytes_per_pod=weight_bytes(params)),
    )


def _plan_training(
    arch: ModelArchitecture, params: int, *, zero_stage: int, micro_batch_samples: int, tokens: int,
    gpu_memory_bytes: int, usable_fraction: float, gpus_per_node: int, logprob_chunk_tokens: int, train_gpus: int,
    precision: str,
) -> tuple[int, int]:
    """``(training GPUs, samples per micro-batch)``: the configured micro-batch, else one sample."""
    # Activations are not partitioned over GPUs (no sequence parallelism), so a micro-batch that
    # does not fit one GPU at any GPU count falls back to one sample per micro-batch (the loss is
    # the same: micro-batches only split the memory, engines/train/step.py).
    for micro in dict.fromkeys((micro_batch_samples, 1)):
        try:
            gpus = choose_train_gpus(
                arch, params, zero_stage=zero_stage, tokens_per_micro_batch=micro * tokens,
                gpu_memory_bytes=gpu_memory_bytes, usable_fraction=usable_fraction, gpus_per_node=gpus_per_node,
                logprob_chunk_tokens=logprob_chunk_tokens, train_gpus=train_gpus, precision=precision,
            )
            return gpus, micro
        except PlanDoesNotFit:
            if micro == 1:
                raise
    raise AssertionError("unreachable: the loop ends with micro = 1")


# ----------------------------------------------------------------------------- one GPU shared (a local run)

PLAN_PROMPT_TOKENS = 1024  # prompt tokens a plan assumes when rollout.max_model_len leaves them open
RANK_RUNTIME_BYTES = 1 * GB  # a training rank's CUDA context, cuBLAS workspace and NCCL buffers
ENGINE_ASLEEP_BYTES = 1 * GB  # an engine at sleep level 1: its process's CUDA context (weights and KV cache freed)
STATE_TERMS = ("weights", "gradients", "optimizer state")  # training_terms that stay on the GPU between steps


@dataclass(frozen=True)
class SharedGpuPlan:
    """Memory of one GPU that a local run's vLLM engine and a training rank share, in its two phases.

    Rollout: the engine awake (it takes ``gpu_memory_utilization`` of the card: weights + KV cache)
    beside the warm ranks' states. Training: the ranks' states and activations beside the engine
    asleep (sleep level 1) or, without sleep (``rollout.sleep_between_rounds`` off, or pipelined
    steps, whose rounds run while the ranks train), awake.
    """

    model: str
    params: int
    gpu_memory_bytes: int
    usable_bytes: int
    train_processes: int
    zero_stage: int
    engine_sleeps: bool
    gpu_memory_utilization: float
    tokens_per_sequence: int
    samples_per_prompt: int
    engine: EngineMemory  # the engine's share: weights, KV budget, full-length sequences
    rollout_terms: tuple[MemoryTerm, ...]
    train_terms: tuple[MemoryTerm, ...]
    precision: str = "bf16"  # train.precision

    @property
    def rollout_bytes(self) -> int:
        return sum(t.bytes for t in self.rollout_terms)

    @property
    def train_bytes(self) -> int:
        return sum(t.bytes for t in self.train_terms)

    @property
    def peak_bytes(self) -> int:
        return max(self.rollout_bytes, self.train_bytes)


def plan_shared_gpu(
    arch: ModelArchitecture,
    *,
    zero_stage: int,
    micro_batch_samples: int,
    tokens_per_sequence: int,
    samples_per_prompt: int,
    train_processes: int,
    gpu_memory_bytes: int,
    gpu_memory_utilization: float,
    engine_sleeps: bool,
    usable_fraction: float = 0.9,
    logprob_chunk_tokens: int = 0,
    precision: str = "bf16",
) -> SharedGpuPlan:
    """The plan of a GPU shared by the vLLM engine and one of ``train_processes`` ranks (one rank per GPU,
    the engine on the first). Raises PlanDoesNotFit (one line: the phase, its biggest term, the knob) when
    either phase exceeds the usable memory or the engine's share cannot hold its weights and one group.

    The warm ranks keep their states between steps and release their activations (engines/train/worker.py);
    vLLM refuses to start unless ``gpu_memory_utilization`` x the card is free beside them.
    """
    params = parameter_count(arch)
    usable = int(gpu_memory_bytes * usable_fraction)
    partitions = zero_stage == 3 or train_processes == 1
    states_knob = "a GPU with more memory or a smaller model" + ("" if partitions else ", or train.zero_stage=3")
    training = training_terms(arch, params, zero_stage, train_processes, micro_batch_samples * tokens_per_sequence,
                              logprob_chunk_tokens, states_knob=states_knob, precision=precision)
    runtime = MemoryTerm("training rank runtime", RANK_RUNTIME_BYTES, "none: one per rank")
    resident = (*[t for t in training if t.name in STATE_TERMS], runtime)
    awake_bytes = math.ceil(gpu_memory_utilization * gpu_memory_bytes)
    during_training = (*training, runtime)
    if engine_sleeps:
        asleep = MemoryTerm("vLLM engine asleep", ENGINE_ASLEEP_BYTES, "none: the engine's CUDA context")
        phases = {"during rollout": resident, "while training": (*during_training, asleep)}
    else:
        phases = {"during rollout": resident, "while training": during_training}
    fits = min((usable - sum(t.bytes for t in others)) / gpu_memory_bytes
               for name, others in phases.items() if name == "during rollout" or not engine_sleeps)
    engine = engine_memory(arch, params, 1, tokens_per_sequence=tokens_per_sequence, gpu_memory_bytes=gpu_memory_bytes,
                           gpu_memory_utilization=gpu_memory_utilization)
    group_bytes = samples_per_prompt * engine.kv_per_sequence
    needs = (engine.weights_per_gpu + 3 * GB + group_bytes) / gpu_memory_bytes  # engine_memory's workspace
    awake = MemoryTerm(f"vLLM engine awake (gpu_memory_utilization {gpu_memory_utilization:g})", awake_bytes,
                       _utilization_knob(needs, fits, sleep_would_help=not engine_sleeps))
    phases = {name: (*terms, awake) if name == "during rollout" or not engine_sleeps else terms
              for name, terms in phases.items()}
    _refuse_the_largest(phases, gpus=f"1 GPU shared by the vLLM engine and {train_processes} training rank(s)",
                        gpu_memory_bytes=gpu_memory_bytes, usable_bytes=usable)
    if engine.full_length_sequences < samples_per_prompt:
        more = "raise rollout.gpu_memory_utilization"
        terms = (MemoryTerm("weights", engine.weights_per_gpu, more),
                 MemoryTerm(f"KV cache of {samples_per_prompt} x {tokens_per_sequence} tokens", group_bytes,
                            more + ", or lower rollout.max_response_tokens or rollout.samples_per_prompt"),
                 MemoryTerm("workspace", 3 * GB, more))
        raise refusal("rollout engine", terms, gpus="tensor_parallel 1", gpu_memory_bytes=gpu_memory_bytes,
                      usable_bytes=awake_bytes, usable_note=f" (gpu_memory_utilization {gpu_memory_utilization:g})")
    return SharedGpuPlan(
        model=arch.name, params=params, gpu_memory_bytes=gpu_memory_bytes, usable_bytes=usable,
        train_processes=train_processes, zero_stage=zero_stage, engine_sleeps=engine_sleeps,
        gpu_memory_utilization=gpu_memory_utilization, tokens_per_sequence=tokens_per_sequence,
        samples_per_prompt=samples_per_prompt, engine=engine,
        rollout_terms=phases["during rollout"], train_terms=phases["while training"], precision=precision,
    )


def _utilization_knob(needs: float, fits: float, *, sleep_would_help: bool) -> str:
    """What to do about the awake engine: a gpu_memory_utilization range that holds its weights and a
    group and leaves the ranks room (and, when it stays awake during training, to let it sleep)."""
    low, high = math.ceil(needs * 100) / 100, math.floor(fits * 100) / 100
    if low <= high:
        knob = f"set rollout.gpu_memory_utilization between {low:.2f} and {high:.2f}"
    else:
        knob = (f"no rollout.gpu_memory_utilization holds the engine ({low:.2f} needed) beside the training ranks "
                f"({max(high, 0):.2f} left): a GPU with more memory or a smaller model")
    if sleep_would_help:
        knob = ("set rollout.sleep_between_rounds=true and run.pipelined=false (the engine then sleeps while the ranks "
                f"train), or {knob}")
    return knob


def _refuse_the_largest(phases: dict[str, tuple[MemoryTerm, ...]], *, gpus: str, gpu_memory_bytes: int,
                        usable_bytes: int) -> None:
    """Raise the refusal of the phase that needs most, when any phase exceeds ``usable_bytes``."""
    need, name = max((sum(t.bytes for t in terms), name) for name, terms in phases.items())
    if need > usable_bytes:
        raise refusal(f"shared GPU {name}", phases[name], gpus=gpus, gpu_memory_bytes=gpu_memory_bytes,
                      usable_bytes=usable_bytes)


def _terms_line(terms: tuple[MemoryTerm, ...]) -> str:
    return " + ".join(f"{t.name} {t.bytes / GB:.1f}" for t in terms)


def format_shared_plan(plan: SharedGpuPlan) -> str:
    """The shared GPU's plan, one line per phase and one for the engine (printed by ``dapo run --plan``)."""
    engine = plan.engine
    during = "engine asleep: vLLM sleep level 1" if plan.engine_sleeps else "engine awake: no sleep"
    return "\n".join([
        f"memory plan for {plan.model} ({plan.params / 1e9:.2f}B parameters) on one {plan.gpu_memory_bytes / GB:.0f} GB "
        f"GPU shared by the vLLM engine and training rank 0 of {plan.train_processes} (ZeRO-{plan.zero_stage}, "
        f"{plan.precision}), "
        f"{plan.usable_bytes / GB:.1f} GB usable:",
        f"  rollout : {plan.rollout_bytes / GB:.1f} GB = {_terms_line(plan.rollout_terms)}",
        f"  train   : {plan.train_bytes / GB:.1f} GB ({during}) = {_terms_line(plan.train_terms)}",
        f"  engine  : gpu_memory_utilization {plan.gpu_memory_utilization:g} = "
        f"{math.ceil(plan.gpu_memory_utilization * plan.gpu_memory_bytes) / GB:.1f} GB: weights "
        f"{engine.weights_per_gpu / GB:.1f} GB, KV cache {engine.kv_budget_per_engine / GB:.1f} GB = "
        f"{engine.full_length_sequences} sequences of {plan.tokens_per_sequence} tokens (a group is {plan.samples_per_prompt})",
        f"  peak    : {plan.peak_bytes / GB:.1f} GB of {plan.usable_bytes / GB:.1f} GB usable (figures: infra/sizing.py)",
    ])


# ----------------------------------------------------------------------------- tables


def _gb(value: float) -> str:
    return f"{value / GB:,.1f}"


def sizing_tables_markdown(
    arch: ModelArchitecture,
    *,
    response_tokens: int = 20480,
    prompt_tokens: int = 1024,
    gpu_memory_bytes: int = 80 * GB,
    gpu_memory_utilization: float = 0.85,
    gpu_counts: tuple[int, ...] = (8, 16, 32, 64),
    micro_batch_samples: int = 1,
    logprob_chunk_tokens: int = 4096,
) -> str:
    """Markdown tables: model memory, training memory per GPU by ZeRO stage and GPU count, engines.

    Training is sized with log-probs in chunks of ``logprob_chunk_tokens`` (the paper config's
    setting); the line above the table also gives the logits of the whole sequence at once.
    """
    params = parameter_count(arch)
    kv_token = kv_cache_bytes_per_token(arch)
    lines = [
        f"### {arch.name}: {params:,} parameters (derived from the shape; published ~{arch.nominal_params / 1e9:.1f}B)",
        "",
        "| quantity | GB |",
        "|---|---:|",
        f"| bf16 weights | {_gb(weight_bytes(params))} |",
        f"| fp32 gradients (accumulated in fp32) | {_gb(params * 4)} |",
        f"| fp32 master weights + Adam m, v | {_gb(params * 12)} |",
        f"| KV cache per token (bf16) | {kv_token / 1e6:.3f} MB |",
        f"| KV cache per sequence at {response_tokens} tokens | {_gb(kv_cache_bytes_per_sequence(arch, response_tokens))} |",
        f"| KV cache per sequence at {prompt_tokens}+{response_tokens} tokens | "
        f"{_gb(kv_cache_bytes_per_sequence(arch, prompt_tokens + response_tokens))} |",
        "",
    ]
    mb_tokens = micro_batch_samples * (prompt_tokens + response_tokens)
    acts = activation_bytes(arch, mb_tokens, logprob_chunk_tokens=logprob_chunk_tokens)
    whole = activation_bytes(arch, mb_tokens)
    lines += [
        f"Activations of one micro-batch ({micro_batch_samples} x {prompt_tokens + response_tokens} tokens, "
        f"activation checkpointing, log-probs in chunks of {logprob_chunk_tokens} tokens): layer inputs "
        f"{_gb(acts.checkpoints)} GB + one layer recomputed {_gb(acts.layer_working_set)} GB + logits "
        f"{_gb(acts.logits)} GB = {_gb(acts.total)} GB per GPU (logits of the whole sequence at once: "
        f"{_gb(whole.logits)} GB, total {_gb(whole.total)} GB).",
        "",
        f"Training memory per GPU (GB): states + activations, the optimizer step's transients beyond them "
        f"and the ZeRO-3 gather buffer; "
        f"fits = at most 90% of {_gb(gpu_memory_bytes)} GB.",
        "",
        "| ZeRO | " + " | ".join(f"{g} GPUs" for g in gpu_counts) + " |",
        "|---|" + "---:|" * len(gpu_counts),
    ]
    for stage in (1, 2, 3):
        cells = []
        for gpus in gpu_counts:
            state = training_state_bytes_per_gpu(params, stage, gpus)
            total = train_bytes_per_gpu(arch, params, stage, gpus, mb_tokens, logprob_chunk_tokens)
            fits = "fits" if total <= gpu_memory_bytes * 0.9 else "no"
            cells.append(f"{_gb(state)} + {_gb(total - state)} = {_gb(total)} ({fits})")
        lines.append(f"| {stage} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"vLLM engines on {_gb(gpu_memory_bytes)} GB GPUs at gpu_memory_utilization {gpu_memory_utilization} "
        f"(3 GB workspace per GPU), sequences of {prompt_tokens}+{response_tokens} tokens:",
        "",
        "| tensor parallel | weights per GPU (GB) | KV budget per engine (GB) | full-length sequences per engine |",
        "|---:|---:|---:|---:|",
    ]
    for tp in (tp for tp in (1, 2, 4, 8) if arch.kv_heads % tp == 0):
        m = engine_memory(
            arch, params, tp, tokens_per_sequence=prompt_tokens + response_tokens, gpu_memory_bytes=gpu_memory_bytes,
            gpu_memory_utilization=gpu_memory_utilization,
        )
        lines.append(f"| {tp} | {_gb(m.weights_per_gpu)} | {_gb(m.kv_budget_per_engine)} | {m.full_length_sequences} |")
    return "\n".join(lines) + "\n"


def _pod(pod: PodRequest) -> str:
    return f"(cpu {pod.cpus}, memory {pod.memory}, gpu {pod.gpus})"


def format_plan(plan: ClusterPlan) -> str:
    """The resolved resources, one line per stage (printed by ``dapo deploy --config``)."""
    gpu = f"{plan.gpu_memory_bytes / GB:.0f} GB GPUs"
    lines = [
        f"resolved resources for {plan.model} ({plan.params / 1e9:.2f}B parameters) on nodes of {plan.gpus_per_node} x {gpu}:",
        f"  rollout : {plan.rollout_engines} vLLM engine(s) x tensor_parallel {plan.rollout_tensor_parallel} = "
        f"{plan.rollout_gpus} GPUs on {plan.rollout_nodes} node(s) (Ray); weights {_gb(plan.rollout_weights_per_gpu)} GB/GPU, "
        f"KV {_gb(plan.rollout_kv_per_sequence)} GB per {plan.tokens_per_sequence}-token sequence, "
        f"{plan.rollout_sequences_per_engine} full-length sequences per engine",
        f"  train   : ZeRO-{plan.zero_stage}, {plan.train_gpus} GPUs = {plan.train_nodes} node(s) x {plan.train_nproc_per_node} "
        f"processes, {plan.precision}; per GPU {_gb(plan.train_state_per_gpu)} GB states + "
        f"{_gb(plan.train_activations_per_gpu)} GB activations ({plan.tokens_per_micro_batch} tokens/micro-batch"
        + (f", log-probs in chunks of {plan.logprob_chunk_tokens}" if plan.logprob_chunk_tokens else "")
        + f") + {_gb(plan.train_step_beyond_activations_per_gpu)} GB optimizer step beyond them"
        + (" + ZeRO-3 gather buffer" if plan.zero_stage == 3 else "")
        + f" = {_gb(plan.train_total_per_gpu)} GB",
        f"  pods    : rollout {plan.rollout_nodes} x {_pod(plan.rollout_pod)}; train {plan.train_nodes} x "
        f"{_pod(plan.train_pod)} (host memory from the plan: infra/sizing.py)",
        "  cpu     : curate, score/filter, batch assembly, driver (no GPU)",
    ]
    lines += [f"  warning : {w}" for w in plan.warnings()]
    return "\n".join(lines)
