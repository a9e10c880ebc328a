"""``dapo run --remote``: start the deployed pipeline on a Flyte cluster with a config, as ``dapo run`` does locally.

The config is loaded by the same loader as a local run (workflows/config.py: ``load_config``, the
same ``--set`` overrides and errors, exit 2) before anything is contacted; then the driver task that
``dapo deploy`` registered (``dapo_pipeline``) is looked up by name in the project and domain given
(the newest version, or ``--version``) and run with that config and the run folder under
``--run-root``, through the Flyte 2 SDK's own remote run (``flyte.with_runcontext(mode="remote").run``,
which types the inputs against the deployed task's interface). Prints the run's URL.

A cluster's pods share only the run store, so ``--run-root`` must be an object-store URI
(``s3://bucket/runs``) or the absolute path where ``dapo deploy --run-store-pvc`` mounts its volume.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

DEFAULT_PROJECT = "dapo"
DEFAULT_DOMAIN = "development"


class LaunchInputError(ValueError):
    """What ``dapo run --remote`` was given is wrong (backend config, run root, project, version); exit 2."""


@dataclass(frozen=True)
class Backend:
    """Where the deployed pipeline lives: the Flyte config of the backend, its project and domain, and the
    version of the deployed tasks to run ("" = the newest one registered)."""

    flyte_config: str
    project: str
    domain: str
    version: str


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The cluster options of ``dapo run`` (``--config``, ``--set`` and ``--run-root`` are the local run's)."""
    group = parser.add_argument_group("cluster run (--remote)")
    group.add_argument("--remote", action="store_true",
                       help="start the run on the Flyte cluster of --flyte-config (the pipeline `dapo deploy` "
                            "registered) and print its URL, instead of running here")
    group.add_argument("--flyte-config", default="", help="with --remote: the backend's Flyte config.yaml")
    group.add_argument("--project", default=DEFAULT_PROJECT, help="with --remote: Flyte project (default: %(default)s)")
    group.add_argument("--domain", default=DEFAULT_DOMAIN, help="with --remote: Flyte domain (default: %(default)s)")
    group.add_argument("--version", default="",
                       help="with --remote: version of the deployed pipeline (default: the newest registered)")


def backend_of(args: argparse.Namespace) -> Backend:
    """The backend named on the command line; refuses a missing Flyte config file before any contact."""
    if not args.flyte_config:
        raise LaunchInputError("--remote needs --flyte-config (the backend's config.yaml, as for `dapo deploy`)")
    if not Path(args.flyte_config).is_file():
        raise LaunchInputError(f"--flyte-config {args.flyte_config}: no such file")
    return Backend(flyte_config=args.flyte_config, project=args.project, domain=args.domain, version=args.version)


def remote_run_dir(run_root: str, run_name: str) -> str:
    """The run folder a cluster run writes: ``run_root/run_name``, where ``run_root`` is a store every pod
    reaches (an object-store URI, or an absolute path on the shared volume). A relative path would name a
    folder inside one pod: refused."""
    from storage import run_store

    if run_store.is_remote(run_root):
        return run_store.join(run_root, run_name)
    if PurePosixPath(run_root).is_absolute():
        return str(PurePosixPath(run_root) / run_name)
    raise LaunchInputError(
        f"--run-root {run_root}: a cluster run needs a run store every pod reaches: an object-store URI "
        "(s3://bucket/runs) or the absolute path where `dapo deploy --run-store-pvc` mounts it (/runs)")


def driver_task_name() -> str:
    """The deployed name of the driver task (``<environment>.dapo_pipeline``), from the task itself."""
    from workflows import driver

    return driver.dapo_pipeline.name


def launch(config: Any, run_dir: str, backend: Backend) -> Any:
    """Start ``dapo_pipeline(run_config=config, run_dir=run_dir)`` on the backend; returns the SDK's Run.

    The deployed task is fetched by reference (never re-uploaded from this checkout), so the cluster
    runs exactly the code ``dapo deploy`` registered. A project, domain or version without it is
    bad input (:class:`LaunchInputError`) and no run is created.
    """
    import flyte
    import flyte.errors
    import flyte.remote

    flyte.init_from_config(backend.flyte_config, project=backend.project, domain=backend.domain)
    name = driver_task_name()
    try:
        deployed = flyte.remote.Task.get(name, project=backend.project, domain=backend.domain,
                                         version=backend.version or None,
                                         auto_version=None if backend.version else "latest").fetch()
    except flyte.errors.RemoteTaskNotFoundError as err:
        version = f"version {backend.version}" if backend.version else "any version"
        raise LaunchInputError(
            f"--project {backend.project} --domain {backend.domain}: no deployed {name} ({version}); "
            f"register it with `dapo deploy --flyte-config {backend.flyte_config} --project {backend.project} "
            f"--domain {backend.domain}` ({err})") from None
    inputs = as_deployed_types(deployed, {"run_config": config, "run_dir": run_dir})
    return flyte.with_runcontext(mode="remote", project=backend.project, domain=backend.domain).run(deployed, **inputs)


def as_deployed_types(deployed: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    """``inputs`` (the driver's own Python types) as values of the fetched task's interface types.

    A fetched task's interface is rebuilt from its literal types, so its RunConfig is a look-alike
    class the SDK generates, which refuses our RunConfig instance. Each value goes through the SDK's
    type engine: to its literal with the driver's declared type, back with the deployed one; what is
    sent is then the same literal a call of the task in this process would send.
    """
    import asyncio

    from flyte.types import TypeEngine

    from workflows import driver

    declared = driver.dapo_pipeline.native_interface.inputs

    async def convert(name: str, value: Any) -> Any:
        python_type = declared[name][0]
        literal = await TypeEngine.to_literal(value, python_type, TypeEngine.to_literal_type(python_type))
        return await TypeEngine.to_python_value(literal, deployed.interface.inputs[name][0])

    async def convert_all() -> dict[str, Any]:
        return {name: await convert(name, value) for name, value in inputs.items()}

    return asyncio.run(convert_all())


def run_cli(config: Any, args: argparse.Namespace) -> int:
    """``dapo run --remote`` after the config loaded: check the rest of the input, start the run, print its URL."""
    from workflows.exit_codes import BAD_INPUT

    try:
        backend = backend_of(args)
        run_dir = remote_run_dir(args.run_root, config.run.name)
        run = launch(config, run_dir, backend)
    except LaunchInputError as err:
        print(f"dapo run: {err}", file=sys.stderr)
        return BAD_INPUT
    print(f"dapo run --remote: started {driver_task_name()} on {backend.project}/{backend.domain} "
          f"(config digest {config.digest()}), run folder {run_dir}")
    print(run.url)
    return 0
