"""``dapo engines release``: remove the long-lived engine actors and train host a run left on a Ray cluster.

With ``DAPO_ENGINES_RAY_ADDRESS`` set (settings/rollout.py: EngineHosting), rollout and evaluation engines
are named, detached Ray actors that outlive the task processes (engines/rollout/ray_engines.py), and so is
the train host holding the warm DeepSpeed group (engines/train/ray_host.py). A run removes its own when it
ends, failed or not; a driver killed outright (SIGKILL, a lost pod) cannot, and its actors keep their GPUs
and memory until this command removes them: by the run folder (the run's namespace) or by a namespace
named in the deployment.

    dapo engines release --run runs/tiny-cpu
    dapo engines release --namespace dapo-engines --ray-address ray://head:10001
"""

from __future__ import annotations

import argparse
import os
import sys

from workflows.exit_codes import BAD_INPUT, OK


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["release"], help="release: kill the engine actors and train host of a namespace")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--run", help="the run folder (path or URI), or a run name under --run-root, whose actors to remove")
    which.add_argument("--namespace", help="the Ray namespace whose actors to remove")
    parser.add_argument("--run-root", default="runs", help="where --run names are looked up (default: %(default)s)")
    parser.add_argument("--ray-address", default=None,
                        help="the long-lived Ray cluster (default: $DAPO_ENGINES_RAY_ADDRESS)")


def run_cli(args: argparse.Namespace) -> int:
    from engines.rollout import ray_engines
    from settings.rollout import ENGINES_RAY_ADDRESS_ENV, EngineHosting

    address = args.ray_address if args.ray_address is not None else os.environ.get(ENGINES_RAY_ADDRESS_ENV, "")
    if not address:
        print(f"dapo engines: no Ray cluster named: pass --ray-address or set {ENGINES_RAY_ADDRESS_ENV}", file=sys.stderr)
        return BAD_INPUT
    namespace = args.namespace
    if namespace is None:  # the run's namespace, from its folder named as the driver named it
        from storage import run_lookup

        try:
            namespace = ray_engines.run_namespace(run_lookup.run_folder(args.run, args.run_root))
        except run_lookup.RunNotFound as err:
            print(f"dapo engines: error: {err}", file=sys.stderr)
            return BAD_INPUT
    released = ray_engines.release(EngineHosting(ray_address=address, namespace=namespace))
    print(f"released {len(released)} actor(s) of Ray namespace {namespace}" +
          (f": {', '.join(released)}" if released else ""))
    return OK
