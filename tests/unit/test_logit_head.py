"""The trainer's log-probs equal the model's own forward for every architecture, chunked or not.

With ``logprob_chunk_tokens > 0`` the trainer applies the output head to the final hidden states
itself (engines/train/engine.py: forward_log_probs). Some architectures post-process
``lm_head``'s output in their forward (Gemma 2/3's soft-capping, Cohere's ``logit_scale``,
Granite's ``logits_scaling``); the chunked head must do the same. Each case builds a tiny random
model from its config class, with the post-processing set to a value far from a no-op, and
compares the trainer's log-probs with ``log_softmax(model(input_ids).logits)`` at the targets.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from engines.train import engine as train_engine
from engines.train.engine import forward_log_probs
from engines.train.spec import TrainStepFailure

V = 128
_SMALL = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=8, max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
              eos_token_id=2, tie_word_embeddings=False)
# Post-processing values far from a no-op on a tiny model's logits (|logit| ~ 1), plus what each
# config class needs to build at this size.
_SOFT_CAP, _SCALE, _SCALING = {"final_logit_softcapping": 0.5}, {"logit_scale": 3.0}, {"logits_scaling": 0.25}
_MOE = {"num_local_experts": 2, "num_experts_per_tok": 1}
_ARCHITECTURES: dict[str, dict] = {
    "qwen2": {},
    "llama": {},
    "mistral": {},
    "gemma": {},
    "gemma2": _SOFT_CAP,
    "gemma3_text": _SOFT_CAP,
    "gemma3n_text": {**_SOFT_CAP, "layer_types": ["full_attention"] * 2, "num_kv_shared_layers": 0, "laurel_rank": 4,
                     "hidden_size_per_layer_input": 8, "vocab_size_per_layer_input": V,
                     "activation_sparsity_pattern": [0.0, 0.0]},
    "gemma4_text": {**_SOFT_CAP, "hidden_size_per_layer_input": 8, "vocab_size_per_layer_input": V},
    "vaultgemma": _SOFT_CAP,
    "nanochat": _SOFT_CAP,
    "recurrent_gemma": {"logits_soft_cap": 0.5, "block_types": ["recurrent", "attention"], "lru_width": 32,
                        "attention_window_size": 16},
    "cohere": _SCALE,
    "cohere2": _SCALE,
    "cohere2_moe": _SCALE,
    "granite": _SCALING,
    "granite_swa": _SCALING,
    "granitemoe": {**_SCALING, **_MOE},
    "granitemoe_swa": {**_SCALING, **_MOE},
    "granitemoeshared": {**_SCALING, **_MOE},
    "granitemoehybrid": {**_SCALING, **_MOE, "layer_types": ["attention"] * 2, "mamba_n_heads": 4,
                         "mamba_d_head": 16, "shared_intermediate_size": 64},
    "hyperclovax": {"logits_scaling": 4.0},  # multiplies (Granite divides)
}
# In LOGIT_RULES, not built here: its config class does not build at this size with the defaults.
_UNBUILT = {"cohere_compass_text"}


def _tiny_model(model_type: str) -> torch.nn.Module:
    """A fresh tiny random model of ``model_type`` (seeded: the same weights every call)."""
    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, **{**_SMALL, **_ARCHITECTURES[model_type]})
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # larger logits than the default init gives, so the post-processing shows
        model.lm_head.weight.normal_(0.0, 1.0)
    return model.eval()


class _Engine:
    """What forward_log_probs needs of a DeepSpeed engine: call it, and ``.module`` is the model."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module

    def __call__(self, **kwargs):
        return self.module(**kwargs)


def _batch(B: int = 3, L: int = 10) -> SimpleNamespace:
    ids = torch.randint(3, V, (B, L), generator=torch.Generator().manual_seed(1))
    attention = torch.ones(B, L, dtype=torch.bool)
    attention[1, 7:] = False  # right padding on one row, as train batches have
    return SimpleNamespace(input_ids=ids, attention_mask=attention)


def _reference(model: torch.nn.Module, mb: SimpleNamespace) -> torch.Tensor:
    logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask.long()).logits.float()
    picked = torch.log_softmax(logits[:, :-1], -1).gather(-1, mb.input_ids[:, 1:, None]).squeeze(-1)
    return torch.nn.functional.pad(picked, (1, 0))


@pytest.mark.parametrize("model_type", sorted(_ARCHITECTURES))
def test_trainer_log_probs_equal_the_models_own_forward(model_type: str) -> None:
    model, mb = _tiny_model(model_type), _batch()
    with torch.no_grad():
        expected = _reference(model, mb)
        for chunk_tokens in (0, 1, 4, 64):  # 0: the model's own logits; 64: one chunk for all
            got, _ = forward_log_probs(_Engine(model), mb, device=torch.device("cpu"), chunk_tokens=chunk_tokens,
                                       head_calls=None)
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5,
                                       msg=lambda m, c=chunk_tokens: f"chunk {c}: {m}")


@pytest.mark.parametrize("model_type", ["gemma2", "cohere", "granite"])
def test_chunked_gradients_equal_the_models_own_forward(model_type: str) -> None:
    model, mb = _tiny_model(model_type), _batch()
    weights = torch.randn(mb.input_ids.shape, generator=torch.Generator().manual_seed(2))
    (_reference(model, mb) * weights).sum().backward()
    expected = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    got, _ = forward_log_probs(_Engine(model), mb, device=torch.device("cpu"), chunk_tokens=4, head_calls=None)
    (got * weights).sum().backward()
    for name, param in model.named_parameters():
        if name in expected:  # gradients of up to ~1e3 here: compared by relative norm
            error = float((param.grad - expected[name]).norm() / expected[name].norm())
            assert error < 1e-5, (name, error)


def test_chunked_entropy_is_that_of_the_models_own_distribution() -> None:
    model, mb = _tiny_model("gemma2"), _batch()
    mask = mb.attention_mask.clone()
    with torch.no_grad():
        logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask.long()).logits.float()
        p = torch.softmax(logits[:, :-1], -1)
        expected = float((-(p * p.log()).sum(-1) * mask[:, 1:]).sum())
        _, got = forward_log_probs(_Engine(model), mb, device=torch.device("cpu"), chunk_tokens=4, head_calls=None,
                                   entropy_mask=mask)
    assert got == pytest.approx(expected, rel=1e-5)


def test_every_registered_rule_is_tested_on_a_tiny_model() -> None:
    assert set(train_engine.LOGIT_RULES) <= set(_ARCHITECTURES) | _UNBUILT


def _causal_lm_source(model_type: str, class_name: str) -> str:
    """The text of ``class_name`` in its modeling file (read, not imported: importing all is slow)."""
    import transformers
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    module = model_type_to_module_name(model_type)
    path = Path(transformers.__file__).parent / "models" / module / f"modeling_{module}.py"
    text = path.read_text() if path.exists() else ""
    match = re.search(rf"^class {class_name}\(.*?(?=^class |\Z)", text, flags=re.S | re.M)
    return match.group(0) if match else ""


def test_every_causal_lm_that_post_processes_its_logits_is_registered_or_refused() -> None:
    # The installed transformers' causal LMs that read a post-processing attribute: each has a
    # rule, or the guard refuses it once the attribute is set (on its config or its text part).
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    attributes = {rule.attribute for rule in train_engine.LOGIT_RULES.values()}
    checked = set()
    for model_type, class_name in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items():
        if model_type in train_engine.LOGIT_RULES:
            continue
        for attribute in attributes & set(re.findall(r"\w+", _causal_lm_source(model_type, class_name))):
            config = AutoConfig.for_model(model_type)
            try:
                setattr(config.get_text_config(), attribute, 2.0)
            except AttributeError:  # a property computed from other fields (MiniCPM3's logits_scaling)
                assert getattr(config.get_text_config(), attribute) is not None
            with pytest.raises(TrainStepFailure, match=f"{model_type}.*{attribute}"):
                train_engine.logit_head(SimpleNamespace(config=config, model=None, lm_head=None))
            checked.add(model_type)
    assert {"minicpm3", "gemma3n", "gemma4"} <= checked  # the scan finds the ones known today


def test_a_plain_architectures_head_is_its_lm_head_itself() -> None:
    # The main job's tiny Qwen2 policy: its chunked log-probs must not move by a bit.
    model = _tiny_model("qwen2")
    assert train_engine.logit_head(model) is model.lm_head


def test_post_processing_the_registry_does_not_know_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    # A model type whose config carries a known post-processing attribute but has no rule: the
    # same attribute can mean different operations (Granite divides by logits_scaling,
    # HyperCLOVA X multiplies), so it is refused rather than guessed.
    monkeypatch.delitem(train_engine.LOGIT_RULES, "granite")
    model = _tiny_model("granite")
    with pytest.raises(TrainStepFailure, match=r"granite.*logits_scaling.*logprob_chunk_tokens: 0"):
        forward_log_probs(_Engine(model), _batch(), device=torch.device("cpu"), chunk_tokens=4, head_calls=None)


def test_a_head_that_disagrees_with_the_models_forward_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    # The safety net: a wrong rule (multiply where Granite divides) is caught on the first call,
    # from the model's own logits at the last scored position, with no extra head call.
    monkeypatch.setitem(train_engine.LOGIT_RULES, "granite", train_engine.LOGIT_RULES["hyperclovax"])
    model = _tiny_model("granite")
    with pytest.raises(TrainStepFailure, match="granite.*differ from the model's own forward"):
        forward_log_probs(_Engine(model), _batch(), device=torch.device("cpu"), chunk_tokens=4, head_calls=None)


@pytest.mark.parametrize("model_type", ["qwen2", "gemma2", "granite"])
def test_bf16_rounding_passes_the_check_and_stays_within_bf16_of_the_forward(model_type: str) -> None:
    # The chunk's head call and the model's own differ in shape and may round differently: the
    # safety net must not refuse a correct head for that.
    model, mb = _tiny_model(model_type).to(torch.bfloat16), _batch(L=24)
    with torch.no_grad():
        expected = _reference(model, mb)
        for chunk_tokens in (1, 5, 64):
            got, _ = forward_log_probs(_Engine(model), mb, device=torch.device("cpu"), chunk_tokens=chunk_tokens,
                                       head_calls=None)
            torch.testing.assert_close(got, expected, rtol=0.0, atol=1e-2)
