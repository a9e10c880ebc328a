"""The tiny policy's tokenizer and checkpoint construction (engines/bootstrap/tiny_policy.py) and its warm-up
pieces (engines/bootstrap/tiny_warmup.py); no vLLM here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from engines.bootstrap import tiny_policy, tiny_warmup
from readers.synthetic import ALPHABET
from storage import checkpoints


def test_vocabulary_is_specials_then_alphabet() -> None:
    tok = tiny_policy.build_tokenizer()
    # 3 specials + 22 distinct ALPHABET characters ("0-9", "+-=", "\n", " ", "Answer:").
    assert len(tok) == 3 + len(set(ALPHABET)) == 25
    assert (tok.pad_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2)
    # "12 -\n": '1' -> 3+1=4, '2' -> 3+2=5, ' ' -> 3+14=17, '-' -> 3+11=14, '\n' -> 3+13=16.
    assert tok("12 -\n", add_special_tokens=False).input_ids == [4, 5, 17, 14, 16]


def test_round_trip_and_chat_template() -> None:
    tok = tiny_policy.build_tokenizer()
    text = "37+5=42\n42-18=24\nAnswer: 24"
    ids = tok(text, add_special_tokens=False).input_ids
    assert len(ids) == len(text)  # one token per character
    assert tok.decode(ids) == text
    prompt = tiny_policy.render_prompt("37+5-18")
    assert prompt == "37+5-18=\n"
    templated = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False)
    assert templated == prompt


def test_checkpoint_loads_with_autotokenizer_identically(tmp_path: Path) -> None:
    # transformers loads a qwen2 folder with Qwen2Tokenizer, which rebuilds the tokenizer from
    # the vocabulary: it must still keep spaces and newlines as their own tokens.
    folder = tiny_policy.build_random_checkpoint(tmp_path / "ck", seed=0)
    loaded = AutoTokenizer.from_pretrained(folder)
    built = tiny_policy.build_tokenizer()
    text = "9-3=\n9-3=6\nAnswer: 6"
    assert loaded(text).input_ids == built(text, add_special_tokens=False).input_ids
    assert loaded.decode(loaded(text).input_ids) == text
    config = json.loads((folder / "tokenizer_config.json").read_text())
    assert config["chat_template"] == tiny_policy.CHAT_TEMPLATE
    assert (folder / "model.safetensors").is_file() and (folder / "generation_config.json").is_file()


def test_random_checkpoint_is_published_and_deterministic(tmp_path: Path) -> None:
    a = tiny_policy.build_random_checkpoint(tmp_path / "a", seed=0)
    b = tiny_policy.build_random_checkpoint(tmp_path / "b", seed=0)
    c = tiny_policy.build_random_checkpoint(tmp_path / "c", seed=1)
    ia, ib, ic = (checkpoints.read_info(p) for p in (a, b, c))
    assert ia.checkpoint_id == ib.checkpoint_id != ic.checkpoint_id
    assert ia.step == 0 and ia.parent_checkpoint_id is None and ia.produced_by == "bootstrap"
    model = AutoModelForCausalLM.from_pretrained(a)
    assert model.dtype == torch.float32 and model.config.num_hidden_layers == 3
    assert not list(tmp_path.glob(".*staging*"))  # nothing left behind


def test_supervised_batch_masks_the_prompt() -> None:
    tok = tiny_policy.build_tokenizer()
    ids, mask, labels = tiny_warmup._supervised_batch(tok, [("1+2=\n", "3"), ("1=\n", "12")])
    # row 0: prompt "1+2=\n" (5 tokens) + "3" + EOS = 7; row 1: "1=\n" (3) + "12" + EOS = 6, 1 pad.
    assert ids.shape == labels.shape == (2, 7)
    assert labels[0].tolist() == [-100] * 5 + [6, 1]
    assert labels[1].tolist() == [-100] * 3 + [4, 5, 1, -100]
    assert mask[1].tolist() == [1] * 6 + [0] and ids[1, -1].item() == tok.pad_token_id


def test_extract_answer_and_split() -> None:
    assert tiny_warmup.extract_answer("3+4=7\nAnswer: 7") == 7
    assert tiny_warmup.extract_answer("Answer: -12") == -12
    assert tiny_warmup.extract_answer("3+4=7") is None
    assert tiny_warmup.synthetic_split("3+4") == tiny_warmup.synthetic_split("3+4")
    splits = {tiny_warmup.synthetic_split(f"{a}+{b}") for a in range(1, 30) for b in range(1, 30)}
    assert splits == {"train", "test"}


def test_max_solution_tokens_bounds_real_solutions() -> None:
    # max_terms=2, max_operand=20: totals up to 40 -> 2 digits + sign = 3 chars;
    # line "ttt+20=ttt\n" = 3+1+2+1+3+1 = 11; answer "Answer: ttt" = 8+3 = 11; + EOS = 23.
    assert tiny_warmup.max_solution_tokens(2, 20) == 23
    from readers.synthetic import worked_solution

    assert len(worked_solution("20-20")) + 1 <= 23


def test_check_lines_restate_the_last_line_a_hashed_number_of_times() -> None:
    from readers.synthetic import check_line_count, worked_solution

    assert worked_solution("37+5-18", 2) == "37+5=42\n42-18=24\n42-18=24\n42-18=24\nAnswer: 24"
    assert worked_solution("37+5-18", 0) == worked_solution("37+5-18") == "37+5=42\n42-18=24\nAnswer: 24"
    texts = [f"{a}+{b}" for a in range(1, 31) for b in range(1, 31)]
    counts = [check_line_count(t, 4) for t in texts]
    assert [counts.count(k) for k in range(5)] == [190, 151, 211, 174, 174]  # 0..4, about uniform
    assert check_line_count("37+5", 4) == 3 and check_line_count("28-1", 4) == 0  # a hash of the text: pinned
    assert {check_line_count(t, 0) for t in texts} == {0}
    import random

    problems = tiny_warmup.draw_problems(random.Random(0), 32, split="train", min_terms=2, max_terms=2, max_operand=30)
    train, _ = tiny_warmup.synthetic_examples(problems, max_check_lines=4)
    assert [r.count("\n") - 1 for _, r in train] == [check_line_count(t, 4) for t, _ in problems]


def test_warm_up_reduces_loss_and_stops_in_band() -> None:
    torch.manual_seed(0)
    tok = tiny_policy.build_tokenizer()
    model = tiny_policy.build_random_model(tok, seed=0, num_layers=1, hidden_size=64)
    import random

    problems = tiny_warmup.draw_problems(random.Random(0), 64, split="train", min_terms=2, max_terms=2, max_operand=9)
    train, heldout = tiny_warmup.synthetic_examples(problems)
    batch = tiny_warmup._supervised_batch(tok, train[:32])
    before = model(input_ids=batch[0], attention_mask=batch[1], labels=batch[2]).loss.item()
    # band [0, 1] holds any accuracy: the loop must stop at the first check (step 10).
    result = tiny_warmup.warm_up(model, tok, train, heldout[:8], seed=0, batch_size=16, learning_rate=3e-3,
                                 max_steps=50, eval_every_steps=10, max_new_tokens=12,
                                 target_accuracy_low=0.0, target_accuracy_high=1.0, log=False)
    after = model(input_ids=batch[0], attention_mask=batch[1], labels=batch[2]).loss.item()
    assert result.stop_reason == "in_band" and result.steps == 10 and len(result.history) == 1
    assert after < before
    # A band no check reaches (1 layer, 20 more steps: nowhere near every answer right): no stop at a check.
    missed = tiny_warmup.warm_up(model, tok, train, heldout[:8], seed=0, batch_size=16, learning_rate=3e-3,
                                 max_steps=20, eval_every_steps=10, max_new_tokens=12,
                                 target_accuracy_low=1.0, target_accuracy_high=1.0, log=False)
    assert missed.stop_reason == "max_steps" and missed.steps == 20 and len(missed.history) == 2
    with pytest.raises(ValueError, match="low <= high"):
        tiny_warmup.warm_up(model, tok, train, heldout, seed=0, batch_size=4, learning_rate=1e-3, max_steps=1,
                            eval_every_steps=1, max_new_tokens=4, target_accuracy_low=0.6, target_accuracy_high=0.5)
