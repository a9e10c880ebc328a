"""infra/model_shape.py: a Hugging Face config.json read into the sizing record, counted exactly."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra import sizing
from infra.model_shape import architecture_from_config, load_architecture

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "model_configs"

# The publishers' stated sizes (model cards / reports), to within ~1%.
PUBLISHED = {
    "Qwen2.5-0.5B": 0.49e9,
    "Qwen2.5-7B": 7.61e9,
    "Qwen2.5-32B": 32.8e9,
    "Llama-3.1-8B": 8.03e9,
    "Mistral-7B-v0.1": 7.24e9,
    "gemma-2b": 2.51e9,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_count_from_config_matches_the_published_count(name: str) -> None:
    arch = load_architecture(CONFIGS / name)
    params = sizing.parameter_count(arch)
    assert abs(params - PUBLISHED[name]) / PUBLISHED[name] < 0.012, params


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_count_equals_transformers_meta_model(name: str) -> None:
    # An independent count: transformers builds the model on the meta device (no memory, no weights).
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = transformers.AutoConfig.from_pretrained(CONFIGS / name)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    exact = sum(p.numel() for p in model.parameters())  # tied weights are yielded once
    assert sizing.parameter_count(load_architecture(CONFIGS / name)) == exact


def test_qwen25_32b_from_config_equals_the_hand_typed_record() -> None:
    arch = load_architecture(CONFIGS / "Qwen2.5-32B")
    assert sizing.parameter_count(arch) == sizing.parameter_count(sizing.QWEN2_5_32B)


def test_gemma_keeps_its_own_head_dim() -> None:
    arch = load_architecture(CONFIGS / "gemma-2b")
    assert (arch.head_dim, arch.kv_heads, arch.tied_embeddings) == (256, 1, True)


def test_a_config_missing_a_shape_field_names_it() -> None:
    with pytest.raises(ValueError, match="num_hidden_layers"):
        architecture_from_config({"model_type": "llama", "hidden_size": 8}, name="broken")


def test_a_folder_without_config_json_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="config.json"):
        load_architecture(tmp_path)


def test_deploy_sizes_a_bootstrap_source_folder_from_its_config_json() -> None:
    # Before: "no known architecture in its name; pass --model one of ['qwen2.5-32b']" (exit 2).
    from cli.deploy import architecture_for

    for name in ("Qwen2.5-7B", "Llama-3.1-8B", "Qwen2.5-0.5B"):
        arch = architecture_for(str(CONFIGS / name))
        assert arch is not None and arch.name == name


def test_deploy_names_config_json_when_the_source_cannot_be_sized(tmp_path: Path) -> None:
    from cli.deploy import DeployInputError, architecture_for

    with pytest.raises(DeployInputError, match="config.json"):
        architecture_for(str(tmp_path / "Some-Model-7B"))
