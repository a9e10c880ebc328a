"""What a rollout node downloads of a checkpoint from an object store: the whole folder vs the policy.

Uploads one published checkpoint folder (``--checkpoint``: weights, config, tokenizer files,
metadata and ``ds_state/``) to a local S3 server (moto, in a child process; tests/s3_server.py),
then fetches it ``--repeats`` times into empty mirrors, as a fresh node does: whole
(``run_store.fetch``, what a training node reads to resume) and without the optimizer state
(``storage.checkpoints.fetch_policy``, what rollout and evaluation nodes read). Prints the bytes
and seconds of each and writes benchmarks/results/checkpoint_fetch.json. A local S3 server has
no network, so the seconds measure the client's work, not a bucket's bandwidth; the bytes are
what a real bucket would send.

    .venv/bin/python benchmarks/checkpoint_fetch.py --checkpoint RUN/checkpoints/step-0030
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from machine import cpu_model  # noqa: E402  (benchmarks/machine.py)
from result_file import write_result  # noqa: E402  (benchmarks/result_file.py)
from tests import s3_server  # noqa: E402


def _bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True, help="a published checkpoint folder with its ds_state/")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "checkpoint_fetch.json"))
    args = parser.parse_args()
    source = Path(args.checkpoint)
    if not (source / "ds_state").is_dir():
        sys.exit(f"{source}: no ds_state/ (a pruned or imported checkpoint); give one the run kept whole")
    if not s3_server.available():
        sys.exit("moto is not installed (requirements-test.txt)")

    server = s3_server.start()
    os.environ.update(server.env)
    try:
        from storage import checkpoints, run_store

        uri = f"s3://{s3_server.BUCKET}/bench-{uuid.uuid4().hex[:8]}/checkpoints/step-0001"
        run_store.upload_folder(source, uri)
        ways = {"whole (train node)": run_store.fetch, "policy (rollout / eval node)": checkpoints.fetch_policy}
        rows = {}
        with tempfile.TemporaryDirectory(prefix="dapo-fetch-") as scratch:
            for name, fetch in ways.items():
                seconds, sizes = [], []
                for i in range(args.repeats):
                    os.environ[run_store.MIRROR_ENV] = str(Path(scratch) / f"{name[:5]}-{i}")  # a fresh node
                    started = time.perf_counter()
                    local = fetch(uri)
                    seconds.append(time.perf_counter() - started)
                    sizes.append(_bytes(local))
                rows[name] = {"bytes": sizes[0], "seconds_median": statistics.median(seconds),
                              "seconds": [round(s, 4) for s in seconds]}
    finally:
        server.stop()

    print(f"{'fetch of ' + source.name:32s} {'MB':>8s} {'ms (median)':>12s}")
    for name, row in rows.items():
        print(f"{name:32s} {row['bytes'] / 1e6:8.2f} {row['seconds_median'] * 1e3:12.1f}")
    result = {
        "checkpoint": str(source),
        "repeats": args.repeats,
        "fetches": rows,
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                 text=True).stdout.strip(),
        "cpu": cpu_model(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
