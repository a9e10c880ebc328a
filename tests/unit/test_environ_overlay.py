"""engines/runtime/environ.py: overlay sets variables for a block and puts each back as it was."""

from __future__ import annotations

import os

import pytest

from engines.runtime.environ import overlay


def test_overlay_restores_a_set_variable_and_removes_an_unset_one_even_when_the_block_raises(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DAPO_TEST_SET", "before")
    monkeypatch.delenv("DAPO_TEST_UNSET", raising=False)
    with pytest.raises(RuntimeError), overlay({"DAPO_TEST_SET": "inside", "DAPO_TEST_UNSET": "inside"}):
        assert (os.environ["DAPO_TEST_SET"], os.environ["DAPO_TEST_UNSET"]) == ("inside", "inside")
        raise RuntimeError("the block fails")
    assert os.environ["DAPO_TEST_SET"] == "before"
    assert "DAPO_TEST_UNSET" not in os.environ
