"""``dapo deploy``: serialise (``--dry-run``) or register every Flyte environment and task for a cluster.

The dry run needs no backend: it runs the SDK's own deploy path with ``dry_run=True`` against a
placeholder endpoint and, beyond what Flyte accepts, fails when a module cannot be imported, a
task input or output would travel as a pickle, or serialisation raises. ``--config`` validates and
sizes the run for a cluster (infra/sizing.py), ``--sizing`` prints docs/CLUSTER.md's tables,
``--serve`` adds the serving app, ``--engines-ray-address`` gives every pod a long-lived Ray cluster
for the engines (settings/rollout.py: EngineHosting). Flyte and the task modules are imported only after the target
and plan are set in the process environment, so run this as its own process (the CLI does).

Design notes (the checks, default inputs, serving): docs/CLUSTER.md, "Deploy (cli/deploy.py)".
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

from infra import handoff, model_shape, sizing
from cli.launch import DEFAULT_DOMAIN, DEFAULT_PROJECT, remote_run_dir
from settings.checks import FieldError
from settings.rollout import EngineHosting
from workflows.exit_codes import BAD_INPUT, FAILED

REPO_ROOT = Path(__file__).resolve().parents[1]
# Importing the driver imports every task module; the rest are listed so none is missed.
PIPELINE_MODULES = (
    "workflows.driver",
    "tasks.curate",
    "tasks.bootstrap",
    "tasks.rollout",
    "tasks.score",
    "tasks.batch",
    "tasks.train",
    "tasks.evaluate",
)
# environment name -> tasks it must hold (what the driver calls, and the driver itself)
EXPECTED_TASKS: dict[str, tuple[str, ...]] = {
    "dapo-cpu": ("curate", "bootstrap", "score", "assemble_batch", "dapo_pipeline"),
    "dapo-rollout": ("rollout", "evaluate"),
    "dapo-train": ("train",),
}
PLACEHOLDER_ENDPOINT = "dns:///flyte.invalid:443"  # never contacted by a dry run
DRIVER_TASK = "dapo_pipeline"  # the task `dapo run --remote` starts; its default inputs come from --config
KNOWN_ARCHITECTURES = {"qwen2.5-32b": sizing.QWEN2_5_32B}


class DeployError(RuntimeError):
    """Deployment cannot go on; the message names the module, environment, task or field."""


class DeployInputError(DeployError):
    """What the command was given is wrong (an option, the config, a checkpoint); exit code 2."""


# ----------------------------------------------------------------------------- long-lived engines

ENGINE_OPTIONS = {"ray_address": "--engines-ray-address", "namespace": "--engines-namespace"}  # EngineHosting field -> option


def engine_hosting(address: str, namespace: str, *, run_dir: str, target: str) -> EngineHosting | None:
    """The EngineHosting every pod gets (settings/rollout.py), or None without ``--engines-ray-address``.

    A pod is no member of the long-lived Ray cluster, so it joins through Ray's client: the address must
    be ``ray://HOST:PORT``. The namespace is the one named, else the run folder's, derived as a local run
    derives it (engines/rollout/ray_engines.py: run_namespace), so the driver's end-of-run removal and the
    tasks agree on it. Raises DeployInputError naming the option (exit 2, before anything is registered).
    """
    from engines.rollout.ray_engines import run_namespace

    if not address:
        if namespace:
            raise DeployInputError(f"--engines-namespace {namespace!r}: names the engines' namespace on a long-lived "
                                   "Ray cluster; give its address too (--engines-ray-address ray://HOST:PORT)")
        return None
    if target != "cluster":
        raise DeployInputError(f"--engines-ray-address {address!r}: only with --target cluster (a local run takes "
                               "DAPO_ENGINES_RAY_ADDRESS from its own environment)")
    if not address.startswith("ray://"):
        raise DeployInputError(f"--engines-ray-address {address!r}: a task pod joins the long-lived Ray cluster "
                               "through Ray's client; give ray://HOST:PORT (the head's client port, 10001 by default)")
    if not namespace and not run_dir:
        raise DeployInputError(f"--engines-ray-address {address!r}: name the engines' namespace (--engines-namespace "
                               "NAME), or give --config and --run-root so the run folder derives it")
    try:
        return EngineHosting(ray_address=address, namespace=namespace or run_namespace(run_dir))
    except FieldError as err:
        raise DeployInputError(f"{ENGINE_OPTIONS[err.field]} {err.value!r}: {err.why}") from None


# ----------------------------------------------------------------------------- sizing a config


def architecture_for(source: str, model: str = "") -> sizing.ModelArchitecture | None:
    """The architecture to size: ``--model`` name, else the bootstrap source folder's config.json, else a
    known name in the source; None for the tiny
    policies: the one warmed up (``tiny``) and those shipped in assets/policies (``shipped:NAME``, the
    main job's), which fit the CPU and need no cluster plan."""
    from engines.bootstrap.stage import SHIPPED_PREFIX

    if model:
        if model.lower() not in KNOWN_ARCHITECTURES:
            raise DeployInputError(f"--model {model!r}: known architectures are {sorted(KNOWN_ARCHITECTURES)}")
        return KNOWN_ARCHITECTURES[model.lower()]
    if source == "tiny" or source.startswith(SHIPPED_PREFIX):
        return None
    try:
        if model_shape.has_config(source):  # a model folder, local or in an object store: its own shape
            return model_shape.load_architecture(source)
    except ValueError as err:
        raise DeployInputError(f"bootstrap.source: {err}") from err
    for name, arch in KNOWN_ARCHITECTURES.items():
        if name in source.lower():
            return arch
    raise DeployInputError(
        f"bootstrap.source {source!r}: no {model_shape.config_location(source)} and no known architecture in its name; "
        f"point it at a model folder or pass --model one of {sorted(KNOWN_ARCHITECTURES)}"
    )


def resolve_plan(config: Any, args: argparse.Namespace) -> tuple[sizing.ClusterPlan | None, dict[str, Any]]:
    """``(plan, DAPO_CLUSTER_PLAN dict)`` for a RunConfig; the plan is None for the tiny model (whose pods
    keep infra/environments.py's defaults). Raises sizing.PlanDoesNotFit (one line, exit 2) before any
    Flyte import when the run cannot fit the GPUs given."""
    arch = architecture_for(config.bootstrap.source, args.model)
    head = sizing.rollout_head_request(
        sequences_per_round=config.run.prompts_per_round * config.rollout.samples_per_prompt,
        tokens_per_sequence=args.max_prompt_tokens + config.rollout.max_response_tokens,
    )
    overrides: dict[str, Any] = {"gpus_per_node": args.gpus_per_node, "run_store_pvc": args.run_store_pvc,
                                 "run_store_mount": args.run_store_mount, "rollout_head_cpu": str(head.cpus),
                                 "rollout_head_memory": head.memory}
    if arch is None:
        return None, overrides
    plan = sizing.plan_cluster(
        arch,
        zero_stage=config.train.zero_stage,
        micro_batch_samples=config.train.micro_batch_samples,
        max_prompt_tokens=args.max_prompt_tokens,
        max_response_tokens=config.rollout.max_response_tokens,
        samples_per_prompt=config.rollout.samples_per_prompt,
        gpu_memory_bytes=int(args.gpu_memory_gb * sizing.GB),
        gpus_per_node=args.gpus_per_node,
        gpu_memory_utilization=config.rollout.gpu_memory_utilization,
        train_gpus=args.train_gpus,
        configured_train_processes=config.train.num_processes,
        configured_rollout_engines=config.rollout.engines,
        configured_tensor_parallel=getattr(config.rollout, "tensor_parallel_size", 1),
        logprob_chunk_tokens=getattr(config.train, "logprob_chunk_tokens", 0),
        precision=config.train.precision,
        configured_activation_checkpointing=getattr(config.train, "activation_checkpointing", None),
    )
    overrides.update(
        rollout_engines=plan.rollout_engines,
        rollout_tensor_parallel=plan.rollout_tensor_parallel,
        rollout_nodes=plan.rollout_nodes,
        train_nproc_per_node=plan.train_nproc_per_node,
        train_nodes=plan.train_nodes,
        rollout_pod_cpu=str(plan.rollout_pod.cpus),
        rollout_pod_memory=plan.rollout_pod.memory,
        rollout_pod_gpus=plan.rollout_pod.gpus,
        train_pod_cpu=str(plan.train_pod.cpus),
        train_pod_memory=plan.train_pod.memory,
    )
    return plan, overrides


def describe_handoff(config: Any, plan: sizing.ClusterPlan, *, train_on_host: bool = False) -> str:
    """The per-step checkpoint hand-off (infra/handoff.py) and the run's checkpoint storage under
    its retention policy (``run.keep_*``), for the resolved plan (``train_on_host``: :func:`trains_on_host`)."""
    cost = handoff.step_handoff(plan, prompts_per_step=config.run.prompts_per_step,
                                prompts_per_round=config.run.prompts_per_round,
                                samples_per_prompt=config.rollout.samples_per_prompt, precision=config.train.precision,
                                evaluate_every_steps=config.run.eval_every_steps)
    drv = config.run
    kept = handoff.run_storage_bytes(drv.steps, cost.weights_bytes, cost.optimizer_bytes,
                                     keep_optimizer_last=drv.keep_optimizer_checkpoints,
                                     keep_weights_every=drv.keep_weights_every_steps)
    everything = handoff.run_storage_bytes(drv.steps, cost.weights_bytes, cost.optimizer_bytes, keep_optimizer_last=0,
                                           keep_weights_every=0)
    if train_on_host:
        group = f" (a group of {plan.train_nodes} members, one per train node)" if plan.train_nodes > 1 else ""
        mode = (f"row d: the train task is a client of the train host{group} on the long-lived Ray cluster "
                "(--engines-ray-address)" + (f", with train.optimizer_state_every={config.train.optimizer_state_every} (d's second row at its k)"
                   if config.train.optimizer_state_every > 1 else ""))
    elif drv.pipelined:
        mode = ("run.pipelined: true, so the pipelined row is what it does (without a persistent Ray cluster, add row "
                "c's starts)")
    else:
        mode = ("run.pipelined: false (synchronous): row d with a persistent Ray cluster (--engines-ray-address: the "
                "train task a client of the train host), row c without")
    return handoff.format_handoff(cost) + f"\n    this config: {mode}" + (
        f"\n  storage : {drv.steps} steps keep {kept / 1e12:,.1f} TB of checkpoints with run.keep_optimizer_checkpoints="
        f"{drv.keep_optimizer_checkpoints}, run.keep_weights_every_steps={drv.keep_weights_every_steps} "
        f"({everything / 1e12:,.1f} TB keeping all)")


# ----------------------------------------------------------------------------- the driver's default inputs


def with_default_inputs(task: Any, defaults: dict[str, Any]) -> Any:
    """A copy of ``task`` whose inputs named in ``defaults`` default to those values. Flyte registers a
    task's defaults as its default inputs (the UI's launch form opens with them); nothing else of the
    task changes (its name, typed interface, cache version)."""
    unknown = sorted(set(defaults) - set(task.interface.inputs))
    if unknown:
        raise DeployError(f"{task.name}: no input(s) {unknown}; it takes {sorted(task.interface.inputs)}")
    inputs = {name: (python_type, defaults.get(name, default))
              for name, (python_type, default) in task.interface.inputs.items()}
    return dataclasses.replace(task, interface=dataclasses.replace(task.interface, inputs=inputs))


def set_driver_defaults(envs: list[Any], defaults: dict[str, Any]) -> Any:
    """Give the driver task of ``envs`` these default inputs (in its environment, before serialising);
    returns the new task."""
    for env in envs:
        for name, task in env.tasks.items():
            if name.split(".", 1)[-1] == DRIVER_TASK:
                env.tasks[name] = with_default_inputs(task, defaults)
                return env.tasks[name]
    raise DeployError(f"no environment holds the driver task {DRIVER_TASK!r}")


def serialised_default_inputs(task: Any) -> dict[str, Any]:
    """``{input: its default literal as JSON}``: what Flyte registers as ``task``'s default inputs, from the
    SDK's own conversion (``convert_upload_default_inputs``, the one a real deploy calls; a dry run skips it)."""
    import asyncio

    from flyte._internal.runtime.convert import convert_upload_default_inputs

    parameters = asyncio.run(convert_upload_default_inputs(task.interface))
    return {named.name: _struct_to_dict(named.parameter.default) for named in parameters}


# ----------------------------------------------------------------------------- loading tasks


def import_module(name_or_path: str) -> Any:
    """Import a dotted module name, or a ``.py`` file (as a throwaway module of its stem)."""
    try:
        if name_or_path.endswith(".py"):
            path = Path(name_or_path).resolve()
            spec = importlib.util.spec_from_file_location(path.stem, path)
            if spec is None or spec.loader is None:
                raise DeployInputError(f"{path}: not a Python module")
            module = importlib.util.module_from_spec(spec)
            sys.modules[path.stem] = module
            spec.loader.exec_module(module)
            return module
        return importlib.import_module(name_or_path)
    except DeployError:
        raise
    except Exception as err:  # any import-time failure is a broken task module
        raise DeployError(f"importing {name_or_path}: {type(err).__name__}: {err}") from err


def collect_environments(modules: list[Any]) -> list[Any]:
    """Every TaskEnvironment defined at top level of ``modules`` and of infra.environments, by name."""
    import flyte

    from infra import environments

    found: dict[str, Any] = {}
    for module in [environments, *modules]:
        for value in vars(module).values():
            if isinstance(value, flyte.TaskEnvironment):
                other = found.setdefault(value.name, value)
                if other is not value:
                    raise DeployError(f"{module.__name__}: a second environment named {value.name!r}")
    return list(found.values())


def check_expected_tasks(envs: list[Any]) -> None:
    by_name = {env.name: env for env in envs}
    for env_name, tasks in EXPECTED_TASKS.items():
        if env_name not in by_name:
            raise DeployError(f"environment {env_name!r} is missing (infra/environments.py)")
        held = {t.split(".", 1)[-1] for t in by_name[env_name].tasks}
        missing = [t for t in tasks if t not in held]
        if missing:
            raise DeployError(f"environment {env_name!r} lacks task(s) {missing}; it holds {sorted(held)}")


# ----------------------------------------------------------------------------- serialising


def _literal_type_text(var: Any) -> str:
    from google.protobuf import text_format

    return text_format.MessageToString(var.type, as_one_line=True)


def task_rows(deployments: list[Any]) -> list[dict[str, Any]]:
    """One dict per serialised task: environment, name, type, image, resources, environment variables (env),
    inputs, outputs, plugin summary."""
    rows = []
    for deployment in deployments:
        for env_name, deployed_env in deployment.envs.items():
            for entity in getattr(deployed_env, "deployed_entities", ()):  # apps have none
                template = entity.deployed_task.task_template
                container = template.container if template.HasField("container") else None
                pod = template.k8s_pod if template.HasField("k8s_pod") else None
                image, resources, env = "", {}, {}
                if container is not None:
                    image = container.image
                    resources = {_resource_name(r.name): r.value for r in container.resources.requests}
                    env = {pair.key: pair.value for pair in container.env}
                elif pod is not None:
                    spec = _struct_to_dict(pod.pod_spec)
                    primary = next(iter(spec.get("containers", [])), {})
                    image = primary.get("image", "")
                    resources = dict(primary.get("resources", {}).get("requests", {}))
                    env = {pair["name"]: pair.get("value", "") for pair in primary.get("env", [])}
                custom = json.loads(json.dumps(_struct_to_dict(template.custom))) if template.HasField("custom") else {}
                rows.append(
                    {
                        "environment": env_name,
                        "task": template.id.name,
                        "type": template.type,
                        "image": image,
                        "resources": resources,
                        "env": env,
                        "inputs": {v.key: _literal_type_text(v.value) for v in template.interface.inputs.variables},
                        "outputs": {v.key: _literal_type_text(v.value) for v in template.interface.outputs.variables},
                        "plugin": _plugin_summary(template.type, custom),
                    }
                )
    return rows


def app_rows(deployments: list[Any]) -> list[dict[str, Any]]:
    """One dict per serialised app (``dapo deploy --serve``): name, image, resources, args."""
    rows = []
    for deployment in deployments:
        for env_name, deployed_env in deployment.envs.items():
            app = getattr(deployed_env, "deployed_app", None)
            if app is None:
                continue
            spec = app.pb2.spec
            container = spec.container
            rows.append({
                "app": env_name,
                "image": container.image,
                "resources": {_resource_name(r.name): r.value for r in container.resources.requests},
                "args": list(container.args),
            })
    return rows


def _resource_name(value: int) -> str:
    from flyteidl2.core import tasks_pb2

    return tasks_pb2.Resources.ResourceName.Name(value).lower()


def _struct_to_dict(struct: Any) -> dict[str, Any]:
    from google.protobuf.json_format import MessageToDict

    return MessageToDict(struct)


def _plugin_summary(task_type: str, custom: dict[str, Any]) -> str:
    if task_type == "pytorch":
        elastic = custom.get("elasticConfig", {})
        nodes = custom.get("workerReplicas", {}).get("replicas", elastic.get("minReplicas", "?"))
        nproc = elastic.get("nprocPerNode", "?")
        as_int = lambda v: int(v) if isinstance(v, (int, float)) else v  # noqa: E731 (struct numbers are floats)
        return (f"PyTorchJob (Elastic): {as_int(nodes)} node(s) x {as_int(nproc)} rank(s), "
                f"rendezvous {elastic.get('rdzvBackend', '?')}")
    if task_type != "ray":
        return ""
    groups = custom.get("rayCluster", {}).get("workerGroupSpec", [])
    parts = []
    for group in groups:
        gpus = group.get("rayStartParams", {}).get("num-gpus", "?")
        requests = _pod_requests(group.get("k8sPod", {}))
        parts.append(f"{group.get('groupName')}: {int(group.get('replicas', 0))} pod(s) x {gpus} GPU" + (
            f" (requests {requests})" if requests else ""))
    return "RayJob " + "; ".join(parts)


def _pod_requests(k8s_pod: dict[str, Any]) -> str:
    """``cpu=.., memory=..`` of a plugin pod spec's first container (a Ray worker group's)."""
    containers = k8s_pod.get("podSpec", {}).get("containers", [])
    requests = containers[0].get("resources", {}).get("requests", {}) if containers else {}
    return ", ".join(f"{k}={v}" for k, v in sorted(requests.items()) if k in ("cpu", "memory"))


def pickled_interfaces(rows: list[dict[str, Any]]) -> list[str]:
    """``env/task: input x`` for every input/output that falls back to Flyte's pickle transport."""
    bad = []
    for row in rows:
        for direction in ("inputs", "outputs"):
            for name, text in row[direction].items():
                if "FlytePickle" in text or "PythonPickle" in text:
                    bad.append(f"{row['task']}: {direction[:-1]} {name!r}")
    return bad


def serialise(envs: list[Any], *, dry_run: bool, version: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(task rows, app rows)`` of every environment, serialised (and registered unless ``dry_run``)."""
    import flyte

    try:
        deployments = flyte.deploy(*envs, dry_run=dry_run, version=version, copy_style="none" if dry_run else "loaded_modules")
    except Exception as err:
        raise DeployError(
            f"serialising environments {[e.name for e in envs]} failed: {type(err).__name__}: {err}"
        ) from err
    return task_rows(deployments), app_rows(deployments)


def serving_environment(checkpoint: str, plan_env: dict[str, Any]) -> Any:
    """The serving app (infra/serving_app.py) for ``checkpoint`` (or a run folder's final one).

    Reads only the checkpoint's metadata and config (never its weights): its id names the served
    model, its context and the run's rollout section give the engine flags, as ``dapo serve``.
    """
    from engines.rollout import stage as rollout, serving
    from infra.serving_app import serving_app
    from settings.rollout import RolloutConfig
    from storage import checkpoints, run_store
    from workflows.policy_source import locate_checkpoint, run_config, run_folder_of

    if not run_store.is_remote(checkpoint):
        raise DeployInputError(f"--serve {checkpoint}: the serving app streams the checkpoint from the object store; "
                          "pass its URI (s3://..., gs://..., abfs://...)")
    try:
        source = locate_checkpoint(checkpoint)
        run_dir = run_folder_of(source)
        config = run_config(run_dir).rollout if run_dir else RolloutConfig()
        tensor_parallel = int(plan_env.get("rollout_tensor_parallel") or config.tensor_parallel_size)
        config = dataclasses.replace(config, tensor_parallel_size=tensor_parallel)
        settings = rollout.engine_settings(config, config.max_model_len or rollout.model_max_positions(source))
        model_id = checkpoints.read_info(source).checkpoint_id
    except (checkpoints.CheckpointError, FileNotFoundError, ValueError) as err:
        raise DeployInputError(f"--serve {checkpoint}: {err}") from err
    return serving_app(model_path=source, model_id=model_id, engine_flags=serving.engine_flags(settings, on_cpu=False),
                       gpus=tensor_parallel)


def format_rows(rows: list[dict[str, Any]], apps: list[dict[str, Any]] = ()) -> str:
    lines = []
    for env in sorted({r["environment"] for r in rows}):
        lines.append(f"environment {env}:")
        for row in (r for r in rows if r["environment"] == env):
            res = ", ".join(f"{k}={v}" for k, v in sorted(row["resources"].items())) or "-"
            lines.append(f"  task {row['task']}  [{row['type']}]  image {row['image'] or '-'}  requests {res}")
            lines.append(f"    inputs: {', '.join(row['inputs']) or '-'}  ->  outputs: {', '.join(row['outputs']) or '-'}")
            if row["plugin"]:
                lines.append(f"    {row['plugin']}")
    for app in apps:
        res = ", ".join(f"{k}={v}" for k, v in sorted(app["resources"].items())) or "-"
        lines.append(f"app {app['app']}:  image {app['image'] or '-'}  requests {res}")
        lines.append(f"    {' '.join(app['args'])}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``dapo deploy``."""
    parser.add_argument("--dry-run", action="store_true", help="serialise every task offline; register nothing")
    parser.add_argument("--config", help="run config YAML to validate and size for the cluster")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE", help="override a config field")
    parser.add_argument("--run-root", default="",
                        help="with --config: the run store the pods share (s3://bucket/runs, or the --run-store-mount "
                             "path); the driver's default run_dir is the config's run folder there")
    parser.add_argument("--module", action="append", default=[], metavar="MODULE_OR_FILE",
                        help="also import this module (dotted name or .py file) and deploy its environments")
    parser.add_argument("--target", choices=("cluster", "local"), default="cluster",
                        help="which environments to build (default: %(default)s)")
    parser.add_argument("--model", default="", help=f"architecture to size, one of {sorted(KNOWN_ARCHITECTURES)}")
    parser.add_argument("--gpu-memory-gb", type=float, default=80.0, help="memory of one GPU in GB (default: %(default)s)")
    parser.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default: %(default)s)")
    parser.add_argument("--train-gpus", type=int, default=0,
                        help="training GPUs (up to one node, or whole nodes); refused when the run does not fit them "
                             "(default: the fewest that fit). Rollout GPUs: rollout.engines x tensor_parallel_size")
    parser.add_argument("--max-prompt-tokens", type=int, default=1024,
                        help="longest prompt assumed by the sizing (default: %(default)s)")
    parser.add_argument("--run-store-pvc", default="", help="ReadWriteMany PVC holding the run store, mounted in every pod "
                        "(leave out for an object-store run store: run_dir s3://..., see docs/CLUSTER.md)")
    parser.add_argument("--run-store-mount", default="/runs", help="where the run store is mounted (default: %(default)s)")
    parser.add_argument("--engines-ray-address", default="", metavar="ray://HOST:PORT",
                        help="a long-lived Ray cluster for the rollout and evaluation engines: every pod gets "
                             "DAPO_ENGINES_RAY_ADDRESS, rollout and evaluate become plain pods joining it, and the "
                             "engines stay warm between calls; with a train plan of one node the train task becomes "
                             "the client of a warm train host there too (docs/CLUSTER.md, \"What stays warm where\")")
    parser.add_argument("--engines-namespace", default="", metavar="NAME",
                        help="with --engines-ray-address: the engines' Ray namespace (DAPO_ENGINES_NAMESPACE; default: "
                             "derived from the run folder of --config and --run-root, as a local run derives it)")
    parser.add_argument("--sizing", action="store_true", help="print the sizing tables (docs/CLUSTER.md) and exit")
    parser.add_argument("--sizing-out", help="with --sizing: also write the tables to this file")
    parser.add_argument("--serve", metavar="CHECKPOINT",
                        help="also deploy the serving app (vLLM, OpenAI API) for this checkpoint: an object-store URI "
                             "of a checkpoint folder, or of a run folder (its final checkpoint)")
    parser.add_argument("--flyte-config", help="Flyte config of the backend to register with (not with --dry-run)")
    parser.add_argument("--project", default=DEFAULT_PROJECT, help="Flyte project (default: %(default)s)")
    parser.add_argument("--domain", default=DEFAULT_DOMAIN, help="Flyte domain (default: %(default)s)")
    parser.add_argument("--version", default="", help="version to register (default: dry-run, or derived by Flyte)")
    parser.add_argument("--json-out", help="write the serialised task summary and plan as JSON here")


def refuse_fresh_pod_replay(config: Any) -> None:
    """Exit 2 when ``train.optimizer_state_every`` > 1 and the deployed train task starts fresh Elastic pods
    every step (no train host): each step would replay the steps since the last written optimizer state."""
    every = config.train.optimizer_state_every
    if every != 1:
        raise DeployInputError(
            f"train.optimizer_state_every={every}: the deployed train task starts fresh pods every step, which "
            "would replay the steps since the last written optimizer state on every step; set "
            "train.optimizer_state_every=1, or keep the ranks warm on the train host: `dapo deploy "
            "--engines-ray-address` with a one-node train plan, or `dapo run` with DAPO_ENGINES_RAY_ADDRESS")


def trains_on_host(config: Any, plan: sizing.ClusterPlan | None, hosting: EngineHosting | None) -> bool:
    """Whether the deployed train task is a client of the train host (engines/train/ray_host.py) on the
    long-lived Ray cluster: with one (``--engines-ray-address``) and warm workers (the host a group of one
    member per train node of the plan); otherwise a PyTorch Elastic job of fresh pods every step."""
    return hosting is not None and config.train.keep_workers_warm


def _deploy(args: argparse.Namespace) -> int:
    plan = None
    plan_env: dict[str, Any] = {"gpus_per_node": args.gpus_per_node, "run_store_pvc": args.run_store_pvc,
                                "run_store_mount": args.run_store_mount}
    defaults: dict[str, Any] = {}  # the driver's default inputs (with --config)
    if args.config:
        from workflows.config import ConfigError, load_config

        try:
            config = load_config(args.config, args.set)
        except (ConfigError, ValueError) as err:
            raise DeployInputError(f"config: {err}") from err
        plan, plan_env = resolve_plan(config, args)
        defaults["run_config"] = config
        if args.run_root:
            defaults["run_dir"] = remote_run_dir(args.run_root, config.run.name)  # a relative root: exit 2
        print(f"config {args.config}: valid (digest {config.digest()})")
    elif args.run_root:
        raise DeployInputError("--run-root names the driver's default run folder: give --config too")
    hosting = engine_hosting(args.engines_ray_address, args.engines_namespace,
                             run_dir=defaults.get("run_dir", ""), target=args.target)
    if hosting is not None:  # every pod's environment (infra/environments.py: engines_env)
        plan_env["engines_env"] = hosting.environ()
    on_host = bool(args.config) and trains_on_host(config, plan, hosting)
    if args.config and not on_host:
        refuse_fresh_pod_replay(config)
    plan_env["train_on_host"] = on_host
    # Set before anything imports infra.environments: the environments are built from these.
    os.environ["DAPO_FLYTE_TARGET"] = args.target
    os.environ["DAPO_CLUSTER_PLAN"] = json.dumps(plan_env, sort_keys=True)
    os.environ.setdefault("DO_NOT_TRACK", "1")  # the SDK sends telemetry otherwise
    # Loading the config imported the task modules, which built the environments for the target
    # of that moment; forget them so the imports below rebuild them for this target and plan.
    for name in list(sys.modules):
        if name in ("infra.environments", "tasks", "workflows.driver", "workflows.local_run") or name.startswith("tasks."):
            del sys.modules[name]

    import flyte

    if args.dry_run:
        flyte.init(endpoint=PLACEHOLDER_ENDPOINT, project=args.project, domain=args.domain, root_dir=REPO_ROOT,
                   image_builder="local")
    else:
        if not args.flyte_config:
            raise DeployInputError("registering needs --flyte-config (the backend's config.yaml); or pass --dry-run")
        # the project and domain `dapo run --remote` looks the driver up in (same options, same defaults)
        flyte.init_from_config(args.flyte_config, root_dir=REPO_ROOT, project=args.project, domain=args.domain)

    modules = [import_module(name) for name in (*PIPELINE_MODULES, *args.module)]
    envs = collect_environments(modules)
    from infra import environments

    if environments.TARGET != args.target:
        raise DeployError(f"environments were built for target {environments.TARGET!r}, not {args.target!r}")
    check_expected_tasks(envs)
    default_inputs = serialised_default_inputs(set_driver_defaults(envs, defaults)) if args.config else {}
    if args.serve:
        envs.append(serving_environment(args.serve, plan_env))
    rows, apps = serialise(envs, dry_run=args.dry_run, version=args.version or ("dry-run" if args.dry_run else ""))
    pickled = pickled_interfaces(rows)
    if pickled:
        raise DeployError(
            "task interface(s) with no Flyte type (would be pickled; cannot be set from the UI, unstable cache keys): "
            + "; ".join(pickled)
        )
    verb = "would register" if args.dry_run else "registered"
    served = f" and {len(apps)} app(s)" if apps else ""
    print(f"dapo deploy ({args.target}): {verb} {len(rows)} task(s) in {len(envs) - len(apps)} environment(s){served}")
    print(format_rows(rows, apps))
    if default_inputs:
        run_dir = f", run_dir {defaults['run_dir']}" if "run_dir" in defaults else " (run_dir: none; give --run-root)"
        print(f"default inputs of {DRIVER_TASK}: run_config from {args.config} (digest {config.digest()}){run_dir}")
    if hosting is not None:
        print(f"engines: long-lived named actors on {hosting.ray_address}, namespace {hosting.namespace} "
              "(DAPO_ENGINES_* in every pod; removed by the driver at the run's end)")
    if on_host:
        nodes = plan.train_nodes if plan is not None else 1
        ranks = plan.train_gpus // nodes if plan is not None else config.train.num_processes
        where = "one node" if nodes == 1 else f"each of {nodes} nodes (a member of the host group per node)"
        print(f"train: a client pod of the train host, a warm DeepSpeed group of {ranks} rank(s) on {where} of "
              f"{hosting.ray_address} (engines/train/ray_host.py); that Ray cluster needs {nodes} node(s) with {ranks} "
              "GPU(s) each for it beside the engines'")
    if plan is not None:
        print(sizing.format_plan(plan))
        print(describe_handoff(config, plan, train_on_host=on_host))
    elif args.config:
        print("resolved resources: the tiny policy needs no GPU (one engine, one training process)")
    if args.json_out:
        payload = {"tasks": rows, "apps": apps, "plan": dataclasses.asdict(plan) if plan else None, "cluster_plan_env": plan_env,
                   "driver_default_inputs": default_inputs}
        Path(args.json_out).write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
    return 0


def run_cli(args: argparse.Namespace) -> int:
    """``dapo deploy``: exit 0 when every task serialised (or registered); otherwise a message and 2 when
    what it was given is wrong (an option, the config, a checkpoint), 1 when the code is (a module that
    does not import, a task without Flyte types, a failed registration)."""
    if args.sizing:
        text = sizing.sizing_tables_markdown(sizing.QWEN2_5_32B, gpu_memory_bytes=int(args.gpu_memory_gb * sizing.GB))
        print(text, end="")
        if args.sizing_out:
            Path(args.sizing_out).write_text(text)
        return 0
    try:
        return _deploy(args)
    except (DeployInputError, ValueError) as err:
        print(f"dapo deploy: error: {err}", file=sys.stderr)
        return BAD_INPUT
    except DeployError as err:
        print(f"dapo deploy: error: {err}", file=sys.stderr)
        return FAILED
