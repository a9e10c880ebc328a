"""The curation stage as a Flyte task: raw problem sources into Problem and RejectedProblem shards.

The work is engines/curate/stage.py; settings: settings/curate.py; ``dapo curate``: cli/curate.py.
"""

from __future__ import annotations

from engines.curate.stage import CurateReport, curate_sources
from infra.environments import cpu_env, stage_cache
from settings.curate import CurateConfig
from storage import outputs


@cpu_env.task(
    cache=stage_cache("curate", __name__)
)
def curate(inputs: list[str], out_dir: str, config: CurateConfig, upstream_digest: str = "") -> CurateReport:
    """Flyte task: curate ``inputs`` into Problem / RejectedProblem shards under ``out_dir``.

    ``upstream_digest`` puts the input files' content into the cache key: a data file edited in
    place is curated again.

    ``out_dir`` must be durable storage (a path, or an object-store URI: storage/run_store.py): a
    cache hit returns the report without rewriting it.
    """
    with outputs.output(out_dir, folder=True) as local:
        return curate_sources(inputs, local, config)
