"""The training memory plan (infra/sizing.py) against one measured figure: a real-shaped train step's peak RSS.

One DAPO train step (engines/train/launch.train_step, one torchrun rank, DeepSpeed ZeRO-1, fp32,
activation checkpointing) of a model of a carried config.json's shape (default: Qwen2.5-0.5B,
tests/data/model_configs) with random weights, on a short batch (``--samples`` sequences of
``--tokens`` tokens, one micro-batch). Each phase runs in a fresh process:

- ``build``: the step-0 checkpoint (random fp32 weights of that shape, the tiny tokenizer);
- ``baseline``: the rank's imports (engines.train.worker, transformers' model classes, DeepSpeed),
  then its peak RSS (``VmHWM``): what the rank holds before it loads any weight;
- ``step``: ``train_step`` with a cold launch; the rank is a grandchild of this process (torchrun's
  agent in between: engines/train/dist.py), and once both are waited for, ``getrusage(RUSAGE_CHILDREN).ru_maxrss`` is the peak RSS
  of the largest of them (Linux keeps the maximum over waited-for descendants): the rank's. A sampler
  also reads the descendants' ``VmHWM`` twice a second, as a cross-check, and their ``VmRSS`` (a trace:
  where in the step the peak falls; the step's timings give its phases' lengths).

Measured = the rank's peak RSS minus the baseline. Predicted = infra/sizing.py's training terms for
one process on this CPU (``cpu_plan``): on a CPU every byte a GPU rank keeps on its device lives in
host memory, at fp32 (``train.precision: fp32``, the CPU default):

- weights: fp32 module parameters, 4 bytes each (the GPU plan's bf16 weights are 2);
- gradients: 4 bytes each; optimizer state: 12 bytes each (DeepSpeed's fp32 partition, which ZeRO-1
  keeps even for fp32 parameters, + Adam's two moments); one process: nothing partitioned;
- activations of the micro-batch (activation checkpointing on, as the plan assumes): every layer's
  input and one recomputed layer at 4 bytes an element, and the logits at 12 (fp32 logits, their
  log-softmax and its gradient; the GPU plan's 10 assume bf16 logits);
- the optimizer step's transients beyond the activations (issue 49): DeepSpeed's flat fp32 gradient
  partition (4 bytes) and AdamW's CPU scratch (8: sqrt(v) and its quotient), less the module's gradients
  ZeRO-1 frees before the update: 8 bytes a parameter above the states, where the peak falls.

These are ``sizing.training_terms`` at ``precision="fp32"`` with ``ADAM_SCRATCH_BYTES_CPU``.

Not applicable here: the ZeRO-3 gather buffer (ZeRO-1), the GPU process's runtime allowance
(``HOST_BYTES_PER_GPU_PROCESS``: a CUDA context and pinned buffers; this process's imports are the
baseline instead), and the vLLM engine (no rollout in a train step). Prints a table; writes
``benchmarks/results/train_memory_check.json``. ``--recompare`` measures nothing: it compares the
measurement recorded in ``--out`` with today's plan and rewrites the file's plan figures. At the default shape the rank peaks at ~15 GB and the
whole check takes ~2 minutes on two cores; ``--layers 2`` keeps the shape's width and vocabulary with two
blocks (~5 GB, under a minute).

    .venv/bin/python benchmarks/train_memory_check.py [--config-dir DIR] [--layers N] [--samples 4] [--tokens 128]
    .venv/bin/python benchmarks/train_memory_check.py --recompare [--out FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from infra import model_shape, sizing  # noqa: E402

DEFAULT_CONFIG_DIR = REPO / "tests" / "data" / "model_configs" / "Qwen2.5-0.5B"
RESULT = REPO / "benchmarks" / "results" / "train_memory_check.json"
PROMPT_TOKENS = 32  # of each sequence; the rest is response
STEP_TIMEOUT_S = 1200.0


# ----------------------------------------------------------------------------- the plan's figure


@dataclass(frozen=True)
class CpuPlan:
    """infra/sizing.py's training terms for one fp32 ZeRO-1 process on a CPU (bytes)."""

    params: int
    tokens_per_micro_batch: int
    weights: int  # fp32 parameters
    gradients: int
    optimizer_state: int  # fp32 partition + Adam moments, unpartitioned (one process)
    activations: sizing.ActivationEstimate  # fp32 elements, 12-byte logits
    optimizer_step: int  # the step's transients beyond the activations (flat gradients + AdamW's CPU scratch)

    @property
    def state(self) -> int:
        return self.weights + self.gradients + self.optimizer_state

    @property
    def total(self) -> int:
        return self.state + self.activations.total + self.optimizer_step


def cpu_plan(arch: sizing.ModelArchitecture, tokens_per_micro_batch: int) -> CpuPlan:
    """The plan's terms for ``arch`` trained by one fp32 ZeRO-1 process on ``tokens_per_micro_batch`` tokens:
    ``sizing.training_terms`` at fp32 with AdamW's CPU scratch, one process (nothing partitioned)."""
    params = sizing.parameter_count(arch)
    terms = {t.name: t.bytes for t in sizing.training_terms(
        arch, params, 1, 1, tokens_per_micro_batch, precision="fp32",
        adam_scratch_bytes_per_param=sizing.ADAM_SCRATCH_BYTES_CPU)}
    elements = sizing.precision_bytes("fp32")
    return CpuPlan(
        params=params,
        tokens_per_micro_batch=tokens_per_micro_batch,
        weights=terms["weights"],
        gradients=terms["gradients"],
        optimizer_state=terms["optimizer state"],
        activations=sizing.activation_bytes(arch, tokens_per_micro_batch, bytes_per_element=elements.activations,
                                            logit_bytes_per_element=elements.logits),
        optimizer_step=terms["optimizer step transients"],
    )


def measured_architecture(config_dir: Path, layers: int) -> sizing.ModelArchitecture:
    """The shape of ``config_dir``'s config.json, with ``layers`` blocks when > 0 (a scaled-down run)."""
    arch = model_shape.load_architecture(config_dir)
    return dataclasses.replace(arch, layers=layers) if layers > 0 else arch


# ----------------------------------------------------------------------------- the phases (child processes)


def _status_kib(field: str, pid: int | str = "self") -> int:
    """``field`` of /proc/PID/status in KiB (``VmHWM``: peak RSS, ``VmRSS``: now); 0 when it is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    return next((int(line.split()[1]) for line in text.splitlines() if line.startswith(f"{field}:")), 0)


def _hwm_kib(pid: int | str = "self") -> int:
    return _status_kib("VmHWM", pid)


def _descendants(pid: int) -> list[int]:
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    return [d for c in map(int, children) for d in (c, *_descendants(c))]


def phase_build(config_dir: Path, layers: int, out: Path) -> dict[str, Any]:
    """Publish a step-0 checkpoint of ``config_dir``'s shape (``layers`` blocks when > 0), random fp32 weights."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    from engines.bootstrap.tiny_policy import build_tokenizer, save_checkpoint

    torch.set_flush_denormal(True)
    tokenizer = build_tokenizer()
    fields = json.loads((config_dir / model_shape.CONFIG_FILE).read_text())
    fields.pop("torch_dtype", None)
    if layers > 0:
        fields["num_hidden_layers"] = layers  # before the config derives its per-layer lists from it
    config = AutoConfig.for_model(fields.pop("model_type"), **fields, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config = GenerationConfig(pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    params = sum(p.numel() for p in model.parameters())
    save_checkpoint(model, tokenizer, out, step=0, produced_by="bootstrap", parent_checkpoint_id=None,
                    inputs={"benchmark": "train_memory_check", "config_dir": str(config_dir), "layers": layers})
    return {"params": params}


def phase_baseline() -> dict[str, Any]:
    """The rank's imports, then its peak RSS: what it holds before any weight is loaded."""
    import importlib

    import deepspeed  # noqa: F401
    import engines.train.worker as worker
    from transformers.models.qwen2 import modeling_qwen2  # noqa: F401

    from engines.train import engine as train_engine, step as train_step  # noqa: F401

    for name in worker._PRELOADED:
        importlib.import_module(name)
    return {"baseline_kib": _hwm_kib()}


def _write_batch(path: Path, *, samples: int, tokens: int, vocab: int) -> Path:
    """``samples`` ScoredRollout rows of exactly ``tokens`` tokens each (random ids, +/-1 advantages)."""
    import torch

    sys.path.insert(0, str(REPO / "tests" / "integration"))
    from train_fixtures import scored_row, write_scored

    g = torch.Generator().manual_seed(0)
    response = tokens - PROMPT_TOKENS
    rows = [scored_row(f"m{i}", torch.randint(3, vocab, (PROMPT_TOKENS,), generator=g).tolist(),
                       torch.randint(3, vocab, (response,), generator=g).tolist(), 1.0 if i % 2 == 0 else -1.0,
                       log_probs=(-torch.rand(response, generator=g) * 3).tolist(), sample_index=i)
            for i in range(samples)]
    return write_scored(path, rows)


def phase_step(checkpoint: Path, work: Path, *, samples: int, tokens: int, vocab: int) -> dict[str, Any]:
    """One cold-launched train step; the rank's peak RSS from this process's waited-for descendants."""
    from engines.train.launch import train_step
    from settings.train import TrainConfig

    batch = _write_batch(work / "batch.parquet", samples=samples, tokens=tokens, vocab=vocab)
    config = TrainConfig(num_processes=1, zero_stage=1, precision="fp32", micro_batch_samples=samples,
                         updates_per_step=1, activation_checkpointing=True, logprob_chunk_tokens=0,
                         keep_workers_warm=False, timeout_s=STEP_TIMEOUT_S)
    sampled = {"kib": 0}
    trace: list[tuple[float, int]] = []  # (seconds into the step, the largest descendant's RSS in KiB)
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.5):
            pids = _descendants(os.getpid())
            sampled["kib"] = max([sampled["kib"], *(_hwm_kib(pid) for pid in pids)])
            trace.append((round(time.perf_counter() - start, 1), max([0, *(_status_kib("VmRSS", pid) for pid in pids)])))

    start = time.perf_counter()
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    result = train_step(checkpoint, [batch], work / "step-0001", step=1, config=config)
    seconds = time.perf_counter() - start
    done.set()
    sampler.join()
    return {
        "rank_peak_kib_rusage": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
        "rank_peak_kib_sampled": sampled["kib"],
        "launcher_peak_kib": _hwm_kib(),
        "step_seconds": seconds,
        "tokens": result.metrics["tokens"],
        "samples": result.metrics["samples"],
        "timings": result.timings,
        "rank_rss_kib_trace": trace,  # where in the step the peak falls (the timings give the phases' lengths)
    }


def _run_phase(phase: str, args: argparse.Namespace, work: Path, timeout_s: float) -> dict[str, Any]:
    """Run one phase in a fresh process of this script; its last stdout line is its JSON result."""
    cmd = [sys.executable, __file__, "--phase", phase, "--work", str(work), "--config-dir", str(args.config_dir),
           "--layers", str(args.layers), "--samples", str(args.samples), "--tokens", str(args.tokens)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise SystemExit(f"phase {phase} failed ({proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _child(args: argparse.Namespace) -> int:
    work = Path(args.work)
    if args.phase == "build":
        out = phase_build(args.config_dir, args.layers, work / "step-0000")
    elif args.phase == "baseline":
        out = phase_baseline()
    else:
        arch = measured_architecture(args.config_dir, args.layers)
        out = phase_step(work / "step-0000", work, samples=args.samples, tokens=args.tokens, vocab=arch.vocab_size)
    print(json.dumps(out))
    return 0


# ----------------------------------------------------------------------------- the comparison


def compare(plan: CpuPlan, baseline_kib: int, rank_peak_kib: int) -> dict[str, Any]:
    """Measured (the rank's peak RSS less its imports) against the plan's total, in bytes and as a ratio."""
    measured = (rank_peak_kib - baseline_kib) * 1024
    return {"measured_bytes": measured, "plan_bytes": plan.total, "measured_over_plan": measured / plan.total}


def _table(plan: CpuPlan, figures: dict[str, Any], baseline_kib: int, rank_peak_kib: int) -> str:
    gb = sizing.GB
    rows = [
        ("weights (fp32)", plan.weights), ("gradients (fp32)", plan.gradients),
        ("optimizer state (fp32 partition + Adam m, v)", plan.optimizer_state),
        ("activations: layer inputs", plan.activations.checkpoints),
        ("activations: one layer recomputed", plan.activations.layer_working_set),
        ("activations: logits (12 B/element)", plan.activations.logits),
        ("optimizer step transients beyond activations", plan.optimizer_step), ("plan total", plan.total),
    ]
    lines = [f"{'term':<48}{'GB':>8}"] + [f"{name:<48}{value / gb:>8.3f}" for name, value in rows]
    lines += [
        f"{'rank peak RSS':<48}{rank_peak_kib * 1024 / gb:>8.3f}",
        f"{'rank baseline after imports':<48}{baseline_kib * 1024 / gb:>8.3f}",
        f"{'measured (peak - baseline)':<48}{figures['measured_bytes'] / gb:>8.3f}",
        f"measured / plan: {figures['measured_over_plan']:.3f}",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config-dir", type=Path, default=DEFAULT_CONFIG_DIR, help="a folder holding config.json")
    parser.add_argument("--layers", type=int, default=0, help="blocks to keep (0: the config's own)")
    parser.add_argument("--samples", type=int, default=4, help="sequences in the batch (one micro-batch)")
    parser.add_argument("--tokens", type=int, default=128, help=f"tokens per sequence ({PROMPT_TOKENS} of prompt)")
    parser.add_argument("--out", type=Path, default=RESULT)
    parser.add_argument("--recompare", action="store_true",
                        help="measure nothing: compare the measurement recorded in --out with today's plan")
    parser.add_argument("--phase", choices=["build", "baseline", "step"], help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.tokens <= PROMPT_TOKENS:
        parser.error(f"--tokens must exceed the {PROMPT_TOKENS} prompt tokens")
    if args.phase:
        return _child(args)
    if args.recompare:
        return recompare(args.out, args.config_dir)
    arch = measured_architecture(args.config_dir, args.layers)
    plan = cpu_plan(arch, args.samples * args.tokens)
    with tempfile.TemporaryDirectory(prefix="dapo-train-memory-") as tmp:
        work = Path(tmp)
        start = time.perf_counter()
        built = _run_phase("build", args, work, timeout_s=900)
        baseline = _run_phase("baseline", args, work, timeout_s=300)
        step = _run_phase("step", args, work, timeout_s=STEP_TIMEOUT_S + 120)
        seconds = time.perf_counter() - start
    if built["params"] != plan.params:
        raise SystemExit(f"the built model has {built['params']} parameters, the plan counts {plan.params}")
    rank_peak = step["rank_peak_kib_rusage"]
    figures = compare(plan, baseline["baseline_kib"], rank_peak)
    print(f"{arch.name}, {arch.layers} layers, {plan.params:,} parameters; {args.samples} x {args.tokens} tokens, "
          f"fp32 ZeRO-1, 1 process, activation checkpointing")
    print(_table(plan, figures, baseline["baseline_kib"], rank_peak))
    result = {
        "model": arch.name, "layers": arch.layers, "params": plan.params, "samples": args.samples,
        "tokens_per_sequence": args.tokens, "tokens_per_micro_batch": plan.tokens_per_micro_batch,
        "plan_terms_bytes": plan_terms(plan),
        **figures,
        "baseline_kib": baseline["baseline_kib"], "step": step, "seconds_total": seconds,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "measured_at": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    _write(args.out, result)
    return 0


def plan_terms(plan: CpuPlan) -> dict[str, int]:
    """The plan's terms as the result file records them."""
    return {
        "weights": plan.weights, "gradients": plan.gradients, "optimizer_state": plan.optimizer_state,
        "activations_layer_inputs": plan.activations.checkpoints,
        "activations_one_layer": plan.activations.layer_working_set, "activations_logits": plan.activations.logits,
        "optimizer_step_transients": plan.optimizer_step,
    }


def recompare(out: Path, config_dir: Path) -> int:
    """Compare the measurement recorded in ``out`` with today's plan; rewrite its plan figures only."""
    result = json.loads(out.read_text())
    arch = measured_architecture(config_dir, result["layers"])
    plan = cpu_plan(arch, result["samples"] * result["tokens_per_sequence"])
    if plan.params != result["params"]:
        raise SystemExit(f"{out}: measured {result['params']} parameters, the plan counts {plan.params}")
    figures = compare(plan, result["baseline_kib"], result["step"]["rank_peak_kib_rusage"])
    print(_table(plan, figures, result["baseline_kib"], result["step"]["rank_peak_kib_rusage"]))
    _write(out, {**result, "plan_terms_bytes": plan_terms(plan), **figures,
                 "plan_compared_at": time.strftime("%Y-%m-%d %H:%M:%S")})
    return 0


def _write(out: Path, result: dict[str, Any]) -> None:
    sys.path.insert(0, str(REPO / "benchmarks"))
    from result_file import write_result

    write_result(out, result)


if __name__ == "__main__":
    raise SystemExit(main())
