"""One DeepSpeed DAPO training step, run in every process of a torchrun launch.

``engines/train_launch.py`` writes a JSON spec and launches ``torchrun --standalone --nproc_per_node N -m
engines.train_worker SPEC``; each step is its own process group, so nothing (a hung collective, a
leaked CUDA context) survives into the next step. Per process:

1. **load** - join the process group (gloo on CPU, NCCL on GPU), load the parent HF checkpoint,
   wrap it in a DeepSpeed engine (ZeRO 1/2/3, fp32 or bf16, torch AdamW, warm-up, clipping) and,
   if the parent has one, restore its DeepSpeed state (Adam moments, update count, LR schedule).
2. **old log-probs** - recompute the parent's log-probs of every response token with the training
   engine before the first update (as verl does): this is the "pi_old" eq. 10 clips around, so its
   ratio is exactly 1 at the first update. It is NOT the policy that generated the samples: the
   rollout engine's numbers differ (kernels, precision), and a sample from an older checkpoint
   (carried dynamic-sampling surplus, a pipelined rollout: ``policy_version`` < the parent's step)
   came from another policy altogether. So, as in AReaL's decoupled PPO objective
   (dapo_core/correction.py), the parent is the proximal policy of the clip, and each token's loss
   is multiplied by the detached behaviour weight ``min(exp(old_lp - rollout_lp), cap)``:
   ``behaviour_correction`` "auto" (default) on the samples with policy lag > 0 only (an on-policy
   batch trains exactly as without correction), "always" on every sample (TIS), "off" never. The
   policy lags, the rollout/trainer log-prob mismatch and the weights are reported per step.
3. **updates** - shuffle the samples (seeded) into ``updates_per_step`` mini-batches (the paper:
   16 updates per rollout step, sec. 4.1), each split over ranks and into micro-batches; one
   optimizer update per mini-batch. The token-level loss (eq. 10 with the eq. 12 normaliser,
   sec. 3.3) divides by the token count of the whole mini-batch across all ranks; see
   ``backward_scale`` for how DeepSpeed's own averaging is undone, so the update does not depend
   on the micro-batch size or the process count.
4. **save/export** - the DeepSpeed checkpoint (``ds_state/``, with optimizer state) and the
   consolidated HF checkpoint (safetensors + config + tokenizer files) into the staging folder;
   ``engines/train_launch.py`` publishes it. Rank 0 writes the step's metrics as JSON.

Any failure (non-finite loss or gradient, bad rows) raises with the step named; rank 0 writes the
message to ``error_path`` for the parent to report.

**Serve mode** (``serve_dir`` set in the spec; ``engines/train_server.py`` launches it when
``TrainConfig.keep_workers_warm``): the processes stay alive after a step and take further
requests from a file mailbox, so the ~4 s of process start/imports and the engine construction
are paid once per run instead of once per step. Each rank polls ``serve_dir`` for
``request-NNNNNN.json`` (written atomically by the owner), acknowledges it, runs it exactly like
a cold launch, and rank 0 writes ``result-NNNNNN.json`` atomically. Every rank polls the file
itself instead of waiting in a broadcast from rank 0: the pause between steps (rollout, scoring)
can be longer than any collective timeout, and torchrun's ``--standalone`` group is one machine.
A request continues from the in-memory engine only when the owner says its parent is the
checkpoint this group last published AND the parent's ``ds_state`` records the same step and
update count as memory; otherwise the engine is rebuilt from the parent folder on disk, as a cold
launch does, so results never depend on which path ran. Any failure writes the error and exits
the group (its collectives may be out of step); the owner reports it and starts a new group
next time. A watchdog thread exits the process when the owner process is gone (even SIGKILL),
and PR_SET_PDEATHSIG ties each rank to its torchrun agent.
"""

from __future__ import annotations

import gc
import json
import math
import os
import shutil
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from dapo_core.correction import behaviour_weights, policy_lags
from dapo_core.logprobs import chunked_token_log_probs
from dapo_core.losses import policy_loss
from dapo_core.metrics import token_mean_entropy
from engines import train_batch as tb
from schemas.disk_space import writing
from settings.train import TrainConfig
from storage.run_store import write_text

DS_STATE_DIR = "ds_state"  # DeepSpeed checkpoint (optimizer state) inside a checkpoint folder
DS_META_FILE = "dapo_ds_meta.json"  # how the DeepSpeed state was laid out (world size, stage)
# Files of the parent checkpoint that are not copied into the next one (rewritten or not ours).
_NOT_COPIED = {"config.json", "generation_config.json", "dapo_checkpoint.json", "train_metrics.parquet",
               "train_timings.json"}


class TrainStepFailure(RuntimeError):
    """The step cannot produce a valid update (non-finite loss/gradient, incompatible state)."""


@dataclass(frozen=True)
class WorkerSpec:
    """What ``engines/train_launch.py`` hands every worker process: the stage's settings whole
    (``train``, settings/train.py) and this launch's paths, batches and mailbox."""

    train: TrainConfig  # every training setting, as the run config holds it
    parent_checkpoint: str  # HF folder of the policy to update
    resume_ds_state: str | None  # the parent's ds_state/ folder, or None for a fresh optimizer
    steps: list[dict[str, Any]]  # [{"step": int, "shards": [paths]}]; > 1 = consecutive steps, one engine
    out_dir: str  # staging folder that receives the HF export and ds_state/
    metrics_path: str  # JSON written by rank 0: one metrics dict per step
    error_path: str  # text file written by the failing rank
    probe_input_ids: list[list[int]] | None = None  # tests: logits of these inputs after the update
    probe_path: str | None = None
    serve_dir: str | None = None  # serve mode: the request mailbox (engines/train_server.py); None = one launch
    owner_pid: int | None = None  # serve mode: exit when this process is gone
    owner_start_ticks: int | None = None  # its start time (/proc/PID/stat field 22): pids get reused

    @property
    def warmup_updates(self) -> int:
        """The paper counts warm-up in rollout steps (sec. 4.1); the optimizer counts updates."""
        return self.train.warmup_steps * self.train.updates_per_step

    @classmethod
    def from_json(cls, path: str | Path) -> WorkerSpec:
        return cls.from_dict(json.loads(Path(path).read_text()))

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> WorkerSpec:
        """From the JSON form (engines/train_launch.py: _worker_spec)."""
        return cls(**{**raw, "train": TrainConfig(**raw["train"])})


def warmup_lr_factor(update_index: int, warmup_updates: int) -> float:
    """Linear warm-up: update u (0-based) runs at lr * min(1, (u + 1) / warmup_updates).

    The paper warms the learning rate up linearly over its first 20 rollout steps (sec. 4.1).
    The first update already moves (lr / warmup_updates), unlike DeepSpeed's WarmupLR.
    """
    if warmup_updates <= 0:
        return 1.0
    return min(1.0, (update_index + 1) / warmup_updates)


def backward_scale(*, world_size: int, accumulation_steps: int) -> float:
    """Factor on each micro-batch's loss so DeepSpeed's gradient is the mini-batch gradient.

    Each micro-batch loss is already ``sum(token losses) / T`` with T the token count of the
    whole mini-batch over all ranks (eq. 12), so the plain SUM of all micro-batch gradients of
    all ranks is the exact mini-batch gradient. DeepSpeed instead averages: ``engine.backward``
    divides by the gradient-accumulation steps and the data-parallel reduction divides by the
    world size. Multiplying by both undoes that.
    """
    return float(world_size * accumulation_steps)


def _device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def _all_reduce(values: list[float], op: dist.ReduceOp = dist.ReduceOp.SUM) -> list[float]:
    """All-reduce a few scalars at once (one collective). fp64 so token counts stay exact."""
    t = torch.tensor(values, dtype=torch.float64, device=_comm_device())
    dist.all_reduce(t, op=op)
    return t.tolist()


def _comm_device() -> torch.device:
    # NCCL only moves CUDA tensors; gloo only CPU ones.
    return _device() if dist.get_backend() == "nccl" else torch.device("cpu")


def _copy_tokenizer_files(parent: Path, out: Path) -> None:
    for path in parent.iterdir():
        is_weights = path.name.endswith((".safetensors", ".bin", ".pt")) or ".index.json" in path.name
        if path.is_file() and path.name not in _NOT_COPIED and not is_weights:
            shutil.copy2(path, out / path.name)


class _StepRunner:
    """Holds the engine across steps of one launch; one ``run_step`` per rollout step."""

    def __init__(self, spec: WorkerSpec) -> None:
        import deepspeed
        from transformers import AutoModelForCausalLM

        from infra.deepspeed import build_deepspeed_config

        self.spec = spec
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.device = _device()
        self.updates_done = 0
        self.head_calls: int | None = None  # output-head calls per forward with chunked log-probs (run_step)
        self.last_saved: tuple[int, int] | None = None  # (step, updates_done) of the last save()
        torch.manual_seed(spec.train.seed)
        model = AutoModelForCausalLM.from_pretrained(spec.parent_checkpoint, dtype=torch.float32)
        self.pad_token_id = int(model.config.pad_token_id if model.config.pad_token_id is not None else 0)
        if spec.train.activation_checkpointing:
            # Keep only each layer's input in forward; recompute the rest in backward.
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.config.use_cache = False
        ds_config = build_deepspeed_config(
            zero_stage=spec.train.zero_stage,
            precision=spec.train.precision,
            micro_batch_samples=spec.train.micro_batch_samples,
            gradient_accumulation_steps=1,  # set per step from the batch (set_train_batch_size)
            world_size=self.world_size,
            lr=spec.train.lr,
            betas=(spec.train.beta1, spec.train.beta2),
            weight_decay=spec.train.weight_decay,
            adam_eps=spec.train.adam_eps,
            grad_clip_norm=spec.train.grad_clip_norm,
        )
        warmup = spec.warmup_updates

        def make_scheduler(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
            return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda u: warmup_lr_factor(u, warmup))

        self.engine, _, _, _ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(), config=ds_config, lr_scheduler=make_scheduler
        )
        if spec.resume_ds_state:
            self._resume(Path(spec.resume_ds_state))

    def _resume(self, state_dir: Path) -> None:
        meta_path = state_dir / DS_META_FILE
        if not meta_path.is_file():
            raise TrainStepFailure(f"{state_dir}: DeepSpeed state without {DS_META_FILE}")
        meta = json.loads(meta_path.read_text())
        # ZeRO partitions optimizer state by rank: a different layout cannot be loaded as is.
        for key, now in (("world_size", self.world_size), ("zero_stage", self.spec.train.zero_stage)):
            if meta[key] != now:
                raise TrainStepFailure(
                    f"{state_dir}: optimizer state was saved with {key}={meta[key]} but this step runs with "
                    f"{key}={now}; keep them equal or set resume_optimizer=False to start a fresh optimizer"
                )
        path, _ = self.engine.load_checkpoint(
            str(state_dir), tag=meta["tag"], load_optimizer_states=True, load_lr_scheduler_states=True
        )
        if path is None:
            raise TrainStepFailure(f"{state_dir}: DeepSpeed could not load tag {meta['tag']!r}")
        self.updates_done = int(meta["updates_done"])

    def _forward_log_probs(self, mb: tb.TrainBatch, *, entropy_mask: torch.Tensor | None = None
                           ) -> tuple[torch.Tensor, float | None]:
        """(token log-probs [b, l], entropy summed over ``entropy_mask`` or None) of the current policy.

        ``entropy_mask`` [b, l] selects the positions whose predicting distribution's entropy is
        summed (position p: the distribution over token p). With ``logprob_chunk_tokens`` the
        logits come from the hidden states chunk by chunk (dapo_core/logprobs.py); the model's
        own head then computes one position only (``logits_to_keep=1``).
        """
        ids = mb.input_ids.to(self.device)
        attention = mb.attention_mask.to(self.device).long()
        chunk = self.spec.train.logprob_chunk_tokens
        if not chunk:
            logits = self.engine(input_ids=ids, attention_mask=attention).logits
            entropy_sum = None
            if entropy_mask is not None:
                # logits at p - 1 gave token p, and position 0 is always a prompt token.
                shifted = entropy_mask[:, 1:].to(self.device)
                entropy_sum = float(token_mean_entropy(logits[:, :-1], shifted)) * float(shifted.sum())
            return tb.token_log_probs(logits, ids), entropy_sum
        captured: dict[str, torch.Tensor] = {}
        base = self.engine.module.model
        handle = base.register_forward_hook(lambda _m, _i, out: captured.__setitem__("hidden", out.last_hidden_state))
        try:
            self.engine(input_ids=ids, attention_mask=attention, logits_to_keep=1)
        finally:
            handle.remove()
        lp, entropy = chunked_token_log_probs(self.engine.module.lm_head, captured["hidden"], ids, chunk_tokens=chunk,
                                              with_entropy=entropy_mask is not None, num_chunks=self.head_calls)
        entropy_sum = None
        if entropy is not None and entropy_mask is not None:
            entropy_sum = float((entropy * entropy_mask.to(self.device)).sum())
        return lp, entropy_sum

    def run_step(self, step: int, shards: list[str], parent_version: int) -> dict[str, Any]:
        """One training step on ``shards``; ``parent_version`` is the step of the checkpoint being
        updated (the proximal policy), against which each sample's policy lag is measured."""
        spec, device, W = self.spec, self.device, self.world_size
        timings: dict[str, float] = {}
        t0 = time.perf_counter()
        rows = tb.load_rows(shards)
        tb.check_trainable(rows, step=step)
        batch = tb.collate(rows, pad_token_id=self.pad_token_id)
        try:
            lags = policy_lags(batch.policy_versions, current_version=parent_version)  # [B]
        except ValueError as err:
            raise TrainStepFailure(f"step {step}: {err} (engines/train_launch.py refuses such batches before launch)") from err
        stale = lags > 0
        # Which samples get the behaviour weight (decoupled PPO, dapo_core/correction.py): keyed on
        # each sample's policy lag, whatever made it stale (carried surplus, pipelined rollout).
        # "auto" leaves on-policy samples at weight 1 and an all-fresh batch on the exact code path
        # it had without correction; "always" weights every sample (TIS).
        correct = {"always": True, "auto": bool(stale.any()), "off": False}[spec.train.correction_mode]
        correct_samples = stale if spec.train.correction_mode == "auto" else None
        if spec.train.logprob_chunk_tokens:
            # Chunks per forward from the whole batch's width, which every rank knows: micro-batches
            # are trimmed to their own length, but under ZeRO-3 each head call is a collective
            # gather, so all ranks must make the same number of calls (dapo_core/logprobs.py).
            self.head_calls = -(-(batch.input_ids.shape[1] - 1) // spec.train.logprob_chunk_tokens)
        minis = tb.mini_batches(batch.num_samples, spec.train.updates_per_step, seed=spec.train.seed + step)
        gas = tb.accumulation_steps([len(m) for m in minis], world_size=W, micro_batch_samples=spec.train.micro_batch_samples)
        # Only the loss scaling in engine.backward and the sample count read this; where the optimizer
        # steps is set explicitly per micro-batch below.
        self.engine.set_train_batch_size(spec.train.micro_batch_samples * gas * W)
        # plan[m] = this rank's micro-batches of mini-batch m, padded with zero-weight repeats of
        # the mini-batch's first sample so every rank runs exactly ``gas`` forward/backward passes
        # (ZeRO-3 gathers parameters collectively in each forward).
        plan: list[list[tuple[list[int], float]]] = []
        for mini in minis:
            micro = [(idx, 1.0) for idx in tb.rank_micro_batches(mini, rank=self.rank, world_size=W,
                                                                   micro_batch_samples=spec.train.micro_batch_samples)]
            micro += [([mini[0]], 0.0)] * (gas - len(micro))
            plan.append(micro)
        timings["batch_s"] = time.perf_counter() - t0

        # --- old log-probs with the training engine, before any update (pi_old of eq. 10) ---
        t0 = time.perf_counter()
        self.engine.eval()
        old_lp: list[list[torch.Tensor]] = []
        behav_w: list[list[torch.Tensor]] = []  # [m][j]: behaviour weights [b, l] when ``correct``
        # sums over this rank's real samples: |old - rollout|, response tokens, entropy, loss tokens,
        # behaviour weights and capped tokens over the loss tokens
        local = {"abs_delta": 0.0, "resp_tokens": 0.0, "entropy": 0.0, "loss_tokens": 0.0, "weight_sum": 0.0,
                 "capped": 0.0}
        max_delta = 0.0
        with torch.no_grad():
            for micro in plan:
                row, w_row = [], []
                for idx, weight in micro:
                    mb = tb.select(batch, idx)
                    lp, entropy_sum = self._forward_log_probs(mb, entropy_mask=mb.loss_mask if weight else None)
                    lp = lp.float().cpu()
                    row.append(lp)
                    if correct:
                        w, w_metrics = behaviour_weights(
                            lp, mb.rollout_log_probs, mb.loss_mask, cap=spec.train.correction_cap,
                            sample_mask=None if correct_samples is None else correct_samples[list(idx)])
                        w_row.append(w)
                        n_w = float(w_metrics["num_tokens"]) * weight
                        if n_w:
                            local["weight_sum"] += float(w_metrics["weight_mean"]) * n_w
                            local["capped"] += float(w_metrics["capped_frac"]) * n_w
                    if weight == 0.0:
                        continue
                    resp = mb.response_mask
                    delta = (lp - mb.rollout_log_probs).abs()[resp]
                    local["abs_delta"] += float(delta.sum())
                    local["resp_tokens"] += float(resp.sum())
                    max_delta = max(max_delta, float(delta.max()) if delta.numel() else 0.0)
                    # Entropy of pi_old over the loss tokens (sec. 3.1 watches it collapse).
                    local["entropy"] += entropy_sum
                    local["loss_tokens"] += float(mb.loss_mask[:, 1:].sum())
                old_lp.append(row)
                behav_w.append(w_row)
        abs_delta, resp_tokens, entropy_sum, loss_tokens, weight_sum, capped_tokens = _all_reduce(
            [local["abs_delta"], local["resp_tokens"], local["entropy"], local["loss_tokens"], local["weight_sum"],
             local["capped"]]
        )
        (max_delta,) = _all_reduce([max_delta], dist.ReduceOp.MAX)
        if loss_tokens == 0:
            raise TrainStepFailure(f"step {step}: no token to train on after masking")
        timings["old_log_probs_s"] = time.perf_counter() - t0

        # --- one optimizer update per mini-batch ---
        t0 = time.perf_counter()
        self.engine.train()
        scale = backward_scale(world_size=W, accumulation_steps=gas)
        sums = {"loss": 0.0, "clip_frac_low": 0.0, "clip_frac_high": 0.0, "dual_clip_frac": 0.0, "approx_kl": 0.0}
        grad_norms: list[float] = []
        lrs: list[float] = []
        updates = 0
        for m, micro in enumerate(plan):
            # The loss denominators are those of the whole mini-batch over every rank, so the summed
            # micro-batch gradients equal the mini-batch gradient whatever the split (sec. 3.3).
            real = [tb.select(batch, idx).loss_mask for idx, w in micro if w > 0]
            mini_tokens, mini_seqs_valid, mini_seqs = _all_reduce([
                sum(float(m.sum()) for m in real),
                sum(float((m.sum(dim=-1) > 0).sum()) for m in real),
                sum(float(m.shape[0]) for m in real),
            ])
            # seq-mean-token-mean averages over responses with a loss token (an overlong-filtered
            # response is not a sample of the mean); Dr.GRPO's sum-norm over every response.
            mini_sequences = {"token-mean": None, "seq-mean-token-mean": mini_seqs_valid,
                              "seq-mean-token-sum-norm": mini_seqs}[spec.train.loss_agg]
            if mini_tokens == 0:
                continue  # every sample of this mini-batch is overlong-filtered: nothing to learn
            finite = True
            lr_now = float(self.engine.get_lr()[0])
            steps_before = self.engine.global_steps
            for j, (idx, weight) in enumerate(micro):
                # The last micro-batch of the mini-batch is the accumulation boundary (gradient
                # reduction, optimizer and LR-schedule step), set explicitly: DeepSpeed's own rule,
                # (micro_steps + 1) % gas == 0, counts micro-batches since the engine was built, so a
                # warm engine whose gas changed with the batch size would step mid-mini-batch.
                self.engine.set_gradient_accumulation_boundary(j == len(micro) - 1)
                mb = tb.select(batch, idx)
                lp, _ = self._forward_log_probs(mb)
                old = old_lp[m][j].to(device)
                mask = mb.loss_mask.to(device)
                advantages = mb.advantages.to(device)
                if correct:
                    # Decoupled PPO (AReaL; dapo_core/correction.py): eq. 10 clips around pi_old = the
                    # parent (proximal policy), and each token's loss is weighted by the detached
                    # min(pi_old / pi_rollout, cap). A positive per-token weight on the loss equals
                    # scaling the advantage: eq. 10's min/max of the clipped terms is positively
                    # homogeneous in A (the dual clip too).
                    advantages = advantages * behav_w[m][j].to(device)
                loss, metrics = policy_loss(
                    lp.float(), old, advantages, mask,
                    eps_low=spec.train.eps_low, eps_high=spec.train.eps_high, dual_clip_c=spec.train.dual_clip_c,
                    agg=spec.train.loss_agg, total_sequences=mini_sequences,
                    total_tokens=mini_tokens if spec.train.loss_agg == "token-mean" else None,
                    max_response_tokens=spec.train.loss_norm_tokens or None,
                )
                finite = finite and bool(torch.isfinite(loss))
                self.engine.backward(loss * (weight * scale))
                if j == len(micro) - 1:
                    # All ranks agree before stepping: a NaN anywhere stops the step everywhere.
                    (all_finite,) = _all_reduce([1.0 if finite else 0.0], dist.ReduceOp.MIN)
                    if all_finite < 1.0:
                        raise TrainStepFailure(f"step {step}: loss is not finite (mini-batch {m}); nothing published")
                self.engine.step()
                if self.engine.global_steps != steps_before + (j == len(micro) - 1):
                    raise TrainStepFailure(f"step {step}: DeepSpeed's optimizer step did not follow the last "
                                           f"micro-batch of mini-batch {m} (micro-batch {j} of {len(micro)})")
                n_tok = float(metrics["num_tokens"]) * weight
                sums["loss"] += float(loss) * weight
                for key in ("clip_frac_low", "clip_frac_high", "dual_clip_frac", "approx_kl"):
                    sums[key] += float(metrics[key]) * n_tok
            grad_norm = self.engine.get_global_grad_norm()
            grad_norm = float(grad_norm) if grad_norm is not None else float("nan")
            if not math.isfinite(grad_norm):
                raise TrainStepFailure(f"step {step}: gradient norm is {grad_norm} (mini-batch {m}); nothing published")
            grad_norms.append(grad_norm)
            lrs.append(lr_now)
            updates += 1
            self.updates_done += 1
        timings["updates_s"] = time.perf_counter() - t0

        keys = list(sums)
        totals = dict(zip(keys, _all_reduce([sums[k] for k in keys])))
        total_update_tokens = loss_tokens  # every loss token is in exactly one mini-batch
        return {
            "step": step,
            "loss": totals["loss"] / max(updates, 1),  # mean over updates of each mini-batch's loss
            "entropy": entropy_sum / loss_tokens,
            "clip_frac_low": totals["clip_frac_low"] / total_update_tokens,
            "clip_frac_high": totals["clip_frac_high"] / total_update_tokens,
            "dual_clip_frac": totals["dual_clip_frac"] / total_update_tokens,
            "approx_kl": totals["approx_kl"] / total_update_tokens,
            # Behaviour correction over the loss tokens (uncorrected samples count 1); NaN when off.
            "behaviour_weight_mean": weight_sum / loss_tokens if correct else float("nan"),
            "behaviour_weight_capped_fraction": capped_tokens / loss_tokens if correct else float("nan"),
            "policy_lag_mean": float(lags.double().mean()),
            "policy_lag_max": int(lags.max()),
            "stale_sample_fraction": float(stale.double().mean()),
            "grad_norm": sum(grad_norms) / len(grad_norms) if grad_norms else float("nan"),
            "grad_norms": grad_norms,
            "lr": lrs[-1] if lrs else float("nan"),
            "tokens": int(loss_tokens),
            "samples": batch.num_samples,
            "masked_samples": int(batch.loss_masked.sum()),
            "updates": updates,
            "updates_done": self.updates_done,
            "accumulation_steps": gas,
            "world_size": W,
            "logprob_mismatch_mean_abs": abs_delta / max(resp_tokens, 1.0),
            "logprob_mismatch_max_abs": max_delta,
            "timings": timings,
        }

    def probe(self, input_ids: list[list[int]]) -> torch.Tensor:
        """Logits of the updated policy on ``input_ids`` (equal-length rows), for export tests."""
        self.engine.eval()
        with torch.no_grad():
            ids = torch.tensor(input_ids, dtype=torch.long, device=self.device)
            return self.engine(input_ids=ids).logits.float().cpu()

    def full_fp32_state(self) -> dict[str, torch.Tensor]:
        """The full fp32 weights, consolidated on rank 0 (empty dict on other ranks).

        Collective (ZeRO-3 gathers each parameter's partitions): every rank must call it. The
        optimizer's fp32 master copy is read when there is one (bf16, ZeRO-3); plain fp32
        ZeRO 1/2 keeps the full updated weights in the module itself.
        """
        from deepspeed.utils import safe_get_full_fp32_param

        state: dict[str, torch.Tensor] = {}
        for name, param in self.engine.module.named_parameters():
            full = safe_get_full_fp32_param(param)
            if full is None:
                full = param.detach()
            if self.rank == 0:
                state[name] = full.detach().float().cpu().clone()
        return state

    def save(self, last_step: int) -> dict[str, float]:
        """Write ds_state/ (all ranks) and the consolidated HF export (rank 0) into out_dir."""
        from transformers import AutoModelForCausalLM

        spec = self.spec
        out = Path(spec.out_dir)
        state_dir = out / DS_STATE_DIR
        tag = f"step{last_step:06d}"
        t0 = time.perf_counter()
        if spec.train.keep_optimizer_state:
            with writing(state_dir, "the DeepSpeed optimizer state"):
                self.engine.save_checkpoint(str(state_dir), tag=tag)
        dist.barrier()
        timings = {"ds_save_s": time.perf_counter() - t0}
        t0 = time.perf_counter()
        state = self.full_fp32_state()
        if self.rank == 0:
            model = AutoModelForCausalLM.from_pretrained(spec.parent_checkpoint, dtype=torch.float32)
            missing, unexpected = model.load_state_dict(state, strict=False)
            # Tied output embeddings appear once among named_parameters (as the input embedding).
            really_missing = [k for k in missing if not (k == "lm_head.weight" and model.config.tie_word_embeddings)]
            if really_missing or unexpected:
                raise TrainStepFailure(f"export: weights missing {really_missing[:5]}, unexpected {unexpected[:5]}")
            if spec.train.precision == "bf16":
                model = model.to(torch.bfloat16)
            with writing(out, "the checkpoint's weights"):
                model.save_pretrained(out, safe_serialization=True)
                _copy_tokenizer_files(Path(spec.parent_checkpoint), out)
            if spec.train.keep_optimizer_state:
                meta = {"tag": tag, "world_size": self.world_size, "zero_stage": spec.train.zero_stage,
                        "precision": spec.train.precision, "updates_done": self.updates_done, "step": last_step}
                (state_dir / DS_META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
        dist.barrier()
        timings["export_s"] = time.perf_counter() - t0
        self.last_saved = (last_step, self.updates_done) if spec.train.keep_optimizer_state else None
        return timings

    def can_continue_from(self, resume_ds_state: str | None) -> bool:
        """True when the in-memory engine is exactly what loading ``resume_ds_state`` would give.

        The owner already checked that the parent is the checkpoint this group last published;
        this re-checks the parent's own record (step and update count) against memory, so a
        bookkeeping slip in the owner falls back to a reload instead of training on wrong state.
        """
        if resume_ds_state is None or self.last_saved is None:
            return False  # a cold launch would start a fresh optimizer from the HF weights
        meta_path = Path(resume_ds_state) / DS_META_FILE
        if not meta_path.is_file():
            return False
        meta = json.loads(meta_path.read_text())
        return (int(meta["step"]), int(meta["updates_done"])) == self.last_saved and \
            meta["world_size"] == self.world_size and meta["zero_stage"] == self.spec.train.zero_stage


def _run_request(runner: _StepRunner, spec: WorkerSpec, load_s: float,
                 extra: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Run the steps of ``spec`` on ``runner``, probe, save; rank 0 writes the metrics JSON
    (one dict per step, ``extra`` added to each) atomically to ``spec.metrics_path``."""
    results = []
    for entry in spec.steps:
        results.append(runner.run_step(int(entry["step"]), list(entry["shards"]), int(entry["parent_version"])))
    if spec.probe_input_ids is not None:
        logits = runner.probe(spec.probe_input_ids)
        if runner.rank == 0 and spec.probe_path:
            torch.save(logits, spec.probe_path)
    save_timings = runner.save(int(spec.steps[-1]["step"]))
    if runner.rank == 0:
        results[0]["timings"]["load_s"] = load_s
        results[-1]["timings"].update(save_timings)
        results[-1]["timings"]["save_export_s"] = sum(save_timings.values())
        for r in results:
            r.update(extra or {})
        write_text(spec.metrics_path, json.dumps(results, indent=2))
    return results


def _init_process() -> int:
    torch.set_flush_denormal(True)  # 3-10x slower small models on CPU without it
    import deepspeed

    if torch.cuda.is_available():
        # One GPU per rank, chosen before NCCL creates its communicators on the current device.
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
    return dist.get_rank()


def process_start_ticks(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (Linux), None when it does not exist.

    A pid alone is not an identity: after the owner dies the kernel may hand its pid to a new
    process. (pid, start ticks) is unique.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        if sys.platform.startswith("linux"):
            return None
        try:  # no /proc: existence only
            os.kill(pid, 0)
        except OSError:
            return None
        return 0
    # Field 2 (comm) may hold spaces and parentheses: split after its closing ')'.
    return int(stat[stat.rindex(")") + 2:].split()[19])


def owner_alive(pid: int, start_ticks: int | None) -> bool:
    now = process_start_ticks(pid)
    return now is not None and (start_ticks is None or now == start_ticks or now == 0)


def _set_parent_death_signal() -> None:
    """Linux: SIGKILL this rank when its parent (the torchrun agent) dies, whatever kills it."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    if os.getppid() == 1:  # the agent died before prctl took effect
        os._exit(3)


def _start_owner_watchdog(pid: int, start_ticks: int | None, interval_s: float = 0.5) -> None:
    """Exit this process as soon as the owner is gone, even in the middle of a step.

    Nothing of an orphaned step could be published (the owner publishes), so there is nothing to
    finish: the staging folder it leaves is hidden and ``checkpoints.clean_stale_staging`` removes it.
    """
    def watch() -> None:
        while owner_alive(pid, start_ticks):
            time.sleep(interval_s)
        os._exit(0)

    threading.Thread(target=watch, name="owner-watchdog", daemon=True).start()


def request_path(serve_dir: str | Path, n: int) -> Path:
    return Path(serve_dir) / f"request-{n:06d}.json"


def result_path(serve_dir: str | Path, n: int) -> Path:
    return Path(serve_dir) / f"result-{n:06d}.json"


def ack_path(serve_dir: str | Path, n: int, rank: int) -> Path:
    return Path(serve_dir) / f"ack-{n:06d}.rank{rank}"


def error_prefix(serve_dir: str | Path, n: int) -> Path:
    return Path(serve_dir) / f"error-{n:06d}.txt"


POLL_S = 0.02  # serve mode: how often an idle rank looks for the next request


def _wait_request(serve_dir: Path, n: int) -> dict[str, Any]:
    path = request_path(serve_dir, n)
    while not path.is_file():
        time.sleep(POLL_S)
    return json.loads(path.read_text())


def _serve(base: WorkerSpec, rank: int) -> None:
    """Serve requests until a ``stop`` request (or the owner's death, via the watchdog)."""
    assert base.serve_dir is not None
    serve_dir = Path(base.serve_dir)
    runner: _StepRunner | None = None
    dist.barrier()  # every rank joined before the first acknowledgement
    n = 0
    while True:
        request = _wait_request(serve_dir, n)
        ack_path(serve_dir, n, rank).write_text("")
        if request.get("op") == "stop":
            return
        spec = replace(base, **request["spec"], serve_dir=base.serve_dir,
                       metrics_path=str(result_path(serve_dir, n)), error_path=str(error_prefix(serve_dir, n)))
        try:
            t0 = time.perf_counter()
            continued = bool(request.get("continue_in_memory")) and runner is not None and \
                runner.can_continue_from(spec.resume_ds_state)
            # Every rank decides from the same files; agreeing explicitly costs one collective and
            # makes a disagreement (e.g. a file racing a write) a reload, never a split group.
            (agreed,) = _all_reduce([1.0 if continued else 0.0], dist.ReduceOp.MIN)
            continued = agreed == 1.0
            if continued:
                assert runner is not None
                runner.spec = spec
            else:
                # Rebuild exactly as a cold launch would (same seed, parent weights, ds_state).
                runner = None
                gc.collect()
                runner = _StepRunner(spec)
            load_s = time.perf_counter() - t0
            _run_request(runner, spec, load_s, {"continued_in_memory": continued, "serve_request": n})
        except Exception as err:
            Path(f"{spec.error_path}.rank{rank}").write_text(f"{type(err).__name__}: {err}\n\n{traceback.format_exc()}")
            raise
        n += 1


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m engines.train_worker SPEC.json (launched by torchrun)", file=sys.stderr)
        return 2
    spec = WorkerSpec.from_json(argv[0])
    if spec.serve_dir is not None:
        _set_parent_death_signal()
        if spec.owner_pid is not None:
            _start_owner_watchdog(spec.owner_pid, spec.owner_start_ticks)
    t_start = time.perf_counter()
    rank = _init_process()
    try:
        if spec.serve_dir is not None:
            _serve(spec, rank)
        else:
            runner = _StepRunner(spec)
            _run_request(runner, spec, time.perf_counter() - t_start)
    except Exception as err:  # report, then fail the launch (torchrun stops the other ranks)
        if spec.serve_dir is None:
            Path(f"{spec.error_path}.rank{rank}").write_text(f"{type(err).__name__}: {err}\n\n{traceback.format_exc()}")
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
