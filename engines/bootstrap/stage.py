"""The step-0 policy checkpoint, built offline or imported from a local folder.

Three sources:
- ``tiny``: build the character tokenizer and a small random Qwen2 model, then a short
  supervised warm-up on the worked solutions of the train split's synthetic problems, stopped
  when greedy accuracy on held-out (test split) problems enters a band (default 20-50 %), so
  that RL has room to improve (engines/bootstrap/tiny_policy.py, engines/bootstrap/tiny_warmup.py). Its lineage
  lists the problems it was warmed up on (``warmup_problem_ids``).
- ``shipped:NAME``: a step-0 policy shipped with the repository (``assets/policies/NAME``), made
  once by the ``tiny`` warm-up and imported as is. Its weights are the same on every machine,
  where a warm-up's are not (CPU numerics differ between processor models, and the warm-up's
  stopping step with them), so the default run starts from the same policy everywhere, as a
  real DAPO run starts from a published base model.
- a path to a local HF model folder (e.g. a real Qwen2.5 checkpoint on a GPU cluster): its
  weights, config and tokenizer files (never its optimizer state or other files) copied, or
  linked file by file, as the step-0 checkpoint with ``dapo_checkpoint.json`` added; a
  folder that is itself a published checkpoint (a shipped policy) keeps its lineage under
  ``source_checkpoint``.

Either way the result is a published checkpoint (storage/checkpoints.py): built in a staging
folder and renamed into place, with its lineage (config, input shards, warm-up history).
:func:`warmup_problem_ids` reads back which problems a step-0 policy was warmed up on, so the
driver can refuse a held-out set the policy has already seen."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engines.runtime.threads import cpu_threads
from settings.bootstrap import BootstrapConfig
from storage import checkpoints, run_store

if TYPE_CHECKING:  # heavy stacks (torch, transformers) are imported only when a policy is built
    from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM

    from engines.bootstrap.tiny_warmup import WarmupResult


class BootstrapError(RuntimeError):
    """The step-0 policy could not be built or imported (the message says why and where)."""


_REQUIRED_IMPORT_FILES = ("config.json",)
SHIPPED_PREFIX = "shipped:"
SHIPPED_DIR = Path(__file__).resolve().parents[2] / "assets" / "policies"


def resolve_source(source: str) -> str:
    """``bootstrap.source`` as the builder reads it: ``tiny``, or a folder (path or object-store URI).

    ``shipped:NAME`` names ``assets/policies/NAME`` of this checkout; an unknown name is an error
    listing the shipped ones.
    """
    if not source.startswith(SHIPPED_PREFIX):
        return source
    name = source[len(SHIPPED_PREFIX):]
    folder = SHIPPED_DIR / name
    if not name or "/" in name or not (folder / checkpoints.METADATA_FILE).is_file():
        shipped = sorted(p.name for p in SHIPPED_DIR.iterdir() if (p / checkpoints.METADATA_FILE).is_file()) \
            if SHIPPED_DIR.is_dir() else []
        raise BootstrapError(f"bootstrap.source={source!r}: no shipped policy {name!r} in {SHIPPED_DIR} "
                             f"(shipped: {', '.join(SHIPPED_PREFIX + n for n in shipped) or 'none'})")
    return str(folder)


def source_folders(source: str) -> list[str]:
    """The local folder a source is imported from (for the bootstrap call's cache key), or none."""
    resolved = resolve_source(source)
    return [] if resolved == "tiny" or run_store.is_remote(resolved) else [resolved]


def warmup_problem_ids(checkpoint_dir: str | Path) -> set[str] | None:
    """The problem ids a step-0 checkpoint was warmed up on, from its lineage (its own, or that of
    the published checkpoint it was imported from); None when it records none (an imported model
    of unknown training data)."""
    info = checkpoints.read_info(checkpoint_dir)
    for inputs in (info.inputs, info.inputs.get("source_checkpoint", {}).get("inputs", {})):
        if "warmup_problem_ids" in inputs:
            return set(inputs["warmup_problem_ids"])
    return None


def check_import_folder(source_dir: str | Path) -> Path:
    """The local HF model folder ``source_dir``, resolved, once it holds what an import needs
    (``config.json``, ``*.safetensors`` weights, tokenizer files); a :class:`BootstrapError` naming
    the folder and what it lacks otherwise."""
    source_dir = Path(source_dir).expanduser().resolve()
    if not source_dir.is_dir():
        raise BootstrapError(f"bootstrap source {source_dir}: not a folder (bootstrap.source is 'tiny', "
                             "'shipped:NAME', a local HF model folder or an object-store URI)")
    missing = [name for name in _REQUIRED_IMPORT_FILES if not (source_dir / name).is_file()]
    if missing:
        raise BootstrapError(f"bootstrap source {source_dir}: not an HF model folder (missing {missing})")
    if not any(source_dir.glob("*.safetensors")):
        raise BootstrapError(f"bootstrap source {source_dir}: no *.safetensors weights (convert .bin weights first)")
    if not (source_dir / "tokenizer.json").is_file() and not (source_dir / "tokenizer_config.json").is_file():
        raise BootstrapError(f"bootstrap source {source_dir}: no tokenizer files (tokenizer.json / tokenizer_config.json)")
    return source_dir


def _model_files(source_dir: Path) -> list[Path]:
    """The files an import takes from ``source_dir``: weights (safetensors), config and tokenizer.

    Never its optimizer state (``ds_state/``: pickles that DeepSpeed would unpickle, running any
    code a crafted folder put there, when the run's first step resumed it), pickled ``.bin``
    weights, code or anything else; the run's optimizer starts fresh at step 0.
    """
    return [path for path in sorted(source_dir.iterdir()) if path.is_file() and checkpoints.is_model_file(path.name)]


def import_local_model(source_dir: str | Path, out_dir: str | Path, *, link: bool = False) -> Path:
    """Publish a local HF model folder as the step-0 checkpoint at ``out_dir``: its weights, config and
    tokenizer files (:func:`_model_files`).

    Files are copied (or symlinked with ``link``: fast for large models, but the checkpoint then
    depends on the source staying in place). The checkpoint id digests the weight files.
    """
    source_dir = check_import_folder(source_dir)
    out_dir = Path(out_dir)
    if checkpoints.is_complete(out_dir):
        info = checkpoints.read_info(out_dir)
        if info.inputs.get("source") == str(source_dir):
            return out_dir  # an earlier run imported the same folder
    staging = checkpoints.staging_dir(out_dir)
    try:
        for path in _model_files(source_dir):
            target = staging / path.name
            if link:
                os.symlink(path, target)
            else:
                shutil.copy2(path, target)
        inputs: dict[str, Any] = {"source": str(source_dir), "linked": link}
        if checkpoints.is_complete(source_dir):  # a published checkpoint (a shipped policy): keep its lineage
            origin = checkpoints.read_info(source_dir)
            inputs["source_checkpoint"] = {"checkpoint_id": origin.checkpoint_id, "produced_by": origin.produced_by,
                                           "inputs": origin.inputs}
        info = checkpoints.CheckpointInfo(
            checkpoint_id=checkpoints.make_checkpoint_id("import", 0, staging),
            step=0,
            parent_checkpoint_id=None,
            produced_by="import",
            inputs=inputs,
        )
        return checkpoints.publish(staging, out_dir, info)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def _shard_examples(
    train_paths: list[str], test_paths: list[str], eval_problems: int, max_check_lines: int
) -> tuple[list[tuple[str, str]], list[tuple[str, int]], list[str]]:
    """(prompt, worked solution) pairs from train Problem shards, (prompt, answer) from test ones,
    and the problem ids of the train pairs.

    Only synthetic chains have a worked solution; other rows cannot be warmed up on and are
    skipped. No usable row at all is an error naming the files.
    """
    import schemas
    from readers.synthetic import check_line_count, parse_terms, worked_solution

    def usable(paths: list[str]) -> list[dict[str, Any]]:
        rows = []
        for row in schemas.read_shards(paths, schemas.Problem).to_pylist():
            try:
                parse_terms(row["problem"])
            except ValueError:
                continue
            rows.append(row)
        return rows

    train_rows, test_rows = usable(train_paths), usable(test_paths)
    if not train_rows:
        raise BootstrapError(f"no synthetic arithmetic problems to warm up on in train shards {train_paths}")
    if not test_rows:
        raise BootstrapError(f"no synthetic arithmetic problems to check accuracy on in test shards {test_paths}")
    train = [(r["prompt"], worked_solution(r["problem"], check_line_count(r["problem"], max_check_lines)))
             for r in train_rows]
    heldout = [(r["prompt"], int(r["answer"])) for r in test_rows[:eval_problems]]
    return train, heldout, [r["problem_id"] for r in train_rows]


def _synthetic_examples(config: BootstrapConfig) -> tuple[list[tuple[str, str]], list[tuple[str, int]], list[str]]:
    from dapo_core.answers import problem_id
    from engines.bootstrap.tiny_warmup import draw_problems, synthetic_examples

    difficulty = dict(min_terms=config.min_terms, max_terms=config.max_terms, max_operand=config.max_operand)
    train_problems = draw_problems(random.Random(config.seed), config.synthetic_train_problems, split="train", **difficulty)
    test_problems = draw_problems(random.Random(config.seed + 1), config.eval_problems, split="test", **difficulty)
    train, _ = synthetic_examples(train_problems, config.max_check_lines)
    _, heldout = synthetic_examples(test_problems)
    return train, heldout, [problem_id(text) for text, _ in train_problems]


def _tiny_lineage(config: BootstrapConfig, train_paths: list[str] | None, test_paths: list[str] | None) -> dict[str, Any]:
    """What the tiny policy is built from: the config and the input shards' names."""
    return {
        "kind": "tiny-warmup",
        "config": asdict(config),
        "train_shards": sorted(Path(p).name for p in train_paths or []),
        "test_shards": sorted(Path(p).name for p in test_paths or []),
    }


def _published_from(out_dir: Path, lineage: dict[str, Any]) -> bool:
    """True when ``out_dir`` holds a checkpoint already published from this lineage."""
    if not checkpoints.is_complete(out_dir):
        return False
    info = checkpoints.read_info(out_dir)
    return {k: info.inputs.get(k) for k in lineage} == lineage


def _warm_up_examples(
    config: BootstrapConfig, train_paths: list[str] | None, test_paths: list[str] | None
) -> tuple[list[tuple[str, str]], list[tuple[str, int]], list[str]]:
    """(prompt, worked solution) training pairs, (prompt, answer) held-out pairs and the training
    pairs' problem ids: from the Problem shards when given, else drawn synthetic problems."""
    if train_paths:
        return _shard_examples(list(train_paths), list(test_paths or []), config.eval_problems, config.max_check_lines)
    return _synthetic_examples(config)


def _warmed_up_model(
    config: BootstrapConfig, train: list[tuple[str, str]], heldout: list[tuple[str, int]]
) -> tuple[Qwen2ForCausalLM, PreTrainedTokenizerFast, WarmupResult]:
    """Build the tokenizer and the random model, and warm the model up on ``train``."""
    from engines.bootstrap import tiny_policy, tiny_warmup

    tokenizer = tiny_policy.build_tokenizer()
    model = tiny_policy.build_random_model(
        tokenizer, seed=config.seed, num_layers=config.num_layers, hidden_size=config.hidden_size,
        num_heads=config.num_heads,
    )
    max_new_tokens = max(len(tokenizer(response).input_ids) for _, response in train) + 8
    result = tiny_warmup.warm_up(
        model, tokenizer, train, heldout,
        seed=config.seed,
        batch_size=config.batch_size,
        learning_rate=config.learning_rate,
        max_steps=config.max_steps,
        eval_every_steps=config.eval_every_steps,
        max_new_tokens=max_new_tokens,
        target_accuracy_low=config.target_accuracy_low,
        target_accuracy_high=config.target_accuracy_high,
    )
    return model, tokenizer, result


def _check_in_band(result: WarmupResult, config: BootstrapConfig) -> None:
    """With ``require_band``, a warm-up that ended outside the accuracy band is an error."""
    if result.stop_reason != "in_band" and config.require_band:
        raise BootstrapError(
            f"warm-up ended after {result.steps} steps at held-out accuracy {result.heldout_accuracy:.1%}, "
            f"outside [{config.target_accuracy_low:.0%}, {config.target_accuracy_high:.0%}]; history "
            f"{list(result.history)}; raise max_steps, change learning_rate/difficulty, or set require_band=false"
        )


def build_tiny_policy(
    out_dir: str | Path,
    config: BootstrapConfig,
    train_paths: list[str] | None = None,
    test_paths: list[str] | None = None,
) -> Path:
    """Build, warm up and publish the tiny policy at ``out_dir``; returns the folder.

    With Problem shards, the warm-up trains on the train split and checks the test split;
    without, it draws synthetic problems with the config's difficulty. An ``out_dir`` already
    published from the same config and inputs is returned as is (no retraining).
    """
    import torch

    from engines.bootstrap import tiny_policy

    lineage = _tiny_lineage(config, train_paths, test_paths)
    out_dir = Path(out_dir)
    if _published_from(out_dir, lineage):
        return out_dir
    torch.set_flush_denormal(True)  # 3-10x slower small models without it on this CPU
    torch.set_num_threads(cpu_threads(config.cpu_threads))
    train, heldout, train_ids = _warm_up_examples(config, train_paths, test_paths)
    model, tokenizer, result = _warmed_up_model(config, train, heldout)
    _check_in_band(result, config)
    lineage["warmup"] = dataclasses.asdict(result)
    lineage["train_examples"] = len(train)
    lineage["heldout_problems"] = len(heldout)
    lineage["warmup_problem_ids"] = sorted(set(train_ids))  # what warmup_problem_ids() reads back
    return tiny_policy.save_checkpoint(
        model, tokenizer, out_dir, step=0, produced_by="bootstrap", parent_checkpoint_id=None, inputs=lineage
    )


def bootstrap_policy(
    out_dir: str | Path,
    config: BootstrapConfig,
    train_paths: list[str] | None = None,
    test_paths: list[str] | None = None,
) -> Path:
    """The step-0 checkpoint at ``out_dir``: the tiny warmed-up policy, or an imported folder."""
    source = resolve_source(config.source)
    if source == "tiny":
        return build_tiny_policy(out_dir, config, train_paths, test_paths)
    return import_local_model(source, out_dir, link=config.link_import)


def policy_tokenizer_folder(source: str, scratch: Path) -> Path:
    """A folder holding the step-0 policy's tokenizer and ``config.json``, before the policy exists.

    Lets the driver check every prompt against the model's context right after curation, before
    the warm-up or import: ``tiny`` builds the character tokenizer (cheap, deterministic) with
    the tiny model's context; a local HF folder is used as is; an object-store folder has only
    its tokenizer and config files fetched into ``scratch`` (not the weights).
    """
    source = resolve_source(source)
    if source == "tiny":
        from engines.bootstrap import tiny_policy

        tiny_policy.build_tokenizer(scratch)
        # model_type as the tiny checkpoint's config says it: transformers picks the tokenizer
        # class by it, and the class decides how characters outside the alphabet count.
        config = {"model_type": "qwen2", "max_position_embeddings": tiny_policy.DEFAULT_MAX_POSITIONS}
        (scratch / "config.json").write_text(json.dumps(config) + "\n")
        return scratch
    if not run_store.is_remote(source):
        return check_import_folder(source)  # a missing or incomplete folder is refused here, not after the warm-up
    for name in ("config.json", *checkpoints.TOKENIZER_FILES):  # the context length and the tokenizer, no weights
        remote = run_store.join(source, name)
        if run_store.exists(remote):
            shutil.copyfile(run_store.fetch(remote), scratch / name)
    if not (scratch / "config.json").is_file():
        raise BootstrapError(f"bootstrap source {source}: no config.json there (not an HF model folder)")
    return scratch
