"""The serving app: a trained checkpoint behind vLLM's OpenAI-compatible API on the cluster.

A Flyte app (``flyteplugins-vllm``'s ``VLLMAppEnvironment``), the cluster's ``dapo serve``: the
checkpoint's folder in the object store is streamed to the GPU (or downloaded) at start, served
under its checkpoint id with the rollout engine's arguments (engines/rollout/serving.py: ``engine_flags``),
and scaled to zero when idle (the Flyte app default). ``dapo deploy --serve CHECKPOINT`` builds
and registers it next to the pipeline's task environments (cli/deploy.py).

The image is the plugin's own (``DEFAULT_VLLM_IMAGE``: its ``vllm-fserve`` launcher, a CUDA vLLM
and FlashInfer's prebuilt sampling kernels, without which top-p sampling JIT-compiles and fails
on an image with no CUDA toolkit); it holds an older vLLM (0.26) than the rollout image (the lock's, 0.32),
which serves the same HF Qwen2 folders.
"""

from __future__ import annotations

import flyte
from flyteplugins.vllm import DEFAULT_VLLM_IMAGE, VLLMAppEnvironment

APP_NAME = "dapo-serve"


def serving_app(*, model_path: str, model_id: str, engine_flags: list[str], gpus: int = 1,
                name: str = APP_NAME) -> VLLMAppEnvironment:
    """An app serving the checkpoint at ``model_path`` (an object-store URI) as ``model_id``.

    ``engine_flags`` are ``vllm serve`` flags without the model (engines/rollout/serving.py); ``gpus`` is
    the engine's tensor-parallel size.
    """
    return VLLMAppEnvironment(
        name=name,
        image=DEFAULT_VLLM_IMAGE,
        model_path=model_path,
        model_id=model_id,
        extra_args=list(engine_flags),
        resources=flyte.Resources(cpu="8", memory="64Gi", gpu=gpus),
        stream_model=True,  # weights go from the object store straight to the GPU
    )
