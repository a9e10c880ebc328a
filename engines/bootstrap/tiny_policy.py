"""The tiny offline policy: a character tokenizer and a small Qwen2 model, published as a checkpoint.

Nothing can be downloaded from a model hub, so the default pipeline trains a policy it builds
itself. The tokenizer is one token per character of ``readers.synthetic.ALPHABET`` plus special
tokens, built with the ``tokenizers`` library and saved as ``tokenizer.json`` +
``tokenizer_config.json`` (with a chat template that renders the last user message verbatim), so
vLLM and transformers both load it. The model is transformers' ``Qwen2ForCausalLM`` in fp32 (so
the rollout engine's log-probs match the trainer's, see engines/rollout/stage.py), saved with
``save_pretrained`` (safetensors) as a published checkpoint (storage/checkpoints.py).

Its supervised warm-up on worked solutions, stopped inside a band of held-out accuracy so that RL
has room to improve, is engines/bootstrap/tiny_warmup.py.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    GenerationConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from readers.synthetic import ALPHABET
from storage import checkpoints

PAD_TOKEN = "<pad>"
EOS_TOKEN = "<eos>"
UNK_TOKEN = "<unk>"
SPECIAL_TOKENS = (PAD_TOKEN, EOS_TOKEN, UNK_TOKEN)  # ids 0, 1, 2; characters follow
# Renders only the last user message's content, and nothing for the generation prompt, so
# apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True) == p.
CHAT_TEMPLATE = "{{ messages[-1]['content'] }}"
# Longest prompt + response (characters = tokens) the tiny model is built for.
DEFAULT_MAX_POSITIONS = 256


def render_prompt(problem_text: str) -> str:
    """The tiny task's prompt template: ``"37+5-18"`` -> ``"37+5-18=\\n"`` (docs/ARCHITECTURE.md)."""
    return f"{problem_text}=\n"


def _byte_level_char(byte: int) -> str:
    """The printable stand-in byte-level BPE uses for one byte (GPT-2's byte-to-unicode table).

    Printable Latin-1 bytes stand for themselves; the others (space, newline, controls...) are
    shifted to code points from 256 up, in byte order: space -> "Ġ", newline -> "Ċ".
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    if byte in printable:
        return chr(byte)
    shifted = [b for b in range(256) if b not in printable]
    return chr(256 + shifted.index(byte))


def _vocabulary() -> dict[str, int]:
    chars = list(dict.fromkeys(ALPHABET))  # unique, in ALPHABET's order (stable ids)
    if any(len(c.encode()) != 1 for c in chars):
        raise ValueError("the tiny tokenizer needs single-byte characters in ALPHABET")
    pieces = [_byte_level_char(c.encode()[0]) for c in chars]
    return {tok: i for i, tok in enumerate([*SPECIAL_TOKENS, *pieces])}


def build_tokenizer(out_dir: str | Path | None = None) -> PreTrainedTokenizerFast:
    """Build the character tokenizer; if ``out_dir`` is given, save its files there.

    Every character of ``ALPHABET`` is one token. It is a byte-level BPE with no merges, so each
    character is its own token. Why byte-level BPE and not a plain character vocabulary:
    transformers 5 loads a folder whose config says ``qwen2`` with its own ``Qwen2Tokenizer``,
    which rebuilds a byte-level BPE from the vocabulary and merges in ``tokenizer.json`` and
    ignores the saved pre-tokenizer; a plain character vocabulary then silently loses spaces and
    newlines. This layout tokenizes identically whichever class (and so vLLM) loads it.
    Returns a ``PreTrainedTokenizerFast`` with pad/eos/unk set and the chat template.
    """
    vocab = _vocabulary()
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK_TOKEN))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(list(SPECIAL_TOKENS))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        model_max_length=DEFAULT_MAX_POSITIONS,
        padding_side="left",  # batched generation needs prompts right-aligned
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    if out_dir is not None:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        save_tokenizer(tokenizer, out_dir)
    return tokenizer


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, out_dir: str | Path) -> None:
    """Save tokenizer files with the chat template inside ``tokenizer_config.json`` (no .jinja)."""
    tokenizer.save_pretrained(out_dir, save_jinja_files=False)


def build_random_model(
    tokenizer: PreTrainedTokenizerFast,
    *,
    seed: int = 0,
    num_layers: int = 3,
    hidden_size: int = 128,
    num_heads: int = 2,
    intermediate_size: int | None = None,
    max_positions: int = DEFAULT_MAX_POSITIONS,
) -> Qwen2ForCausalLM:
    """A Qwen2 causal LM with random (seeded) fp32 weights over ``tokenizer``'s vocabulary.

    Embeddings are tied (the output projection reuses them): with a ~25-symbol vocabulary this
    changes little, and it keeps the parameter count down.
    """
    if hidden_size % num_heads != 0:
        raise ValueError(f"hidden_size {hidden_size} is not divisible by num_heads {num_heads}")
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(torch.float32)
    # Fresh generation config: no sampling defaults (vLLM would pick them up as its defaults).
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return model


def save_checkpoint(
    model: Qwen2ForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    out_dir: str | Path,
    *,
    step: int,
    produced_by: str,
    parent_checkpoint_id: str | None,
    inputs: dict,
) -> Path:
    """Save model + tokenizer as an HF folder and publish it atomically at ``out_dir``."""
    out_dir = Path(out_dir)
    staging = checkpoints.staging_dir(out_dir)
    try:
        model.save_pretrained(staging, safe_serialization=True)
        save_tokenizer(tokenizer, staging)
        info = checkpoints.CheckpointInfo(
            checkpoint_id=checkpoints.make_checkpoint_id(produced_by, step, staging),
            step=step,
            parent_checkpoint_id=parent_checkpoint_id,
            produced_by=produced_by,
            inputs=inputs,
        )
        return checkpoints.publish(staging, out_dir, info)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def build_random_checkpoint(
    out_dir: str | Path,
    *,
    seed: int = 0,
    num_layers: int = 3,
    hidden_size: int = 128,
    num_heads: int = 2,
) -> Path:
    """Publish a step-0 checkpoint with random weights and the tiny tokenizer at ``out_dir``.

    Same arguments -> byte-identical weights (and so the same checkpoint id).
    """
    tokenizer = build_tokenizer()
    model = build_random_model(
        tokenizer, seed=seed, num_layers=num_layers, hidden_size=hidden_size, num_heads=num_heads
    )
    return save_checkpoint(
        model,
        tokenizer,
        out_dir,
        step=0,
        produced_by="bootstrap",
        parent_checkpoint_id=None,
        inputs={
            "kind": "random",
            "seed": seed,
            "num_layers": num_layers,
            "hidden_size": hidden_size,
            "num_heads": num_heads,
        },
    )
