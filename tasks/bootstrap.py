"""The bootstrap stage as a Flyte task: publish the step-0 policy checkpoint (tiny warm-up or a local model).

The work is engines/bootstrap/stage.py; settings: settings/bootstrap.py; ``dapo bootstrap``: cli/bootstrap.py.
"""

from __future__ import annotations

import dataclasses

from engines.bootstrap.stage import bootstrap_policy, resolve_source
from infra.environments import cpu_env, stage_cache
from settings.bootstrap import BootstrapConfig
from storage import checkpoints, outputs, run_store


@cpu_env.task(
    cache=stage_cache("bootstrap", __name__)
)
def bootstrap(train_paths: list[str], test_paths: list[str], out_dir: str, config: BootstrapConfig,
              upstream_digest: str = "") -> str:  # upstream_digest: cache key of the problems' content
    """Flyte task: publish the step-0 checkpoint at ``out_dir`` and return its folder.

    ``out_dir`` must be durable storage (a path, or an object-store URI: storage/run_store.py): a
    cache hit returns the path without rebuilding.
    """
    if not run_store.is_remote(out_dir):
        with outputs.output(out_dir, folder=True):  # records the published folder's digests
            return str(bootstrap_policy(out_dir, config, train_paths, test_paths))
    if not checkpoints.is_complete(out_dir):  # else published already
        source = resolve_source(config.source)
        source = source if source == "tiny" else str(run_store.fetch(source))
        with outputs.output(out_dir, folder=True) as local:
            bootstrap_policy(local, dataclasses.replace(config, source=source, link_import=False),
                             run_store.fetch_all(train_paths), run_store.fetch_all(test_paths))
    return out_dir
