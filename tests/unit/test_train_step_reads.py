"""engines/train/step.py: a mini-batch's update reads the device a fixed number of times.

On a GPU every ``float(tensor)`` or ``bool(tensor)`` waits for the queued kernels to finish. The
update loop once read the loss, its finiteness and five metrics after every micro-batch (seven
waits each); it now sums them on the device and reads once per mini-batch. The step runs on a
stand-in engine here: what is counted is the loop's own reads, not DeepSpeed's.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from engines.train import step as train_step
from engines.train.step import _TOKEN_WEIGHTED, StepRunner


class _Engine:
    """The few DeepSpeed engine calls the update loop makes."""

    def __init__(self) -> None:
        self.global_steps = 0
        self._boundary = False

    def set_gradient_accumulation_boundary(self, boundary: bool) -> None:
        self._boundary = boundary

    def backward(self, loss: torch.Tensor) -> None:
        pass

    def step(self) -> None:
        self.global_steps += int(self._boundary)


def _metrics(j: int) -> dict[str, torch.Tensor]:
    return {"num_tokens": torch.tensor(float(3 + j)), "pg_loss": torch.tensor(0.0),
            **{key: torch.tensor(0.1 * (k + 1) + 0.01 * j) for k, key in enumerate(_TOKEN_WEIGHTED)}}


def _run(micro_batches: int, monkeypatch: pytest.MonkeyPatch) -> tuple[int, dict[str, float]]:
    """One mini-batch of ``micro_batches`` equal-weight micro-batches; returns (host reads, sums)."""
    runner = StepRunner.__new__(StepRunner)
    runner.engine = _Engine()
    losses = iter(torch.tensor(0.5 + j) for j in range(micro_batches))
    metrics = iter(_metrics(j) for j in range(micro_batches))
    runner._micro_batch_loss = lambda *a, **k: (next(losses), next(metrics))  # type: ignore[method-assign]
    monkeypatch.setattr(train_step, "tb", SimpleNamespace(select=lambda batch, idx: idx))
    monkeypatch.setattr(train_step, "all_reduce_scalars", lambda values, op=None: values)
    reads = 0
    for name in ("__float__", "__bool__", "item"):
        original = getattr(torch.Tensor, name)

        def counted(self: torch.Tensor, *args: Any, _original: Any = original) -> Any:
            nonlocal reads
            reads += 1
            return _original(self, *args)

        monkeypatch.setattr(torch.Tensor, name, counted)
    sums = {"loss": 0.0, **dict.fromkeys(_TOKEN_WEIGHTED, 0.0)}
    micro = [([j], 1.0 / micro_batches) for j in range(micro_batches)]
    old = SimpleNamespace(log_probs=[[None] * micro_batches], weights=[[]])
    runner._update_mini_batch(SimpleNamespace(batch=None, correct=False), micro, 0, old, mini_tokens=1.0,
                              mini_sequences=None, scale=1.0, sums=sums, step=1)
    monkeypatch.undo()
    return reads, sums


def test_host_reads_do_not_grow_with_the_micro_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    one, _ = _run(1, monkeypatch)
    eight, _ = _run(8, monkeypatch)
    assert eight == one  # 56 and 7 before the change


def test_the_sums_are_the_weighted_micro_batch_sums(monkeypatch: pytest.MonkeyPatch) -> None:
    _, sums = _run(4, monkeypatch)
    weight = 0.25
    assert sums["loss"] == pytest.approx(sum((0.5 + j) * weight for j in range(4)), rel=1e-12)
    for k, key in enumerate(_TOKEN_WEIGHTED):
        expected = sum(float(torch.tensor(0.1 * (k + 1) + 0.01 * j)) * (3 + j) * weight for j in range(4))
        assert sums[key] == pytest.approx(expected, rel=1e-12), key
