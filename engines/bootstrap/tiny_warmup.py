"""The tiny policy's supervised warm-up: worked solutions of synthetic problems, stopped in a band.

The warm-up teaches the worked-solution format on the train split and stops early, inside a band
of greedy accuracy on held-out problems (default 20-50 %), so that RL has room to improve (a
warm-up to ~94 % leaves DAPO nothing to learn; dynamic sampling, paper sec. 3.2, then discards
almost every group as all-correct). Train and held-out problems are told apart by a hash of their
text (:func:`synthetic_split`). The model and tokenizer are engines/bootstrap/tiny_policy.py's.
"""

from __future__ import annotations

import hashlib
import random
import re
import sys
import time
from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM

from engines.runtime import work_progress
from engines.bootstrap.tiny_policy import render_prompt
from readers.synthetic import check_line_count, make_problem, worked_solution

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
    problems: list[tuple[str, int]], max_check_lines: int = 0,
) -> tuple[list[tuple[str, str]], list[tuple[str, int]]]:
    """(prompt, worked solution) training pairs and (prompt, answer) eval pairs for problems; each
    solution carries 0..``max_check_lines`` check lines (readers/synthetic.py)."""
    pairs = [(render_prompt(text), worked_solution(text, check_line_count(text, max_check_lines)))
             for text, _ in problems]
    return pairs, [(render_prompt(text), answer) for text, answer in problems]


def _check_warm_up_inputs(
    train_examples: list[tuple[str, str]], heldout_problems: list[tuple[str, int]],
    target_accuracy_low: float, target_accuracy_high: float,
) -> None:
    """Refuse a band outside [0, 1] or upside down, and an empty training or held-out set."""
    if not 0.0 <= target_accuracy_low <= target_accuracy_high <= 1.0:
        raise ValueError(f"need 0 <= low <= high <= 1, got {target_accuracy_low}, {target_accuracy_high}")
    if not train_examples or not heldout_problems:
        raise ValueError(
            f"warm-up needs training examples and held-out problems, got {len(train_examples)} and "
            f"{len(heldout_problems)}"
        )


def _supervised_step(
    model: Qwen2ForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    optimizer: torch.optim.Optimizer,
    batch: list[tuple[str, str]],
) -> torch.Tensor:
    """One optimizer step on the cross-entropy of ``batch``'s responses; returns the loss (before the step)."""
    input_ids, attention_mask, labels = _supervised_batch(tokenizer, batch)
    loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss


def _log_check(step: int, max_steps: int, loss: torch.Tensor, accuracy: float, started: float) -> None:
    """One progress line on stderr per accuracy check."""
    print(
        f"[warm-up] step {step}/{max_steps} loss {loss.item():.3f} "
        f"held-out greedy accuracy {accuracy:.1%} ({time.perf_counter() - started:.0f} s)",
        file=sys.stderr,
    )


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
    _check_warm_up_inputs(train_examples, heldout_problems, target_accuracy_low, target_accuracy_high)
    started = time.perf_counter()
    rng = random.Random(seed)
    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.0)
    model.train()
    history: list[tuple[int, float]] = []
    step, accuracy, stop_reason = 0, 0.0, "max_steps"
    while step < max_steps:
        batch = [train_examples[rng.randrange(len(train_examples))] for _ in range(batch_size)]
        loss = _supervised_step(model, tokenizer, optimizer, batch)
        step += 1
        # Most runs stop early, inside the accuracy band: max_steps is the bar's end at worst.
        work_progress.report("warm-up", step, max_steps)
        if step % eval_every_steps == 0 or step == max_steps:
            accuracy = greedy_accuracy(model, tokenizer, heldout_problems, max_new_tokens=max_new_tokens)
            history.append((step, accuracy))
            if log:
                _log_check(step, max_steps, loss, accuracy, started)
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
