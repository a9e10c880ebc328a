"""engines/rollout/vllm_engine.architecture_digest: the engine's and the tokenizer's key of a round read
the tokenizer files once between them, and a changed file changes the key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engines.rollout import vllm_engine
from storage import digests


def _folder(path: Path) -> Path:
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "qwen2", "hidden_size": 8}))
    (path / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {str(i): i for i in range(5000)}}}))
    (path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages[-1]['content'] }}"}))
    return path


def test_two_keys_of_one_round_read_the_tokenizer_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _folder(tmp_path / "step-0001")
    reads: list[str] = []
    real = digests._sha256_of
    monkeypatch.setattr(digests, "_sha256_of", lambda handle, feed: reads.append(Path(handle.name).name) or real(handle, feed))
    first = vllm_engine.architecture_digest(folder)
    assert sorted(reads) == ["tokenizer.json", "tokenizer_config.json"]
    assert vllm_engine.architecture_digest(folder) == first and len(reads) == 2  # not read again

    template = json.loads((folder / "tokenizer_config.json").read_text())
    template["chat_template"] = "1" + template["chat_template"]  # another size: another identity
    (folder / "tokenizer_config.json").write_text(json.dumps(template))
    assert vllm_engine.architecture_digest(folder) != first and reads[-1] == "tokenizer_config.json"


def test_the_key_is_the_contents_not_the_folder(tmp_path: Path) -> None:
    a, b = _folder(tmp_path / "a"), _folder(tmp_path / "b")
    assert vllm_engine.architecture_digest(a) == vllm_engine.architecture_digest(b)
    (b / "chat_template.jinja").write_text("{{ messages }}")  # a file a lacks counts as empty in a
    assert vllm_engine.architecture_digest(a) != vllm_engine.architecture_digest(b)
