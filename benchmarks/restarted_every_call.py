"""`dapo` whose every rollout and evaluation call starts engine actors for that call alone (benchmark only).

What open-source Flyte does with a RayJob per rollout/evaluate task (docs/CLUSTER.md, path c), emulated on a
long-lived Ray cluster: each call gets a namespace of its own (settings/rollout.py: EngineHosting), so its
engines are new actors that start vLLM and load the weights from the checkpoint's files, and they are removed
when the call returns (engines/rollout/ray_engines.py: release). Training is left to the command's settings
(benchmarks/main_job_hosted.py runs this with ``train.keep_workers_warm=false``: a cold launch every step).
A real RayJob also starts its pods and Ray per call, and a task pod its Python: not in this figure.

    python benchmarks/restarted_every_call.py RAY_ADDRESS run --config ... [dapo arguments]
"""

from __future__ import annotations

import functools
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engines.evaluate import stage as evaluate_stage  # noqa: E402
from engines.rollout import ray_engines  # noqa: E402
from engines.rollout import stage as rollout_stage  # noqa: E402
from settings.rollout import EngineHosting  # noqa: E402


def per_call(generate: Callable[..., Any], address: str) -> Callable[..., Any]:
    """``generate`` (engines/rollout/stage.py: generate_rollouts) on engines started for the call and removed after it."""

    @functools.wraps(generate)
    def call(*args: Any, **kwargs: Any) -> Any:
        hosting = EngineHosting(ray_address=address, namespace=f"call-{uuid.uuid4().hex[:12]}")
        try:
            return generate(*args, **{**kwargs, "hosting": hosting})
        finally:
            ray_engines.release(hosting)

    return call


def main() -> int:
    address, argv = sys.argv[1], sys.argv[2:]
    patched = per_call(rollout_stage.generate_rollouts, address)
    rollout_stage.generate_rollouts = patched  # rollout_shard's calls
    evaluate_stage.generate_rollouts = patched  # the evaluation's (imported by name)
    from cli.main import main as dapo

    return dapo(argv)


if __name__ == "__main__":
    raise SystemExit(main())
