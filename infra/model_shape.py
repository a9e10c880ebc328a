"""A Hugging Face causal LM's config.json read into the sizing record (infra/sizing.ModelArchitecture).

Only the config is read (a few kilobytes): planning needs the shape, never the weights. The folder is
a local path or an object-store URI (``s3://bucket/path/model``: the one object ``config.json`` is read
through storage/run_store.py, nothing is fetched into the mirror). Per-family details that the generic
fields do not say:

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


def config_location(folder: str | Path) -> str:
    """``<folder>/config.json``: a path, or a URI joined as the run store joins them (never ``s3:/``)."""
    from storage import run_store

    return run_store.join(str(folder), CONFIG_FILE)


def has_config(folder: str | Path) -> bool:
    """Whether ``folder`` (a path or an object-store URI) holds a config.json; a store that cannot be
    asked (endpoint, credentials) is a ValueError naming the URI."""
    from storage import run_store

    location = config_location(folder)
    try:
        return run_store.exists(location) and (run_store.is_remote(location) or Path(location).is_file())
    except Exception as err:  # the store's client raises its own types (obstore, botocore), not OSError alone
        raise _unreadable(location, err) from err


def _unreadable(location: str, err: Exception) -> ValueError:
    """One line naming ``location`` and the store's error (obstore appends a many-line debug dump)."""
    first_line = next(iter(str(err).splitlines()), "")
    return ValueError(f"{location}: cannot read the object store ({type(err).__name__}: {first_line})")


def load_architecture(folder: str | Path) -> ModelArchitecture:
    """Read ``<folder>/config.json`` (a local model folder or an object-store folder URI) into the shape record."""
    from storage import run_store

    location = config_location(folder)
    if not has_config(folder):
        raise ValueError(f"{location}: no {CONFIG_FILE} there; pass a model folder that has one")
    try:
        text = run_store.read_text(location)
    except Exception as err:  # as in has_config
        raise _unreadable(location, err) from err
    try:
        config = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{location}: not JSON ({err})") from err
    return architecture_from_config(config, name=str(folder).rstrip("/").rsplit("/", 1)[-1])
