"""The checkpoint hand-off between steps at cluster scale, on paper: bytes, seconds, share of a step.

Every training step publishes a checkpoint (the HF export and the DeepSpeed optimizer state) that
the next rollout and train step read back; what else a step pays depends on what stays warm
between tasks, so :func:`step_handoff` prices each path as it is built (issue 50): a) in-process
warm, b) persistent engine actors, c) open-source Flyte without a persistent cluster, d) persistent
engines and train ranks (the train host), e) the designed in-memory hand-off (modelled only), and
pipelined on b. Nothing here is measured: :class:`Bandwidth`, :class:`Throughput` and
:class:`EngineStart` are the assumptions the figures stand on, printed beside them.

Design notes (each path, the transfer formula): docs/CLUSTER.md, "Hand-off pricing (infra/handoff.py)".
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from infra.sizing import GB, ClusterPlan
from storage.retention_policy import MIRRORED_CHECKPOINTS, checkpoint_retention

SHARE_GOAL = 0.03  # the hand-off's goal: at most this share of a paper-scale step (docs/CLUSTER.md)
OPTIMIZER_BYTES_PER_PARAM = 12  # fp32 master weights + Adam m and v (ds_state/, any ZeRO stage)
EXPORT_BYTES_PER_PARAM = {"bf16": 2, "fp32": 4}  # the HF export's dtype follows train.precision


@dataclass(frozen=True)
class Bandwidth:
    """Storage and network bandwidth (bytes/s): assumptions, not measurements."""

    per_node_bytes_per_s: float = 1.25 * GB  # one node to/from the run store (~10 Gb/s: one S3/GCS client, a few streams)
    aggregate_bytes_per_s: float = 20 * GB  # the run store as a whole, every node at once
    interconnect_bytes_per_s: float = 12.5 * GB  # node to node (100 Gb/s), for a weight broadcast (path e)
    local_disk_bytes_per_s: float = 5 * GB  # one host's NVMe, written and fsynced (path a); a RAID of drives does more


@dataclass(frozen=True)
class Throughput:
    """What one step computes and how fast: assumptions, not measurements (no GPU here)."""

    generated_tokens_per_s_per_gpu: float = 750.0  # vLLM decode of a 32B model, TP 4, long sequences, per H100
    train_flops_per_s_per_gpu: float = 989e12 * 0.35  # H100 bf16 dense peak x 35% model FLOPs utilisation
    mean_response_tokens: int = 2000  # early DAPO training (responses grow to ~6000 later: fig. 7)
    mean_prompt_tokens: int = 200  # DAPO-Math-17K prompts with the template
    generation_rounds: float = 1.0  # rounds per step, one rollout call each (dynamic sampling may need more, sec. 3.2)
    flops_per_param_token: int = 10  # 2 old log-probs + 6 forward/backward + 2 activation recompute


@dataclass(frozen=True)
class EngineStart:
    """What starting an engine, a Ray cluster or a train group costs: assumptions, not measurements.

    vLLM's figures are from vllm-project/vllm issue 19824 (startup time, Llama-70B FP8 at TP 8):
    ~10 s to load the weights from a hot page cache, ~60 s for the P2P access check
    (``VLLM_SKIP_P2P_CHECK=1`` skips it), ~15 s Dynamo, ~70 s torch.compile, ~60 s CUDA graph capture.
    The paper config compiles (``rollout.enforce_eager: false``), in a fresh pod with no compile
    cache: init is taken as Dynamo + torch.compile + CUDA graphs, the P2P check skipped; with
    ``enforce_eager: true`` those 145 s drop out. The cluster and train-group figures have no public
    source: replace them with your cluster's.
    """

    engine_init_s: float = 145.0  # vLLM init apart from the weights: Dynamo 15 s + torch.compile 70 s + CUDA graphs 60 s
    load_bytes_per_s_per_gpu: float = 0.875 * GB  # weights into a GPU from the node's mirror: 70 GB / 8 GPUs in ~10 s (#19824)
    ray_cluster_start_s: float = 60.0  # a fresh RayJob: pods scheduled on nodes holding the image, Ray up (path c)
    train_group_start_s: float = 60.0  # fresh train pods: processes, NCCL rendezvous, DeepSpeed engine built (b, c)

    def load_s(self, weights_bytes: float, tensor_parallel: int) -> float:
        """Seconds for an engine to load (or reload) ``weights_bytes``: its GPUs load their shards at once."""
        if tensor_parallel < 1:
            raise ValueError(f"tensor_parallel must be >= 1, got {tensor_parallel}")
        return weights_bytes / tensor_parallel / self.load_bytes_per_s_per_gpu

    def start_s(self, weights_bytes: float, tensor_parallel: int) -> float:
        """Seconds for a fresh engine to start: init, then the weights."""
        return self.engine_init_s + self.load_s(weights_bytes, tensor_parallel)


@dataclass(frozen=True)
class Transfer:
    """One part of a hand-off: a transfer, a load or a start."""

    what: str
    bytes: int  # moved per occurrence (0 for a start)
    seconds: float  # per occurrence
    critical_s: float  # per step, on the step's critical path (times the occurrences a step, amortised when fewer)
    implemented: bool  # True: what the code does today; False: modelled design
    via_store: bool = True  # its seconds scale with the run store's bandwidth (store_bandwidth_for_share)


@dataclass(frozen=True)
class HandoffCost:
    """A hand-off's bytes per step and its share of a step."""

    name: str
    written_bytes: int  # per step, on average, to the run store (path a: to local disk)
    read_bytes: int  # per step, on average, from the run store (path a: from local disk)
    critical_path_s: float  # seconds a step waits for it
    share: float  # critical_path_s / (modelled step + critical_path_s)
    parts: tuple[Transfer, ...]


@dataclass(frozen=True)
class StepHandoff:
    """The modelled step and its hand-off on each path."""

    weights_bytes: int
    optimizer_bytes: int
    generation_s: float
    training_s: float
    step_s: float  # generation + training, without the hand-off
    in_process: HandoffCost  # a) in-process warm, one machine
    persistent_engines: HandoffCost  # b) persistent engine actors, fresh train pods
    fresh_rayjobs: HandoffCost  # c) open-source Flyte without a persistent cluster
    persistent_ranks: HandoffCost  # d) persistent engines and train ranks (the train host), publishing every step
    designed: HandoffCost  # e) the designed in-memory hand-off (modelled)
    pipelined: HandoffCost  # run.pipelined on b: b's transfers, the two lanes overlapping
    pipelined_step_s: float  # max(generation, training): a pipelined step without the hand-off
    bandwidth: Bandwidth
    throughput: Throughput
    engine_start: EngineStart
    calls_per_step: float  # rollout and evaluate task calls a step (rounds + 1 / evaluate_every_steps)
    engine_load_s: float  # an engine loads (or reloads) the weights into its GPUs
    optimizer_upload_every_steps: int
    mirror_rollout_node_bytes: int  # an engine node's mirror: the weights of the checkpoints it keeps
    mirror_train_node_bytes: int  # rank 0's node: its share of the parent's state, the output's weights and share
    train_nodes: int = 1  # the plan's; path d's train host is a group of one member per node
    # d with train.optimizer_state_every = optimizer_upload_every_steps: the warm group writes the state on
    # one step in k (a cold start replays from it: engines/train/replay.py); fresh pods (b, c) cannot.
    persistent_ranks_state_every_k: HandoffCost | None = None

    @property
    def paths(self) -> tuple[HandoffCost, HandoffCost, HandoffCost, HandoffCost, HandoffCost]:
        """``(a, b, c, d, e)``."""
        return self.in_process, self.persistent_engines, self.fresh_rayjobs, self.persistent_ranks, self.designed


@dataclass(frozen=True)
class _Terms:
    """What every path is built from, for one step of one plan: sizes, counts and primitive seconds."""

    w: int  # the export's bytes
    o: int  # the optimizer state's bytes
    train_nodes: int
    rollout_nodes: int
    engines: int
    tensor_parallel: int
    calls: float  # rollout and evaluate task calls a step
    upload_s: float  # train uploads the whole checkpoint: rank 0's node the export and its share of the state
    export_upload_s: float  # train uploads the export alone: rank 0's node
    nodes_fetch_s: float  # the engine nodes each fetch the weights
    nodes_and_head_fetch_s: float  # the engine nodes and the Ray head (a RayJob's task body) each fetch them
    host_put_s: float  # the train host reads the export back from its disk into its node's object store
    host_pull_s: float  # the engine nodes take the weights from the train host's node over the interconnect
    train_fetch_s: float  # each train node fetches its ranks' share of the parent's state
    load_s: float  # an engine loads the weights into its GPUs
    start: EngineStart


@dataclass(frozen=True)
class _Lanes:
    """A hand-off's parts by the lane they delay when rollout and training overlap (``run.pipelined``)."""

    rollout: tuple[Transfer, ...]
    train: tuple[Transfer, ...]


def checkpoint_bytes(params: int, precision: str) -> tuple[int, int]:
    """``(export bytes, optimizer-state bytes)`` of one checkpoint."""
    if precision not in EXPORT_BYTES_PER_PARAM:
        raise ValueError(f"precision {precision!r}: expected one of {sorted(EXPORT_BYTES_PER_PARAM)}")
    return params * EXPORT_BYTES_PER_PARAM[precision], params * OPTIMIZER_BYTES_PER_PARAM


def transfer_seconds(total_bytes: float, busiest_node_bytes: float, bandwidth: Bandwidth) -> float:
    """Seconds to move ``total_bytes``, ``busiest_node_bytes`` of them through one node."""
    return max(busiest_node_bytes / bandwidth.per_node_bytes_per_s, total_bytes / bandwidth.aggregate_bytes_per_s)


def _cost(name: str, parts: list[Transfer], written: float, read: float, step_s: float) -> HandoffCost:
    critical = sum(p.critical_s for p in parts)
    return HandoffCost(name, int(written), int(read), critical, critical / (step_s + critical), tuple(parts))


def _allowed_s(step_s: float, share: float) -> float:
    """Seconds of hand-off that make ``share`` of a step of ``step_s``: critical / (step + critical) == share."""
    if not 0.0 < share < 1.0:
        raise ValueError(f"share must lie in (0, 1), got {share}")
    return share * step_s / (1.0 - share)


def fixed_seconds(cost: HandoffCost) -> float:
    """Seconds a step waits for ``cost``'s parts that no store bandwidth shortens (starts, loads, local disk)."""
    return sum(p.critical_s for p in cost.parts if not p.via_store)


def store_bandwidth_for_share(cost: HandoffCost, step_s: float, bandwidth: Bandwidth, share: float) -> Bandwidth | None:
    """The run store's bandwidth at which ``cost`` takes ``share`` of a step of ``step_s`` seconds:
    ``bandwidth`` with its per-node and aggregate figures scaled by one factor; None when no store is
    fast enough, the parts that do not go through it (starts, loads) alone taking more.

    Exact for a hand-off whose store parts are whole transfers (paths b and c): each takes
    ``max(busiest node / per node, all / aggregate)``, so its seconds scale with 1 / the factor.
    """
    allowed_s = _allowed_s(step_s, share)
    fixed_s = fixed_seconds(cost)
    store_s = cost.critical_path_s - fixed_s
    if store_s <= 0.0:
        raise ValueError(f"{cost.name}: none of it goes through the store")
    if fixed_s >= allowed_s:
        return None
    factor = store_s / (allowed_s - fixed_s)
    return dataclasses.replace(bandwidth, per_node_bytes_per_s=bandwidth.per_node_bytes_per_s * factor,
                               aggregate_bytes_per_s=bandwidth.aggregate_bytes_per_s * factor)


def calls_per_step(generation_rounds: float, evaluate_every_steps: int) -> float:
    """Rollout and evaluate task calls a step: one per generation round, one per evaluation."""
    return generation_rounds + (1.0 / evaluate_every_steps if evaluate_every_steps else 0.0)


def _check_inputs(throughput: Throughput, optimizer_upload_every_steps: int, evaluate_every_steps: int) -> None:
    if optimizer_upload_every_steps < 1:
        raise ValueError(f"optimizer_upload_every_steps must be >= 1, got {optimizer_upload_every_steps}")
    if evaluate_every_steps < 0:
        raise ValueError(f"evaluate_every_steps must be >= 0 (0 = no evaluations priced), got {evaluate_every_steps}")
    if throughput.generation_rounds < 1.0:
        raise ValueError(f"generation_rounds must be >= 1 (a step generates at least once), got "
                         f"{throughput.generation_rounds}")


def step_handoff(
    plan: ClusterPlan,
    *,
    prompts_per_step: int,
    prompts_per_round: int,
    samples_per_prompt: int,
    precision: str,
    bandwidth: Bandwidth = Bandwidth(),
    throughput: Throughput = Throughput(),
    engine_start: EngineStart = EngineStart(),
    optimizer_upload_every_steps: int = 10,
    evaluate_every_steps: int = 0,
) -> StepHandoff:
    """Bytes and seconds of the hand-off on each path (a-e, and pipelined on b) for one step of ``plan``.

    ``evaluate_every_steps`` is ``run.eval_every_steps`` (0: no evaluate calls priced): an evaluate
    call, like a rollout call, starts the engines on path c and fetches the policy on path b.
    """
    _check_inputs(throughput, optimizer_upload_every_steps, evaluate_every_steps)
    t, bw, k = throughput, bandwidth, optimizer_upload_every_steps
    w, o = checkpoint_bytes(plan.params, precision)
    generated = t.generation_rounds * prompts_per_round * samples_per_prompt * t.mean_response_tokens
    generation_s = generated / (plan.rollout_gpus * t.generated_tokens_per_s_per_gpu)
    trained = prompts_per_step * samples_per_prompt * (t.mean_prompt_tokens + t.mean_response_tokens)
    training_s = t.flops_per_param_token * plan.params * trained / (plan.train_gpus * t.train_flops_per_s_per_gpu)
    step_s = generation_s + training_s
    tn, rn, tp = plan.train_nodes, plan.rollout_nodes, plan.rollout_tensor_parallel
    terms = _Terms(
        w, o, tn, rn, plan.rollout_engines, tp, calls_per_step(t.generation_rounds, evaluate_every_steps),
        upload_s=transfer_seconds(w + o, w + o / tn, bw), export_upload_s=transfer_seconds(w, w, bw),
        nodes_fetch_s=transfer_seconds(rn * w, w, bw), nodes_and_head_fetch_s=transfer_seconds((rn + 1) * w, w, bw),
        host_put_s=w / bw.local_disk_bytes_per_s, host_pull_s=rn * w / bw.interconnect_bytes_per_s,
        train_fetch_s=transfer_seconds(o, o / tn, bw),
        load_s=engine_start.load_s(w, tp), start=engine_start,
    )
    lanes = _lanes_b(terms)
    b = _cost("b) persistent engine actors, fresh train pods (as built with a persistent Ray cluster)",
              [*lanes.rollout, *lanes.train], w + o, rn * w + o, step_s)
    pipelined, pipelined_step_s = _pipelined(_overlapped(lanes, terms, bw), b, generation_s, training_s)
    # Disk for the mirrors of an object-store run (as implemented): engine nodes keep the weights of
    # their latest checkpoints; a train pod holds the parent it fetched and the checkpoint it writes.
    mirror_rollout, mirror_train = MIRRORED_CHECKPOINTS * w, o // tn + (w + o // tn)
    return StepHandoff(
        w, o, generation_s, training_s, step_s, _path_a(terms, bw, step_s), b, _path_c(terms, lanes, step_s),
        _path_d(terms, step_s), _path_e(terms, bw, generation_s, k, step_s), pipelined, pipelined_step_s, bw,
        t, engine_start, terms.calls,
        terms.load_s, k,
        mirror_rollout, mirror_train, tn, persistent_ranks_state_every_k=_path_d(terms, step_s, k),
    )


def _reload(terms: _Terms, critical_s: float, what: str = "reload them", implemented: bool = True) -> Transfer:
    return Transfer(f"rollout: {terms.engines} warm engine(s) {what} ({terms.w / terms.tensor_parallel / GB:,.1f} GB "
                    "per GPU)", terms.w, terms.load_s, critical_s, implemented, via_store=False)


def _path_a(terms: _Terms, bw: Bandwidth, step_s: float) -> HandoffCost:
    """In-process warm on one machine: the whole checkpoint to local disk, the engines reload the weights."""
    write_s = (terms.w + terms.o) / bw.local_disk_bytes_per_s
    return _cost("a) in-process warm, one machine (as built: dapo run)", [
        Transfer("train: the warm group writes the whole checkpoint (export + ds_state) to local disk, fsynced, "
                 "before the step returns", terms.w + terms.o, write_s, write_s, True, via_store=False),
        _reload(terms, terms.load_s, "reload the weights from it"),
    ], terms.w + terms.o, terms.w, step_s)


def _train_upload(terms: _Terms, who: str = "") -> Transfer:
    """The train step publishes its checkpoint whole before it returns (engines/train/publish.py, storage/outputs.py)."""
    return Transfer(f"train: {who}rank 0's node uploads the export, every node its ranks' ds_state shards",
                    terms.w + terms.o, terms.upload_s, terms.upload_s, True)


def _train_fresh_pods(terms: _Terms) -> tuple[Transfer, ...]:
    """Training in fresh pods every step (paths b and c): start, fetch the parent's state, upload the output."""
    tn, o = terms.train_nodes, terms.o
    group_s = terms.start.train_group_start_s
    return (
        Transfer(f"train: {tn} fresh pod(s) start the DeepSpeed group", 0, group_s, group_s, True, via_store=False),
        Transfer(f"train: {tn} node(s) fetch their ranks' 1/{tn} of the parent's optimizer state (not its weights: "
                 "the state restores them)", o, terms.train_fetch_s, terms.train_fetch_s, True),
        _train_upload(terms),
    )


def _lanes_b(terms: _Terms) -> _Lanes:
    """Persistent engines: the new weights fetched by the engine nodes and reloaded once a step (a task body
    reads the config and tokenizer alone: engines/rollout/stage.py); fresh train pods."""
    rn, w = terms.rollout_nodes, terms.w
    rollout = (
        Transfer(f"rollout: {rn} engine node(s) fetch the weights, once a step (no optimizer state; each task body "
                 "reads the config and tokenizer alone)", rn * w, terms.nodes_fetch_s, terms.nodes_fetch_s, True),
        _reload(terms, terms.load_s),
    )
    return _Lanes(rollout, _train_fresh_pods(terms))


def _path_c(terms: _Terms, lanes: _Lanes, step_s: float) -> HandoffCost:
    """A fresh RayJob every rollout/evaluate call: its pods start, fetch the weights, start every engine."""
    rn, w, calls, start = terms.rollout_nodes, terms.w, terms.calls, terms.start
    per_call = [
        Transfer(f"rollout/evaluate: a fresh RayJob per call ({calls:g} a step): its head and {rn} worker pod(s) "
                 "start, Ray up", 0, start.ray_cluster_start_s, calls * start.ray_cluster_start_s, True,
                 via_store=False),
        Transfer(f"rollout/evaluate: per call, {rn} engine node(s) and the Ray head fetch the weights into empty "
                 "mirrors", (rn + 1) * w, terms.nodes_and_head_fetch_s, calls * terms.nodes_and_head_fetch_s, True),
        Transfer(f"rollout/evaluate: per call, {terms.engines} engine(s) start: vLLM init", 0, start.engine_init_s,
                 calls * start.engine_init_s, True, via_store=False),
        Transfer(f"rollout/evaluate: per call, the engines load the weights ({w / terms.tensor_parallel / GB:,.1f} GB "
                 "per GPU)", w, terms.load_s, calls * terms.load_s, True, via_store=False),
    ]
    name = "c) open-source Flyte, no persistent cluster: a fresh RayJob per rollout/evaluate call (as built)"
    return _cost(name, [*per_call, *lanes.train], w + terms.o, calls * (rn + 1) * w + terms.o, step_s)


def _path_d(terms: _Terms, step_s: float, state_every: int = 1) -> HandoffCost:
    """Persistent engines and train ranks as built (engines/train/ray_host.py): the warm group neither
    starts nor fetches the parent (it holds the state, and the parent is in its node's mirror, published
    from there), and still publishes every step before the step returns (the code publishes nothing in the
    background). The engines take the new weights from the host's memory (engines/rollout/host_weights.py):
    the host reads the export back into its node's object store before the step returns, the engine nodes
    pull it over the interconnect, nothing is read from the store. ``state_every``
    (train.optimizer_state_every): the optimizer state is in that publish on one step in so many."""
    w, o, k, rn = terms.w, terms.o, state_every, terms.rollout_nodes
    rollout = [
        Transfer("train: the train host reads the export back from its disk into its node's Ray object store "
                 "before the step returns", w, terms.host_put_s, terms.host_put_s, True, via_store=False),
        Transfer(f"rollout: {rn} engine node(s) take the weights from the train host's node over the interconnect "
                 "(Ray's object store), once a step", rn * w, terms.host_pull_s, terms.host_pull_s, True,
                 via_store=False),
        _reload(terms, terms.load_s, "take them from memory"),
    ]
    name = "d) persistent engines and train ranks (as built with a persistent Ray cluster and the train host)"
    upload = _train_upload(terms, "the warm group publishes every step before it returns: ")
    if k > 1:
        name = f"d) with train.optimizer_state_every={k} (as built: `dapo run` with the train host)"
        # The export every step; the state's shards with it on one step in k.
        critical = terms.export_upload_s + (terms.upload_s - terms.export_upload_s) / k
        upload = dataclasses.replace(upload, what=f"{upload.what} on one step in {k}, the export alone on the others",
                                     critical_s=critical)
    return _cost(name, [*rollout, upload], w + o // k, 0, step_s)


def _background(upload_s: float, window_s: float) -> float:
    """Seconds an upload started with the next rollout adds to the step: what it takes beyond the rollout."""
    return max(0.0, upload_s - window_s)


def _path_e(terms: _Terms, bw: Bandwidth, generation_s: float, k: int, step_s: float) -> HandoffCost:
    """The designed in-memory hand-off (modelled, not built): the weights broadcast from the train ranks to
    the engines over the interconnect, the checkpoint published for lineage and resume in the background
    during the next rollout (the export every step, each train node its share; the optimizer state every
    k steps), so only what those uploads take beyond the rollout waits."""
    tn, rn, w, o = terms.train_nodes, terms.rollout_nodes, terms.w, terms.o
    broadcast = w / bw.interconnect_bytes_per_s  # a pipelined broadcast: every link carries the weights once
    export = transfer_seconds(w, w / tn, bw)
    state_upload = transfer_seconds(o, o / tn, bw)
    export_wait = _background(export, generation_s)
    state_wait = (_background(export + state_upload, generation_s) - export_wait) / k  # on one step in k
    return _cost("e) designed (modelled): persistent engines and train ranks, weights handed over in memory", [
        Transfer(f"train -> rollout: rank 0's node broadcasts the weights to {rn} engine node(s) over the interconnect "
                 "(NCCL), in memory", rn * w, broadcast, broadcast, False, via_store=False),
        _reload(terms, terms.load_s, "take them from memory", implemented=False),
        Transfer(f"train: each of {tn} node(s) uploads 1/{tn} of the export in the background during the next rollout",
                 w, export, export_wait, False),
        Transfer(f"train: optimizer state kept in the warm ranks' memory, uploaded every {k} steps in the "
                 "background during the next rollout, after the export", o, state_upload, state_wait, False),
    ], w + o // k, 0, step_s)


def _overlapped(lanes: _Lanes, terms: _Terms, bw: Bandwidth) -> _Lanes:
    """``lanes`` when both lanes fetch at the start of a step: the rollout's first fetch is priced with the
    train nodes' fetch of the optimizer state beside it in the store's aggregate bandwidth."""
    fetch, *rest = lanes.rollout
    seconds = max(fetch.seconds, (fetch.bytes + terms.o) / bw.aggregate_bytes_per_s)
    return _Lanes((dataclasses.replace(fetch, seconds=seconds, critical_s=seconds), *rest), lanes.train)


def _charged(parts: tuple[Transfer, ...], excess_s: float) -> list[Transfer]:
    """``parts`` carrying ``excess_s`` between them, each in proportion to its seconds a step."""
    lane_s = sum(p.critical_s for p in parts)
    return [dataclasses.replace(p, critical_s=p.critical_s * excess_s / lane_s if lane_s > 0 else 0.0) for p in parts]


def _pipelined(lanes: _Lanes, b: HandoffCost, generation_s: float, training_s: float) -> tuple[HandoffCost, float]:
    """Path b's transfers when step N+1's rollout runs beside step N's training (``run.pipelined``).

    A step lasts ``max(rollout lane, train lane)``: the rollout lane fetches and reloads the weights
    of the policy after step N-1 and generates; the train lane starts, fetches the parent, trains and
    uploads. The hand-off's share is what the longer lane adds beyond ``max(generation, training)``,
    charged to that lane's parts.
    """
    base = max(generation_s, training_s)
    rollout_excess = max(0.0, generation_s + sum(p.critical_s for p in lanes.rollout) - base)
    train_excess = max(0.0, training_s + sum(p.critical_s for p in lanes.train) - base)
    rollout_waits = rollout_excess >= train_excess
    critical = max(rollout_excess, train_excess)
    parts = [*_charged(lanes.rollout, critical if rollout_waits else 0.0),
             *_charged(lanes.train, 0.0 if rollout_waits else critical)]
    return _cost("pipelined on b (run.pipelined: true)", parts, b.written_bytes, b.read_bytes, base), base


def run_storage_bytes(steps: int, weights_bytes: int, optimizer_bytes: int, *, keep_optimizer_last: int,
                      keep_weights_every: int, optimizer_state_every: int = 1) -> int:
    """Checkpoint bytes a finished ``steps``-step run keeps under a retention policy
    (storage/retention_policy.py; 0, 0 = keep all). Step 0 (the imported policy) has no optimizer state,
    nor has a step not divisible by ``optimizer_state_every`` (train.optimizer_state_every: never written)."""
    plan = checkpoint_retention(range(steps + 1), latest=steps, keep_optimizer_last=keep_optimizer_last,
                                keep_weights_every=keep_weights_every, optimizer_state_every=optimizer_state_every)
    return sum(weights_bytes * keep.weights
               + optimizer_bytes * (keep.optimizer_state and step > 0 and step % optimizer_state_every == 0)
               for step, keep in plan.items())


RETENTION_EXAMPLES = ((0, 0), (1, 0), (2, 50), (2, 20), (2, 10))  # (K, M) rows of the docs' table


def retention_table_markdown(weights_bytes: int, optimizer_bytes: int, *, steps: int = 1000,
                             policies: tuple[tuple[int, int], ...] = RETENTION_EXAMPLES) -> str:
    """Markdown table: checkpoint storage of a finished ``steps``-step run per retention policy (docs/CLUSTER.md)."""
    lines = [
        f"| run.keep_optimizer_checkpoints | run.keep_weights_every_steps | kept whole | weights only (step 0 included) | "
        f"storage after {steps:,} steps (TB) |",
        "|---:|---:|---:|---:|---:|",
    ]
    for k, m in policies:
        plan = checkpoint_retention(range(steps + 1), latest=steps, keep_optimizer_last=k, keep_weights_every=m)
        whole = sum(1 for step, keep in plan.items() if keep.optimizer_state and step > 0)
        weights_only = sum(1 for step, keep in plan.items() if keep.weights and not (keep.optimizer_state and step > 0))
        total = run_storage_bytes(steps, weights_bytes, optimizer_bytes, keep_optimizer_last=k, keep_weights_every=m)
        lines.append(f"| {k} | {m} | {whole} | {weights_only} | {total / 1e12:,.1f} |")
    return "\n".join(lines) + "\n"


def _assumption_lines(h: StepHandoff) -> list[str]:
    bw, t, s = h.bandwidth, h.throughput, h.engine_start
    return [
        f"  hand-off: checkpoint = {h.weights_bytes / GB:,.1f} GB weights + {h.optimizer_bytes / GB:,.1f} GB optimizer "
        f"state; modelled step {h.step_s:,.0f} s = generation {h.generation_s:,.0f} s + training {h.training_s:,.0f} s",
        f"            (assumed: {t.generated_tokens_per_s_per_gpu:,.0f} generated tok/s per GPU, "
        f"{t.train_flops_per_s_per_gpu / 1e12:,.0f} TFLOP/s per GPU, {t.mean_response_tokens} response tokens, "
        f"{t.generation_rounds:g} round(s); store {bw.per_node_bytes_per_s / GB:g} GB/s per node, "
        f"{bw.aggregate_bytes_per_s / GB:g} GB/s aggregate; local disk {bw.local_disk_bytes_per_s / GB:g} GB/s; "
        f"node to node {bw.interconnect_bytes_per_s / GB:g} GB/s)",
        f"            (assumed starts: vLLM init {s.engine_init_s:g} s + the weights at "
        f"{s.load_bytes_per_s_per_gpu / GB:g} GB/s per GPU ({h.engine_load_s:,.1f} s); a fresh RayJob's pods "
        f"{s.ray_cluster_start_s:g} s; fresh train pods {s.train_group_start_s:g} s; {h.calls_per_step:g} "
        "rollout/evaluate call(s) a step)",
        "            (assumed for e, designed: a pipelined broadcast, every link carrying the weights once at the node "
        "to node rate; the engines take them into their GPUs at the load rate above)",
    ]


def _part_line(p: Transfer) -> str:
    size = f"{p.bytes / GB:,.1f} GB, " if p.via_store else ""
    extra = "" if math.isclose(p.critical_s, p.seconds) else f" ({p.critical_s:,.0f} s per step on the critical path)"
    return f"      - {p.what}: {size}{p.seconds:,.0f} s{extra}"


def _bandwidth_line(cost: HandoffCost, h: StepHandoff) -> str:
    need = store_bandwidth_for_share(cost, h.step_s, h.bandwidth, SHARE_GOAL)
    if need is None:
        return (f"      no store bandwidth reaches {SHARE_GOAL:.0%}: its starts and loads alone take "
                f"{fixed_seconds(cost):,.0f} s, more than the {_allowed_s(h.step_s, SHARE_GOAL):,.0f} s "
                f"{SHARE_GOAL:.0%} of a step allows")
    return (f"      reaches {SHARE_GOAL:.0%} of a step at {need.per_node_bytes_per_s / GB:,.1f} GB/s per node "
            f"({need.per_node_bytes_per_s * 8 / GB:,.0f} Gb/s) and {need.aggregate_bytes_per_s / GB:,.0f} GB/s "
            f"aggregate: {need.per_node_bytes_per_s / h.bandwidth.per_node_bytes_per_s:,.1f}x the assumed store bandwidth")


def format_handoff(h: StepHandoff) -> str:
    """Lines for ``dapo deploy --dry-run --config``: the hand-off per step on each path, with its assumptions."""
    lines = _assumption_lines(h)
    for cost in (*h.paths[:4], *filter(None, [h.persistent_ranks_state_every_k]), *h.paths[4:], h.pipelined):
        step = "a step" if cost is not h.pipelined else (
            f"a pipelined step (max(generation, training) = {h.pipelined_step_s:,.0f} s)")
        lines.append(f"    {cost.name}: {cost.written_bytes / GB:,.1f} GB written, {cost.read_bytes / GB:,.1f} GB read "
                     f"per step; {cost.critical_path_s:,.0f} s on the critical path = {cost.share:.1%} of {step}")
        lines += [_part_line(p) for p in cost.parts]
        if cost in (h.persistent_engines, h.fresh_rayjobs, h.persistent_ranks, h.persistent_ranks_state_every_k):
            lines.append(_bandwidth_line(cost, h))
        if cost is h.persistent_ranks_state_every_k:
            lines.append(f"      a cold start (the group lost) first replays up to {h.optimizer_upload_every_steps - 1} "
                         "steps from the last written state (engines/train/replay.py); the deployed train task "
                         "(fresh pods, b and c) refuses this setting")
        if cost is h.persistent_ranks and h.train_nodes > 1:
            lines.append(f"      priced with the plan's {h.train_nodes} train nodes each publishing its share: the train "
                         "host as built is a group of one member per node (engines/train/node_group.py)")
    lines.append(f"    mirror disk (DAPO_MIRROR_DIR) per node: rollout {h.mirror_rollout_node_bytes / GB:,.1f} GB "
                 f"(the weights of its last {MIRRORED_CHECKPOINTS} checkpoints), train {h.mirror_train_node_bytes / GB:,.1f} "
                 "GB (its ranks' share of the parent's optimizer state, and the step's output: the weights and its "
                 "ranks' share of the state)")
    return "\n".join(lines)


__all__ = ["Bandwidth", "EngineStart", "HandoffCost", "StepHandoff", "Throughput", "Transfer", "calls_per_step",
           "checkpoint_bytes", "fixed_seconds", "format_handoff", "retention_table_markdown", "run_storage_bytes",
           "step_handoff", "store_bandwidth_for_share", "transfer_seconds"]
