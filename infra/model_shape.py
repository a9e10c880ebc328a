"""A Hugging Face causal LM's config.json read into the sizing record (infra/sizing.ModelArchitecture).

Only the config is read (a few kilobytes): planning needs the shape, never the weights. Stdlib only.
Per-family details that the generic fields do not say:

- Qwen2 / Qwen2.5: q, k and v projections carry biases (fixed by the architecture, not a field).
- Qwen3: no q/k/v biases, but an RMSNorm over each query and key head (``head_dim`` weights each).
- Llama / Mistral: biases only when ``attention_bias`` is true.
- Gemma: ``head_dim`` is its own field (256 on gemma-2b, not hidden / heads) and embeddings are tied.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from infra.sizing import ModelArchitecture

CONFIG_FILE = "config.json"
QKV_BIAS_FAMILIES = frozenset({"qwen2"})  # biases fixed by the architecture, not by a field
QK_NORM_FAMILIES = frozenset({"qwen3"})
TIED_BY_DEFAULT = frozenset({"gemma", "gemma2"})  # families whose config omits tie_word_embeddings


def _field(config: dict[str, Any], key: str, name: str) -> int:
    if key not in config:
        raise ValueError(f"{name}: {CONFIG_FILE} has no {key!r}; cannot size this model")
    return int(config[key])


def architecture_from_config(config: dict[str, Any], name: str) -> ModelArchitecture:
    """The shape record of one parsed config.json; a missing shape field is named in a ValueError."""
    family = str(config.get("model_type", ""))
    hidden = _field(config, "hidden_size", name)
    layers = _field(config, "num_hidden_layers", name)
    heads = _field(config, "num_attention_heads", name)
    head_dim = config.get("head_dim") or hidden // heads
    return ModelArchitecture(
        name=name,
        layers=layers,
        hidden_size=hidden,
        query_heads=heads,
        kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(head_dim),
        intermediate_size=_field(config, "intermediate_size", name),
        vocab_size=_field(config, "vocab_size", name),
        tied_embeddings=bool(config.get("tie_word_embeddings", family in TIED_BY_DEFAULT)),
        qkv_bias=family in QKV_BIAS_FAMILIES or bool(config.get("attention_bias", False)),
        nominal_params=0,  # unknown from the config alone; the tests hold the published counts
        qk_norm=family in QK_NORM_FAMILIES,
    )


def load_architecture(folder: str | Path) -> ModelArchitecture:
    """Read ``<folder>/config.json`` (a local model folder) into the shape record."""
    path = Path(folder) / CONFIG_FILE
    if not path.is_file():
        raise ValueError(f"{path}: no {CONFIG_FILE} there; pass a model folder that has one")
    return architecture_from_config(json.loads(path.read_text()), name=Path(folder).name)
