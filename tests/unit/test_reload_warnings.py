"""engines/rollout/reload_warnings.py: only the expected "Failed to load weights" records are dropped."""

from __future__ import annotations

import logging

from engines.rollout import reload_warnings


def _logged(layers: frozenset[str], names: list[str]) -> list[str]:
    logger = logging.getLogger(reload_warnings.LAYERWISE_LOGGER)
    got: list[str] = []
    capture = logging.Handler(logging.WARNING)
    capture.emit = lambda record: got.append(record.getMessage())  # type: ignore[method-assign]
    logger.addHandler(capture)
    try:
        with reload_warnings.expected_only(layers):
            for name in names:
                logger.warning(reload_warnings.FAILED_TO_LOAD, name)
            logger.warning("something else about %s", "RotaryEmbedding")
        logger.warning(reload_warnings.FAILED_TO_LOAD, "RotaryEmbedding")  # after the block: logged again
    finally:
        logger.removeHandler(capture)
    return got


def test_a_tied_head_and_the_rotary_cache_are_expected_an_untied_head_is_not() -> None:
    names = ["RotaryEmbedding", "ParallelLMHead", "QKVParallelLinear"]
    assert _logged(reload_warnings.expected_missing(tie_word_embeddings=True), names) == [
        "QKVParallelLinear: Failed to load weights", "something else about RotaryEmbedding",
        "RotaryEmbedding: Failed to load weights"]
    assert _logged(reload_warnings.expected_missing(tie_word_embeddings=False), names) == [
        "ParallelLMHead: Failed to load weights", "QKVParallelLinear: Failed to load weights",
        "something else about RotaryEmbedding", "RotaryEmbedding: Failed to load weights"]


def test_the_logger_and_message_are_vllms() -> None:
    # If vLLM renames the module or rewords the message, the filter would silently stop working.
    import inspect

    from vllm.model_executor.model_loader.reload import layerwise

    assert layerwise.logger.name == reload_warnings.LAYERWISE_LOGGER
    assert f'"{reload_warnings.FAILED_TO_LOAD}"' in inspect.getsource(layerwise)
