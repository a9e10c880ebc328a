"""vLLM's in-place weight reload warns about layers it has nothing to load into by design.

``vllm/model_executor/model_loader/reload/layerwise.py`` logs "<layer>: Failed to load weights"
for every layer of the engine that got no tensor from the checkpoint, and puts the layer's old
tensors back. Two such layers are expected, and each weight reload (every pipeline step) logged
both, two warning lines a step in the run's log that read like a broken reload:

- ``RotaryEmbedding``: its cos/sin cache is computed from the config, never stored in a checkpoint;
- ``ParallelLMHead`` of a model with tied word embeddings (the tiny policy, Qwen2.5 up to 3B):
  it shares the embedding's weight, which the reload does update (the CPU backend's packed copy
  is rebuilt after it: engines/rollout/vllm_engine.py, ``_refresh_cpu_output_projections``), and
  tests/integration/test_rollout.py checks that a reloaded engine generates what a fresh one does.

:func:`expected_only` drops exactly those records around a reload; any other layer's, including an
untied LM head that got no weights, is still logged.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

LAYERWISE_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"  # vLLM's init_logger(__name__)
FAILED_TO_LOAD = "%s: Failed to load weights"  # the record's format string in that module


def expected_missing(tie_word_embeddings: bool) -> frozenset[str]:
    """The layer classes a checkpoint of this kind holds no tensors for."""
    return frozenset({"RotaryEmbedding", *(("ParallelLMHead",) if tie_word_embeddings else ())})


class _DropExpected(logging.Filter):
    def __init__(self, layers: frozenset[str]) -> None:
        super().__init__()
        self.layers = layers

    def filter(self, record: logging.LogRecord) -> bool:
        expected = record.msg == FAILED_TO_LOAD and bool(record.args) and record.args[0] in self.layers  # type: ignore[index]
        return not expected


@contextlib.contextmanager
def expected_only(layers: frozenset[str]) -> Iterator[None]:
    """While the block runs, vLLM's "Failed to load weights" records of ``layers`` are not logged."""
    logger = logging.getLogger(LAYERWISE_LOGGER)
    dropped = _DropExpected(layers)
    logger.addFilter(dropped)
    try:
        yield
    finally:
        logger.removeFilter(dropped)
