"""The tiny offline policy: a character tokenizer, a small Qwen2 model, and its supervised warm-up.

Nothing can be downloaded from a model hub, so the default pipeline trains a policy it builds
itself. The tokenizer is one token per character of ``readers.synthetic.ALPHABET`` plus special
tokens, built with the ``tokenizers`` library and saved as ``tokenizer.json`` +
``tokenizer_config.json`` (with a chat template that renders the last user message verbatim), so
vLLM and transformers both load it. The model is transformers' ``Qwen2ForCausalLM`` in fp32 (so
the rollout engine's log-probs match the trainer's, see engines/rollout.py), saved with
``save_pretrained`` (safetensors) as a published checkpoint (storage/checkpoints.py).

The supervised warm-up teaches the worked-solution format on the train split and stops early,
inside a band of greedy accuracy on held-out problems (default 20-50 %), so that RL has room to
improve (a warm-up to ~94 % leaves DAPO nothing to learn; dynamic sampling, paper sec. 3.2, then
discards almost every group as all-correct).
"""

from __future__ import annotations

import hashlib
import random
import re
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    GenerationConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from readers.synthetic import ALPHABET, make_problem, worked_solution
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


# --------------------------------------------------------------------------------------------
# Supervised warm-up
# --------------------------------------------------------------------------------------------

_ANSWER_RE = re.compile(r"Answer:\s*(-?\d+)\s*$")


def synthetic_split(problem_text: str, *, test_fraction_percent: int = 10) -> str:
    """``"train"`` or ``"test"`` for a synthetic problem, fixed by a hash of its text.

    A hash split (not a separate random stream) keeps any problem on one side whatever the
    seed or number of problems drawn, so the held-out accuracy never scores memorised items.
    """
    bucket = int(hashlib.sha256(problem_text.encode()).hexdigest()[:8], 16) % 100
    return "test" if bucket < test_fraction_percent else "train"


def draw_problems(
    rng: random.Random, count: int, *, split: str, min_terms: int, max_terms: int, max_operand: int
) -> list[tuple[str, int]]:
    """``count`` synthetic problems (text, answer) from ``split``, drawn with ``rng``."""
    out: list[tuple[str, int]] = []
    attempts = 0
    while len(out) < count:
        attempts += 1
        if attempts > 1000 * count + 1000:
            raise ValueError(f"could not draw {count} {split!r} problems: the problem space is too small")
        text, answer = make_problem(rng, min_terms=min_terms, max_terms=max_terms, max_operand=max_operand)
        if synthetic_split(text) == split:
            out.append((text, answer))
    return out


def extract_answer(response_text: str) -> int | None:
    """The integer on the response's last ``Answer: N`` line, or None (tiny-task check only)."""
    match = _ANSWER_RE.search(response_text.strip())
    return int(match.group(1)) if match else None


def _supervised_batch(
    tokenizer: PreTrainedTokenizerFast, examples: list[tuple[str, str]]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ``(input_ids, attention_mask, labels)``, each (B, L); labels -100 off the response.

    ``examples`` are (prompt, target response) pairs. The loss covers only the response and EOS:
    the prompt is given, not learned.
    """
    rows, label_rows = [], []
    for prompt, response in examples:
        prompt_ids = tokenizer(prompt, add_special_tokens=False).input_ids
        response_ids = tokenizer(response, add_special_tokens=False).input_ids
        response_ids = [*response_ids, tokenizer.eos_token_id]
        rows.append(prompt_ids + response_ids)
        label_rows.append([-100] * len(prompt_ids) + response_ids)
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, (row, label_row) in enumerate(zip(rows, label_rows)):
        input_ids[i, : len(row)] = torch.tensor(row)
        attention_mask[i, : len(row)] = 1
        labels[i, : len(row)] = torch.tensor(label_row)
    return input_ids, attention_mask, labels


@torch.no_grad()
def greedy_accuracy(
    model: Qwen2ForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    problems: list[tuple[str, int]],
    *,
    max_new_tokens: int,
    batch_size: int = 64,
) -> float:
    """Fraction of ``problems`` ((prompt, answer) pairs) whose greedy response ends with the
    right ``Answer:`` line."""
    was_training = model.training
    model.eval()
    correct = 0
    for start in range(0, len(problems), batch_size):
        chunk = problems[start : start + batch_size]
        enc = tokenizer([prompt for prompt, _ in chunk], return_tensors="pt", padding=True, add_special_tokens=False)
        out = model.generate(
            **enc,
            do_sample=False,
            max_new_tokens=max_new_tokens,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        texts = tokenizer.batch_decode(out[:, enc.input_ids.shape[1] :], skip_special_tokens=True)
        correct += sum(extract_answer(text) == answer for text, (_, answer) in zip(texts, chunk))
    model.train(was_training)
    return correct / len(problems)


def max_solution_tokens(max_terms: int, max_operand: int) -> int:
    """An upper bound on the worked solution's length in tokens (characters) plus EOS.

    Each of the (max_terms - 1) lines is "<total><+/-term>=<new total>\\n" with totals of at most
    len(str(max_terms * max_operand)) + 1 characters (sign); the answer line is "Answer: <total>".
    """
    total_chars = len(str(max_terms * max_operand)) + 1
    line = total_chars + 1 + len(str(max_operand)) + 1 + total_chars + 1
    return (max_terms - 1) * line + len("Answer: ") + total_chars + 1


@dataclass(frozen=True)
class WarmupResult:
    """What the warm-up did: steps run, the held-out accuracy at each check, and why it stopped."""

    steps: int
    heldout_accuracy: float  # greedy accuracy on the held-out problems at the final check
    history: tuple[tuple[int, float], ...]  # (step, held-out greedy accuracy) at each check
    stop_reason: str  # "in_band" | "max_steps"
    seconds: float


def synthetic_examples(
    problems: list[tuple[str, int]],
) -> tuple[list[tuple[str, str]], list[tuple[str, int]]]:
    """(prompt, worked solution) training pairs and (prompt, answer) eval pairs for problems."""
    pairs = [(render_prompt(text), worked_solution(text)) for text, _ in problems]
    return pairs, [(render_prompt(text), answer) for text, answer in problems]


def warm_up(
    model: Qwen2ForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    train_examples: list[tuple[str, str]],
    heldout_problems: list[tuple[str, int]],
    *,
    seed: int,
    batch_size: int,
    learning_rate: float,
    max_steps: int,
    eval_every_steps: int,
    max_new_tokens: int,
    target_accuracy_low: float,
    target_accuracy_high: float,
    log: bool = True,
) -> WarmupResult:
    """Supervised fine-tuning on (prompt, response) pairs, stopped early inside an accuracy band.

    Each step draws ``batch_size`` pairs from ``train_examples`` with a seeded RNG. Every
    ``eval_every_steps`` steps the greedy accuracy on ``heldout_problems`` ((prompt, answer)
    pairs from the test split) is measured; the loop stops at the first check inside
    ``[target_accuracy_low, target_accuracy_high]`` so that RL starts from a policy that is
    sometimes right and sometimes wrong (groups with 0 < accuracy < 1 carry the gradient under
    dynamic sampling, paper sec. 3.2). If ``max_steps`` is reached first, the model is left as is
    and ``stop_reason`` says so.
    """
    if not 0.0 <= target_accuracy_low <= target_accuracy_high <= 1.0:
        raise ValueError(f"need 0 <= low <= high <= 1, got {target_accuracy_low}, {target_accuracy_high}")
    if not train_examples or not heldout_problems:
        raise ValueError(
            f"warm-up needs training examples and held-out problems, got {len(train_examples)} and "
            f"{len(heldout_problems)}"
        )
    started = time.perf_counter()
    rng = random.Random(seed)
    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.0)
    model.train()
    history: list[tuple[int, float]] = []
    step, accuracy, stop_reason = 0, 0.0, "max_steps"
    while step < max_steps:
        batch = [train_examples[rng.randrange(len(train_examples))] for _ in range(batch_size)]
        input_ids, attention_mask, labels = _supervised_batch(tokenizer, batch)
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        step += 1
        if step % eval_every_steps == 0 or step == max_steps:
            accuracy = greedy_accuracy(model, tokenizer, heldout_problems, max_new_tokens=max_new_tokens)
            history.append((step, accuracy))
            if log:
                print(
                    f"[warm-up] step {step}/{max_steps} loss {loss.item():.3f} "
                    f"held-out greedy accuracy {accuracy:.1%} ({time.perf_counter() - started:.0f} s)",
                    file=sys.stderr,
                )
            if target_accuracy_low <= accuracy <= target_accuracy_high:
                stop_reason = "in_band"
                break
    model.eval()
    return WarmupResult(
        steps=step,
        heldout_accuracy=accuracy,
        history=tuple(history),
        stop_reason=stop_reason,
        seconds=time.perf_counter() - started,
    )
