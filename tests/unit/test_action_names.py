"""Each step's task calls carry a readable action name (``train-step-0042``) and nothing else of the task
changes: the name, typed interface and code version that Flyte's cache keys are made of stay the task's
own, so cache hits, and the checkpoint ids they lead to, are unchanged (docs/CLUSTER.md, "Finding and
re-running one step's stage")."""

from __future__ import annotations

import flyte.extras
import pytest

from workflows import driver


@pytest.mark.parametrize(("task", "generation_round", "expected"), [
    (driver.train, None, "train-step-0042"),
    (driver.assemble_batch, None, "assemble_batch-step-0042"),
    (driver.evaluate, None, "evaluate-step-0042"),
    (driver.rollout, 1, "rollout-step-0042-round-01"),
    (driver.score, 0, "score-step-0042-round-00"),
])
def test_a_step_call_is_named_by_its_step_and_keeps_the_tasks_cache_identity(
        task: object, generation_round: int | None, expected: str) -> None:
    named = driver.step_action(task, 42, generation_round)
    assert named.short_name == expected
    spec, plain = flyte.extras.serialize(named), flyte.extras.serialize(task)
    assert spec.short_name == expected  # what the UI and `flyte get action` list
    # what the cache key is made of (flyte: generate_cache_key_hash): unchanged
    assert named.name == task.name and spec.task_template.id.name == plain.task_template.id.name
    assert spec.task_template.interface == plain.task_template.interface
    assert spec.task_template.metadata.discovery_version == plain.task_template.metadata.discovery_version
    assert named.cache.version_override == task.cache.version_override
    assert task.short_name == expected.split("-step-")[0]  # the module's task is left as it was
