"""What the rollout task's reuse policy becomes on the wire (docs/CLUSTER.md, "What stays warm where").

The cluster rollout environment carries ``ReusePolicy(replicas=1)``. The SDK sends it as the task
template's ``reuse_policy`` field of a task of type "ray" (not the "actor" custom spec of a reusable
container task). Only a Union backend acts on that field: the open-source Flyte 2 backend's Ray
plugin builds a fresh RayJob per execution, which is why the docs and infra/handoff.py price path c.
When this test fails, the SDK changed what it sends and the docs' account must be checked again.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_SCRIPT = """
import pathlib
from flyte.models import SerializationContext
from flyte._internal.runtime.task_serde import get_proto_task
import tasks.rollout  # noqa: F401  (registers the rollout task in its environment)
from infra.environments import cluster_settings, rollout_env
task = next(t for name, t in rollout_env.tasks.items() if name.endswith(".rollout"))
template = get_proto_task(task, SerializationContext(version="v1", root_dir=pathlib.Path.cwd()))
print("type", template.type)
print("reuse", template.HasField("reuse_policy"), template.reuse_policy.max_replicas, template.reuse_policy.idle_ttl.seconds)
print("ttl", cluster_settings()["rollout_idle_ttl_s"])
print("custom", sorted(template.custom.keys()))
"""


def test_rollout_sends_its_reuse_policy_as_a_field_of_a_ray_task() -> None:
    env = {**os.environ, "DAPO_FLYTE_TARGET": "cluster"}
    env.pop("DAPO_CLUSTER_PLAN", None)
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)
    assert lines["type"] == "ray"
    assert lines["reuse"] == f"True 1 {lines['ttl']}"  # one shared RayCluster, idle TTL from the plan
    assert lines["custom"] == "['rayCluster']"  # no "actor" spec: the policy travels alone
