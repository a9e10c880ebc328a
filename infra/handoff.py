"""The checkpoint hand-off between steps at cluster scale, on paper: bytes, seconds, share of a step.

Every training step publishes a checkpoint (storage/checkpoints.py): the HF export (bf16 weights
under ``train.precision: bf16``) written by rank 0's node, plus ``ds_state/``, the DeepSpeed
optimizer state (fp32 master weights + Adam m, v: 12 bytes per parameter; ZeRO 1-3 all partition
it, so each rank writes 1/ranks of it). The next rollout and the next train step read it back.
Pure arithmetic over a :class:`~infra.sizing.ClusterPlan` and stated assumptions (stdlib only):

- :class:`Bandwidth`: per node to/from the run store, the store in aggregate, node to node;
- :class:`Throughput`: generation tokens/s per rollout GPU, training FLOP/s per GPU, response
  lengths. Neither is measured here (no GPU, no cluster): they are the assumptions the figures
  stand on, printed beside them, and parameters to replace with a real cluster's numbers.

Three hand-offs are priced (:func:`step_handoff`):

- **naive**, as implemented today on an object store (engines/train/rank.py, engines/rollout/stage.py,
  storage/run_store.py: ``fetch``): train uploads the whole checkpoint; every rollout node and the
  Ray head (the task body) fetch its weights, config and tokenizer, not the optimizer state
  (``storage.checkpoints.fetch_policy``); every train node of the next step (fresh pods) fetches
  its own ranks' partitions of the parent's optimizer state, not the weights, which that state
  restores (engines/train/rank.py, engines/train/engine.py: ``load_policy``). All of it lies on
  the step's critical path (the driver runs rollout and train one after the other).
- **designed**, modelled only: the optimizer state stays in the warm train ranks' memory between
  steps (engines/train/server.py does this within one process; on a cluster it needs train pods
  that outlive a step) and goes to the store every ``optimizer_upload_every_steps`` steps in the
  background, overlapping the next rollout (the train GPUs are idle then); each train node
  uploads its share of the bf16 export; rollout nodes fetch the weights only (this part is built,
  and the naive hand-off does it too). A cold start (after a failure) reads the optimizer state
  once, not every step.

- **pipelined**, as implemented with ``run.pipelined: true`` (workflows/step_loop.py): the same
  transfers as the naive hand-off, but step N+1's rollout (from the policy after step N-1) runs
  while step N trains, so a step lasts as long as the longer of two lanes, the rollout lane
  (fetch the weights, generate) and the train lane (fetch the parent, train, upload), instead of
  their sum. Only what a lane adds beyond ``max(generation, training)`` waits. Not the default:
  on the tiny task it learns 3.2 points less per step over 5 seeds (benchmarks/RESULTS.md,
  "Pipelined against synchronous steps"), its samples being one step stale.

A transfer takes ``max(busiest node's bytes / per-node bandwidth, all bytes / aggregate)``.
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
    interconnect_bytes_per_s: float = 12.5 * GB  # node to node (100 Gb/s), for a weight broadcast


@dataclass(frozen=True)
class Throughput:
    """What one step computes and how fast: assumptions, not measurements (no GPU here)."""

    generated_tokens_per_s_per_gpu: float = 750.0  # vLLM decode of a 32B model, TP 4, long sequences, per H100
    train_flops_per_s_per_gpu: float = 989e12 * 0.35  # H100 bf16 dense peak x 35% model FLOPs utilisation
    mean_response_tokens: int = 2000  # early DAPO training (responses grow to ~6000 later: fig. 7)
    mean_prompt_tokens: int = 200  # DAPO-Math-17K prompts with the template
    generation_rounds: float = 1.0  # rounds per step (dynamic sampling may need more, sec. 3.2)
    flops_per_param_token: int = 10  # 2 old log-probs + 6 forward/backward + 2 activation recompute


@dataclass(frozen=True)
class Transfer:
    """One part of a hand-off."""

    what: str
    bytes: int  # moved per occurrence
    seconds: float  # per occurrence
    critical_s: float  # per step, on the step's critical path (amortised when not every step)
    implemented: bool  # True: what the code does today; False: modelled design


@dataclass(frozen=True)
class HandoffCost:
    """A hand-off's bytes per step and its share of a step."""

    name: str
    written_bytes: int  # per step, on average
    read_bytes: int  # per step, on average
    critical_path_s: float  # seconds a step waits for it
    share: float  # critical_path_s / (modelled step + critical_path_s)
    parts: tuple[Transfer, ...]


@dataclass(frozen=True)
class StepHandoff:
    """The modelled step and its three hand-offs."""

    weights_bytes: int
    optimizer_bytes: int
    generation_s: float
    training_s: float
    step_s: float  # generation + training, without the hand-off
    naive: HandoffCost
    designed: HandoffCost
    pipelined: HandoffCost  # run.pipelined: the naive transfers, the two lanes overlapping
    pipelined_step_s: float  # max(generation, training): a pipelined step without the hand-off
    bandwidth: Bandwidth
    throughput: Throughput
    optimizer_upload_every_steps: int
    mirror_rollout_node_bytes: int  # an engine node's mirror: the weights of the checkpoints it keeps
    mirror_train_node_bytes: int  # rank 0's node: its share of the parent's state, the output's weights and share


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


def store_bandwidth_for_share(cost: HandoffCost, step_s: float, bandwidth: Bandwidth, share: float) -> Bandwidth:
    """The run store's bandwidth at which ``cost`` takes ``share`` of a step of ``step_s`` seconds:
    ``bandwidth`` with its per-node and aggregate figures scaled by one factor.

    Exact for a hand-off whose critical path is store transfers in full (the naive one): each takes
    ``max(busiest node / per node, all / aggregate)``, so its seconds scale with 1 / the factor.
    """
    if not 0.0 < share < 1.0:
        raise ValueError(f"share must lie in (0, 1), got {share}")
    allowed_s = share * step_s / (1.0 - share)  # critical / (step + critical) == share
    factor = cost.critical_path_s / allowed_s
    return dataclasses.replace(bandwidth, per_node_bytes_per_s=bandwidth.per_node_bytes_per_s * factor,
                               aggregate_bytes_per_s=bandwidth.aggregate_bytes_per_s * factor)


def step_handoff(
    plan: ClusterPlan,
    *,
    prompts_per_step: int,
    prompts_per_round: int,
    samples_per_prompt: int,
    precision: str,
    bandwidth: Bandwidth = Bandwidth(),
    throughput: Throughput = Throughput(),
    optimizer_upload_every_steps: int = 10,
) -> StepHandoff:
    """Bytes and seconds of the naive and the designed hand-off for one step of ``plan``."""
    if optimizer_upload_every_steps < 1:
        raise ValueError(f"optimizer_upload_every_steps must be >= 1, got {optimizer_upload_every_steps}")
    t, bw, k = throughput, bandwidth, optimizer_upload_every_steps
    w, o = checkpoint_bytes(plan.params, precision)
    whole = w + o
    generated = t.generation_rounds * prompts_per_round * samples_per_prompt * t.mean_response_tokens
    generation_s = generated / (plan.rollout_gpus * t.generated_tokens_per_s_per_gpu)
    trained = prompts_per_step * samples_per_prompt * (t.mean_prompt_tokens + t.mean_response_tokens)
    training_s = t.flops_per_param_token * plan.params * trained / (plan.train_gpus * t.train_flops_per_s_per_gpu)
    step_s = generation_s + training_s
    tn, rn = plan.train_nodes, plan.rollout_nodes

    upload = transfer_seconds(whole, w + o / tn, bw)
    rollout_fetch = transfer_seconds((rn + 1) * w, w, bw)
    train_fetch = transfer_seconds(o, o / tn, bw)
    naive = _cost("naive (as implemented)", [
        Transfer("train: rank 0's node uploads the export, every node its ranks' ds_state shards", whole, upload,
                 upload, True),
        Transfer(f"rollout: {rn} engine node(s) + the Ray head each fetch the weights (no optimizer state)",
                 (rn + 1) * w, rollout_fetch, rollout_fetch, True),
        Transfer(f"train: {tn} node(s) of the next step (fresh pods) each fetch their ranks' 1/{tn} of the "
                 "parent's optimizer state (not its weights: the state restores them)", o, train_fetch, train_fetch,
                 True),
    ], whole, (rn + 1) * w + o, step_s)

    export = transfer_seconds(w, w / tn, bw)
    weights_fetch = transfer_seconds(rn * w, w, bw)
    state_upload = transfer_seconds(o, o / tn, bw)
    designed = _cost("designed (modelled)", [
        Transfer(f"train: each of {tn} node(s) uploads 1/{tn} of the bf16 export", w, export, export, False),
        Transfer(f"rollout: {rn} engine node(s) fetch the weights only", rn * w, weights_fetch, weights_fetch, True),
        Transfer(f"train: optimizer state kept in the warm ranks' memory, uploaded every {k} steps in the "
                 "background during the next rollout", o, state_upload, max(0.0, state_upload - generation_s) / k,
                 False),
    ], w + o // k, rn * w, step_s)
    pipelined, pipelined_step_s = _pipelined(naive, generation_s, training_s, bandwidth=bw)
    # Disk for the mirrors of an object-store run (as implemented): engine nodes keep the weights of
    # their latest checkpoints; a train pod holds the parent it fetched and the checkpoint it writes.
    mirror_rollout, mirror_train = MIRRORED_CHECKPOINTS * w, o // tn + (w + o // tn)
    return StepHandoff(w, o, generation_s, training_s, step_s, naive, designed, pipelined, pipelined_step_s, bw, t, k,
                       mirror_rollout, mirror_train)


def _pipelined(naive: HandoffCost, generation_s: float, training_s: float, *,
               bandwidth: Bandwidth) -> tuple[HandoffCost, float]:
    """The naive transfers when step N+1's rollout runs beside step N's training (``run.pipelined``).

    A step lasts ``max(rollout lane, train lane)``: the rollout lane fetches the weights of the
    policy after step N-1 and generates; the train lane fetches the parent, trains and uploads. The
    hand-off's share is what the longer lane adds beyond ``max(generation, training)``, charged to
    that lane's transfers. Both lanes fetch at the start of a step: the rollout fetch is priced with
    the train fetch's bytes beside it in the store's aggregate bandwidth.
    """
    upload, rollout, train_fetch = naive.parts  # as step_handoff lists them
    rollout_s = max(rollout.seconds, (rollout.bytes + train_fetch.bytes) / bandwidth.aggregate_bytes_per_s)
    base = max(generation_s, training_s)
    rollout_excess = max(0.0, generation_s + rollout_s - base)
    train_excess = max(0.0, train_fetch.seconds + training_s + upload.seconds - base)
    critical = max(rollout_excess, train_excess)
    train_share = 0.0 if rollout_excess >= train_excess else critical / (train_fetch.seconds + upload.seconds)
    parts = [
        dataclasses.replace(upload, critical_s=upload.seconds * train_share),
        dataclasses.replace(rollout, seconds=rollout_s, critical_s=critical if rollout_excess >= train_excess else 0.0),
        dataclasses.replace(train_fetch, critical_s=train_fetch.seconds * train_share),
    ]
    return _cost("pipelined (as implemented, run.pipelined: true)", parts, naive.written_bytes, naive.read_bytes,
                 base), base


def run_storage_bytes(steps: int, weights_bytes: int, optimizer_bytes: int, *, keep_optimizer_last: int,
                      keep_weights_every: int) -> int:
    """Checkpoint bytes a finished ``steps``-step run keeps under a retention policy
    (storage/retention_policy.py; 0, 0 = keep all). Step 0 (the imported policy) has no optimizer state."""
    plan = checkpoint_retention(range(steps + 1), latest=steps, keep_optimizer_last=keep_optimizer_last,
                                keep_weights_every=keep_weights_every)
    return sum(weights_bytes * keep.weights + optimizer_bytes * (keep.optimizer_state and step > 0)
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


def format_handoff(h: StepHandoff) -> str:
    """Lines for ``dapo deploy --dry-run --config``: the hand-off per step, naive, designed and pipelined."""
    bw, t = h.bandwidth, h.throughput
    lines = [
        f"  hand-off: checkpoint = {h.weights_bytes / GB:,.1f} GB weights + {h.optimizer_bytes / GB:,.1f} GB optimizer "
        f"state; modelled step {h.step_s:,.0f} s = generation {h.generation_s:,.0f} s + training {h.training_s:,.0f} s",
        f"            (assumed: {t.generated_tokens_per_s_per_gpu:,.0f} generated tok/s per GPU, "
        f"{t.train_flops_per_s_per_gpu / 1e12:,.0f} TFLOP/s per GPU, {t.mean_response_tokens} response tokens, "
        f"{t.generation_rounds:g} round(s); store {bw.per_node_bytes_per_s / GB:g} GB/s per node, "
        f"{bw.aggregate_bytes_per_s / GB:g} GB/s aggregate)",
    ]
    for cost in (h.naive, h.designed, h.pipelined):
        step = "a step" if cost is not h.pipelined else (
            f"a pipelined step (max(generation, training) = {h.pipelined_step_s:,.0f} s)")
        lines.append(f"    {cost.name}: {cost.written_bytes / GB:,.1f} GB written, {cost.read_bytes / GB:,.1f} GB read "
                     f"per step; {cost.critical_path_s:,.0f} s on the critical path = {cost.share:.1%} of {step}")
        lines += [f"      - {p.what}: {p.bytes / GB:,.1f} GB, {p.seconds:,.0f} s"
                  + ("" if math.isclose(p.critical_s, p.seconds) else f" ({p.critical_s:,.0f} s per step on the critical path)")
                  for p in cost.parts]
        if cost is h.naive:
            need = store_bandwidth_for_share(cost, h.step_s, bw, SHARE_GOAL)
            lines.append(f"      reaches {SHARE_GOAL:.0%} of a step at {need.per_node_bytes_per_s / GB:,.1f} GB/s per node "
                         f"({need.per_node_bytes_per_s * 8 / GB:,.0f} Gb/s) and {need.aggregate_bytes_per_s / GB:,.0f} GB/s "
                         f"aggregate: {need.per_node_bytes_per_s / bw.per_node_bytes_per_s:,.1f}x the assumed store bandwidth")
    lines.append(f"    mirror disk (DAPO_MIRROR_DIR) per node: rollout {h.mirror_rollout_node_bytes / GB:,.1f} GB "
                 f"(the weights of its last {MIRRORED_CHECKPOINTS} checkpoints), train {h.mirror_train_node_bytes / GB:,.1f} "
                 "GB (its ranks' share of the parent's optimizer state, and the step's output: the weights and its "
                 "ranks' share of the state)")
    return "\n".join(lines)


__all__ = ["Bandwidth", "HandoffCost", "StepHandoff", "Throughput", "Transfer", "checkpoint_bytes", "format_handoff",
           "retention_table_markdown", "run_storage_bytes", "step_handoff", "store_bandwidth_for_share", "transfer_seconds"]
