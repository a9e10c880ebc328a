"""What a training launch reads from and writes into checkpoint folders.

- **resume** (``resumes_optimizer_state``, ``load_ds_state``): whether a step restores the
  parent's DeepSpeed state (Adam moments, update count, LR schedule) from its ``ds_state/`` (only
  a train step's state that its digest record vouches for), and restoring it with the weights-only
  unpickler, refusing a layout (world size, ZeRO stage) that ZeRO's per-rank partitions cannot be
  loaded into.
- **save/export** (``save_and_export``): the DeepSpeed checkpoint (``ds_state/``, with optimizer
  state, and ``DS_META_FILE`` recording its layout and update count) and the consolidated HF
  checkpoint (safetensors + config + tokenizer files) into the staging folder;
  ``engines/train/launch.py`` publishes it.
- **serve mode** (``ds_state_matches``): whether the in-memory engine is exactly what resuming
  from a parent's ``ds_state/`` would give, so a warm group may continue without reloading.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import importlib
import json
import pickle
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from engines.runtime.environ import overlay
from engines.train.spec import DS_META_FILE, DS_STATE_DIR, TrainStepFailure, WorkerSpec
from schemas.disk_space import writing
from settings.train import TrainConfig

if TYPE_CHECKING:
    from deepspeed import DeepSpeedEngine

# Files of the parent checkpoint that are not copied into the next one (rewritten or not ours).
_NOT_COPIED = {"config.json", "generation_config.json", "dapo_checkpoint.json", "train_metrics.parquet",
               "train_timings.json"}


def resumes_optimizer_state(checkpoint: str | Path, *, resume_optimizer: bool) -> bool:
    """True when a step from ``checkpoint`` (a path or a URI) restores its DeepSpeed state: asked to,
    the checkpoint was published by a training step (a step-0 policy starts a fresh optimizer, an
    imported one too), the state is there, and the checkpoint's digest record vouches for every file
    of it (storage/checkpoints.py: unvouched_optimizer_state): DeepSpeed's state is pickles, which
    are never loaded from a folder the pipeline did not record (and then only with the weights-only
    unpickler, :func:`load_ds_state`). Whoever starts the step refuses a step>0 parent whose state
    it was asked to resume and cannot (engines/train/launch.py: schedule_start)."""
    from storage import checkpoints, run_store  # not at import: the worker processes never need it

    return (resume_optimizer and checkpoints.read_info(checkpoint).produced_by == "train"
            and run_store.exists(run_store.join(str(checkpoint), DS_STATE_DIR, DS_META_FILE))
            and not checkpoints.unvouched_optimizer_state(checkpoint))


def writes_optimizer_state(step: int, config: TrainConfig) -> bool:
    """Whether the checkpoint of training step ``step`` holds its ds_state/ (settings/train.py:
    keep_optimizer_state, optimizer_state_every): only steps divisible by ``optimizer_state_every``,
    the last step of a run included (a cold start after it replays at most K - 1 steps:
    engines/train/replay.py)."""
    return config.keep_optimizer_state and step % config.optimizer_state_every == 0


def parent_fetch_skip(*, resume: bool, other_ranks_state: tuple[str, ...] = ()) -> tuple[str, ...]:
    """``run_store.fetch`` skip patterns for the parent of a training step: its HF weights when the
    step resumes the parent's DeepSpeed state (which restores every weight; engines/train/engine.py:
    load_policy builds the model from the config), else its optimizer state; and ``other_ranks_state``,
    the partitions this node's ranks do not load."""
    from storage.checkpoints import WEIGHT_SUFFIXES  # not at import: the worker processes never need it

    weights = tuple(f"*{suffix}" for suffix in WEIGHT_SUFFIXES)
    return (*weights, *other_ranks_state) if resume else (f"{DS_STATE_DIR}/*",)


def load_ds_state(engine: DeepSpeedEngine, state_dir: Path, *, world_size: int, zero_stage: int) -> int:
    """Restore ``state_dir`` (a parent's ds_state/) into ``engine``; returns the updates done so far."""
    meta_path = state_dir / DS_META_FILE
    if not meta_path.is_file():
        raise TrainStepFailure(
            f"{state_dir}: no DeepSpeed state to resume ({DS_META_FILE} missing; with train.optimizer_state_every > 1 "
            "a parent without it continues only in the warm group that trained it: run the step again, which "
            "rebuilds the state by replay, engines/train/replay.py)")
    meta = json.loads(meta_path.read_text())
    # ZeRO partitions optimizer state by rank: a different layout cannot be loaded as is.
    for key, now in (("world_size", world_size), ("zero_stage", zero_stage)):
        if meta[key] != now:
            raise TrainStepFailure(
                f"{state_dir}: optimizer state was saved with {key}={meta[key]} but this step runs with "
                f"{key}={now}; keep them equal or set resume_optimizer=False to start a fresh optimizer"
            )
    try:
        with weights_only_unpickling():
            path, _ = engine.load_checkpoint(
                str(state_dir), tag=meta["tag"], load_optimizer_states=True, load_lr_scheduler_states=True
            )
    except pickle.UnpicklingError as err:
        named = re.search(r"Unsupported global: GLOBAL (\S+)", str(err))
        why = f"it asks for {named.group(1)}" if named else "not a weights-only pickle"
        raise TrainStepFailure(f"{state_dir}: refused to load the optimizer state: it holds more than tensors and "
                               f"DeepSpeed's own records ({why}); it was not written by this pipeline's training") from err
    if path is None:
        raise TrainStepFailure(f"{state_dir}: DeepSpeed could not load tag {meta['tag']!r}")
    return int(meta["updates_done"])


# What DeepSpeed's checkpoint files hold besides tensors and plain containers (ZeRO 1-3, fp32 and
# bf16, from its optimizer's state): data-only classes, rebuilt from their fields without running code.
_DEEPSPEED_RECORDS = (
    ("deepspeed.runtime.fp16.loss_scaler", "LossScaler"),
    ("deepspeed.runtime.zero.config", "ZeroStageEnum"),
    ("deepspeed.utils.tensor_fragment", "fragment_address"),
)


@contextlib.contextmanager
def weights_only_unpickling() -> Iterator[None]:
    """Every ``torch.load`` inside uses torch's weights-only unpickler, which builds tensors,
    containers and the allowed DeepSpeed records only, and refuses any other object
    (``pickle.UnpicklingError``) instead of calling it: DeepSpeed loads its checkpoint with
    ``weights_only=False``, which runs whatever a crafted ``ds_state/*.pt`` asks for (a
    ``__reduce__``). ``TORCH_FORCE_WEIGHTS_ONLY_LOAD`` overrides the argument torch is given."""
    allowed = [getattr(importlib.import_module(module), name) for module, name in _DEEPSPEED_RECORDS]
    with overlay({_FORCE_WEIGHTS_ONLY: "1"}), torch.serialization.safe_globals(allowed):
        yield


_FORCE_WEIGHTS_ONLY = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"


def full_fp32_state(engine: DeepSpeedEngine, *, rank: int) -> dict[str, torch.Tensor]:
    """The full fp32 weights, consolidated on rank 0 (empty dict on other ranks).

    Collective where it must be (every rank calls it): the optimizer's fp32 master copy is
    gathered where the module does not hold the full fp32 weights (bf16, ZeRO-3). Plain fp32 under
    ZeRO 1/2 does: after every update DeepSpeed copies the master partitions into the module's
    parameters and all-gathers them, so those are read as they are, bit-equal to the master and with
    no collective (asking DeepSpeed anyway costs one all-reduce of a full-size tensor per
    parameter). Every rank takes the same branch per parameter, so the collectives stay in one
    order.
    """
    from deepspeed.utils import safe_get_full_fp32_param

    module_is_full = engine.zero_optimization_stage() < 3
    state: dict[str, torch.Tensor] = {}
    for name, param in engine.module.named_parameters():
        if module_is_full and param.dtype == torch.float32:
            full = param.detach()
        else:
            full = safe_get_full_fp32_param(param)
            if full is None:
                full = param.detach()
        if rank == 0:
            state[name] = full.detach().float().cpu().clone()
    return state


def save_and_export(engine: DeepSpeedEngine, spec: WorkerSpec, *, rank: int, world_size: int,
                    updates_done: int, last_step: int) -> dict[str, float]:
    """Write ds_state/ (all ranks) and the consolidated HF export (rank 0) into ``spec.out_dir``.

    Collective: every rank calls it. Rank 0 writes the HF export on a thread while DeepSpeed
    writes its state (two writers of separate files: 47 -> 37 ms a step for the tiny policy,
    benchmarks/RESULTS.md). The weights are consolidated
    first, the only collective step of the export, so every rank runs the collectives in one
    order. Returns the seconds of the save, of the export (they overlap) and of both together.
    """
    out = Path(spec.out_dir)
    state_dir = out / DS_STATE_DIR
    tag = f"step{last_step:06d}"
    t0 = time.perf_counter()
    state = full_fp32_state(engine, rank=rank)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        export = (pool.submit(_timed, export_hf, state, Path(spec.parent_checkpoint), spec.train.precision, out)
                  if rank == 0 else None)
        t_save = time.perf_counter()
        if spec.write_state:
            with writing(state_dir, "the DeepSpeed optimizer state"):
                engine.save_checkpoint(str(state_dir), tag=tag)
        timings = {"ds_save_s": time.perf_counter() - t_save}
        export_s = export.result() if export is not None else 0.0  # re-raises the export's error
    if rank == 0 and spec.write_state:
        meta = {"tag": tag, "world_size": world_size, "zero_stage": spec.train.zero_stage,
                "precision": spec.train.precision, "updates_done": updates_done, "step": last_step}
        (state_dir / DS_META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    dist.barrier()
    timings["export_s"] = export_s + (t_save - t0)  # the consolidation, then the export's own time
    timings["save_export_s"] = time.perf_counter() - t0  # both, as the step waited for them
    return timings


def _timed(fn: Callable[..., None], *args: object) -> float:
    started = time.perf_counter()
    fn(*args)
    return time.perf_counter() - started


# What the export writes besides the weights, for one parent config and precision; kept between the
# steps of a warm worker, so only its first export builds the parent's model.
_export_layout: _ExportLayout | None = None

# transformers' save_pretrained default: one safetensors file up to this size, then shards + index.
_MAX_SHARD_SIZE = "50GB"
_EXPORT_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class _ExportLayout:
    """What ``save_pretrained`` writes for the parent's architecture at a precision, apart from the
    trained weights: its JSON files, the parameter names and the persistent buffers."""

    key: tuple[bytes, str]  # (the parent's config.json bytes, precision)
    json_files: dict[str, bytes]  # config.json (dtype, architectures) and generation_config.json
    parameters: frozenset[str]  # parameter names, tied ones once (as named_parameters gives them)
    buffers: dict[str, torch.Tensor]  # persistent buffers, saved beside the weights


def _layout_for(parent: Path, precision: str) -> _ExportLayout:
    """The parent's export layout at ``precision``, built once per parent config (the model is not kept).

    Built from the parent's config on the meta device: no weights are read or held, so a train node
    needs the parent's config files, not its weights (a fresh train pod built it at every step: a
    Qwen2.5-32B loaded on rank 0's CPU). An architecture with persistent buffers, whose values only
    the weights file holds, is loaded whole instead.
    """
    global _export_layout
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    key = ((parent / "config.json").read_bytes(), precision)
    if _export_layout is None or _export_layout.key != key:
        _export_layout = None  # drop the old one before building the next
        dtype = _EXPORT_DTYPES[precision]
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(parent), dtype=dtype)
        if (parent / "generation_config.json").is_file():
            model.generation_config = GenerationConfig.from_pretrained(parent)
        all_parameters = dict(model.named_parameters(remove_duplicate=False))
        if any(name not in all_parameters for name in model.state_dict()):  # persistent buffers: their values
            model = AutoModelForCausalLM.from_pretrained(parent, dtype=dtype)
            all_parameters = dict(model.named_parameters(remove_duplicate=False))
        with tempfile.TemporaryDirectory() as tmp:
            # save_pretrained sets this before writing the config (from_pretrained set the dtype).
            model.config.architectures = [type(model).__name__]
            model.config.save_pretrained(tmp)
            if model.can_generate() and model.generation_config is not None:
                model.generation_config.save_pretrained(tmp)
            json_files = {p.name: p.read_bytes() for p in sorted(Path(tmp).iterdir())}
        _export_layout = _ExportLayout(
            key=key,
            json_files=json_files,
            parameters=frozenset(name for name, _ in model.named_parameters()),
            buffers={k: v.detach().clone() for k, v in model.state_dict().items() if k not in all_parameters},
        )
    return _export_layout


def export_hf(state: dict[str, torch.Tensor], parent: Path, precision: str, out: Path) -> None:
    """Rank 0: the consolidated weights ``state`` (fp32, named as the parent's parameters, tied ones
    once) written into ``out`` as an HF checkpoint of the parent's architecture at ``precision``.

    Writes what ``save_pretrained`` of the parent's model loaded with ``state`` writes (the same
    JSON files and tensors; tests/unit/test_train_export.py holds it to that) without loading
    the weights into a model kept for it, so rank 0 no longer holds a second full copy of the
    model between steps (131 GB in fp32 for a 32B policy). For the tiny policy the export takes
    ~13 instead of ~22 ms, but the step does not get shorter: DeepSpeed's save beside it is the
    longer leg, and on this disk it slows when the two writes overlap more (benchmarks/RESULTS.md).
    """
    from huggingface_hub import save_torch_state_dict

    layout = _layout_for(parent, precision)
    missing, unexpected = sorted(layout.parameters - set(state)), sorted(set(state) - layout.parameters)
    if missing or unexpected:
        raise TrainStepFailure(f"export: weights missing {missing[:5]}, unexpected {unexpected[:5]}")
    dtype = _EXPORT_DTYPES[precision]
    tensors = {name: tensor.to(dtype) for name, tensor in state.items()} | layout.buffers
    with writing(out, "the checkpoint's weights"):
        save_torch_state_dict(tensors, out, max_shard_size=_MAX_SHARD_SIZE, metadata={"format": "pt"})
        for name, data in layout.json_files.items():
            (out / name).write_bytes(data)
        _copy_tokenizer_files(parent, out)


def _copy_tokenizer_files(parent: Path, out: Path) -> None:
    for path in parent.iterdir():
        is_weights = path.name.endswith((".safetensors", ".bin", ".pt")) or ".index.json" in path.name
        if path.is_file() and path.name not in _NOT_COPIED and not is_weights:
            shutil.copy2(path, out / path.name)


def ds_state_matches(resume_ds_state: str | None, last_saved: tuple[int, int] | None, *,
                     world_size: int, zero_stage: int) -> bool:
    """True when an engine that last saved ``last_saved`` = (step, updates done) is exactly what
    loading ``resume_ds_state`` would give (same step, update count and layout).

    The owner already checked that the parent is the checkpoint this group last published;
    this re-checks the parent's own record (step and update count) against memory, so a
    bookkeeping slip in the owner falls back to a reload instead of training on wrong state.
    """
    if resume_ds_state is None or last_saved is None:
        return False  # a cold launch would start a fresh optimizer from the HF weights
    meta_path = Path(resume_ds_state) / DS_META_FILE
    if not meta_path.is_file():
        # A parent written without its state (train.optimizer_state_every > 1): its own record's
        # step and update count against memory (the layout is the group's: same key, same config).
        return _record_matches(Path(resume_ds_state).parent, last_saved)
    meta = json.loads(meta_path.read_text())
    return (int(meta["step"]), int(meta["updates_done"])) == last_saved and \
        meta["world_size"] == world_size and meta["zero_stage"] == zero_stage


def _record_matches(checkpoint: Path, last_saved: tuple[int, int]) -> bool:
    """True when ``checkpoint``'s own record (dapo_checkpoint.json) has the (step, updates done) in memory."""
    from storage.checkpoints import METADATA_FILE

    record_path = checkpoint / METADATA_FILE
    if not record_path.is_file():
        return False
    record = json.loads(record_path.read_text())
    return record.get("optimizer_updates") is not None and \
        (int(record["step"]), int(record["optimizer_updates"])) == last_saved
