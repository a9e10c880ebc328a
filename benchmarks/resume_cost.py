"""What a resume's check of cached outputs costs: seconds, bytes read, files hashed, store requests.

On a resume every task call is a cache hit, and the driver checks each output it points to against
its digest record (workflows/verified_calls.py: damaged_outputs) before the run goes on. This
script times that check over every recorded output of a finished run folder, beside the deep check
``dapo verify`` makes (every file hashed). Run it on two trees to compare code: the figures name
the commit (``+dirty``: uncommitted changes).

The run folder is a copy (modification times kept) of a finished run, ``runs/tiny-cpu`` by default
(the 75-step main job, its retention policy applied), and a variant with every checkpoint whole
(``keep all``: each pruned file written back with new bytes of its recorded size, its record
updated), as a run with the default retention holds. ``--s3`` also uploads the pruned copy to a
local S3 server (moto, tests/s3_server.py) and checks it there. Prints a table and writes
benchmarks/results/resume_cost.json.

    .venv/bin/python benchmarks/resume_cost.py [--run runs/tiny-cpu] [--s3]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from machine import cpu_model  # noqa: E402  (benchmarks/machine.py)
from result_file import write_result  # noqa: E402  (benchmarks/result_file.py)

from storage import digests, pruning, run_store  # noqa: E402
from workflows.verified_calls import damaged_outputs  # noqa: E402

_NOT_OUTPUTS = ("flyte", "logs")  # Flyte's cache DB and the run's log: no task output there


def _read_chars() -> int:
    """Bytes this process has read so far (read syscalls: files and page cache alike)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    return 0


def _outputs(root: str) -> list[str]:
    """Every recorded output of the run folder ``root`` (what a resume's cache hits point to)."""
    if run_store.is_remote(root):
        names = [u for u in run_store._find(root) if u.endswith(digests.RECORD_SUFFIX)]
    else:
        names = [str(p) for p in Path(root).rglob(f"*{digests.RECORD_SUFFIX}")]
    return sorted(n[: -len(digests.RECORD_SUFFIX)] for n in names)


class _Counting:
    """The run store's filesystem, counting the requests made through it and the bytes they read
    (``cat_file``: the digest records; a shallow check downloads no data file)."""

    def __init__(self, fs: Any) -> None:
        self.fs, self.requests, self.bytes_read = fs, 0, 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.fs, name)
        if not callable(attr):
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.requests += 1
            got = attr(*args, **kwargs)
            if name in ("cat_file", "cat"):
                self.bytes_read += len(got)
            return got
        return counted


def _measure(check: Callable[[list[str]], list[str]], outputs: list[str]) -> dict[str, Any]:
    hashed: list[int] = []
    actual = digests._actual_sha256

    def hashing(path: str) -> str:
        hashed.append(run_store.size(path))
        return actual(path)

    digests._actual_sha256 = hashing
    counting = None
    if outputs and run_store.is_remote(outputs[0]):
        counting = _Counting(run_store._fs(outputs[0]))
        original_fs = run_store._fs
        run_store._fs = lambda uri: counting
    try:
        chars, started = _read_chars(), time.perf_counter()
        problems = check(outputs)
        seconds, read = time.perf_counter() - started, _read_chars() - chars
        if counting is not None:
            read = counting.bytes_read + sum(hashed)  # socket reads are not in rchar: records + files hashed
    finally:
        digests._actual_sha256 = actual
        if counting is not None:
            run_store._fs = original_fs
    return {"seconds": round(seconds, 3), "bytes_read": read, "files_hashed": len(hashed), "bytes_hashed": sum(hashed),
            "store_requests": counting.requests if counting else None, "problems": len(problems)}


def _deep(outputs: list[str]) -> list[str]:
    """``dapo verify``'s check of the outputs: every file hashed (downloaded from a store)."""
    return [p for path in outputs for p in pruning.check(path, deep=True)]


def _copy_run(source: Path, dest: Path) -> Path:
    shutil.copytree(source, dest, copy_function=shutil.copy2, ignore=shutil.ignore_patterns(*_NOT_OUTPUTS))
    return dest


def _unprune(root: Path) -> int:
    """Write back every pruned file (new bytes of its recorded size) and record them: every
    checkpoint whole, as a run with the default retention (keep all) holds. Returns the bytes added."""
    added = 0
    for pruned in sorted(root.rglob(f"*{digests.PRUNED_SUFFIX}")):
        output = str(pruned)[: -len(digests.PRUNED_SUFFIX)]
        record = json.loads(Path(digests.record_path(output)).read_text())
        for key, entry in json.loads(pruned.read_text())["files"].items():
            target = Path(output).parent / key
            target.parent.mkdir(parents=True, exist_ok=True)
            block = hashlib.sha256(key.encode()).digest() * (1 << 15)  # 1 MiB, a pattern per file
            data = (block * (entry["bytes"] // len(block) + 1))[: entry["bytes"]]
            target.write_bytes(data)
            record["files"][key] = {"bytes": entry["bytes"], "sha256": hashlib.sha256(data).hexdigest()}
            added += entry["bytes"]
        pruned.unlink()
        time.sleep(0.01)  # the record written a clock tick after its files, as outputs.output does
        run_store.write_text(digests.record_path(output), json.dumps(record, indent=1, sort_keys=True) + "\n")
    return added


def _case(name: str, root: str) -> dict[str, Any]:
    outputs = _outputs(root)
    size = sum(run_store.size(f) for f in (run_store._find(root) if run_store.is_remote(root)
                                           else [str(p) for p in Path(root).rglob("*") if p.is_file()]))
    row = {"case": name, "outputs": len(outputs), "run_bytes": size,
           "resume_check": _measure(damaged_outputs, outputs), "deep_check": _measure(_deep, outputs)}
    print(f"{name:<28} {len(outputs):>7} {size / 1e6:>9.1f} "
          + "  ".join(f"{row[w]['seconds']:>7.2f} s {row[w]['bytes_read'] / 1e6:>8.1f} MB {row[w]['files_hashed']:>5} "
                      f"{row[w]['store_requests'] if row[w]['store_requests'] is not None else '-':>6}"
                      for w in ("resume_check", "deep_check")), flush=True)
    return row


def _s3_case(local: Path, tmp: Path) -> dict[str, Any]:
    from tests import s3_server

    server = s3_server.start()
    try:
        os.environ.update(server.env)
        os.environ[run_store.MIRROR_ENV] = str(tmp / "mirror")
        run_store._filesystem.cache_clear()
        uri = f"s3://{s3_server.BUCKET}/resume-cost/run"
        started = time.perf_counter()
        run_store.upload_folder(local, uri, marker=None)
        print(f"(uploaded {local} in {time.perf_counter() - started:.0f} s)", flush=True)
        return _case("object store (pruned)", uri)
    finally:
        server.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", default=str(REPO / "runs" / "tiny-cpu"), help="a finished run folder to copy")
    parser.add_argument("--s3", action="store_true", help="also check the copy in a local S3 server (moto)")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "resume_cost.json"))
    args = parser.parse_args()
    source = Path(args.run)
    if not (source / "run.json").is_file():
        print(f"{source}: not a run folder (no run.json); run `make run` first or pass --run", file=sys.stderr)
        return 2
    print(f"{'case':<28} {'outputs':>7} {'run MB':>9}  {'resume check: s, MB read, hashed, requests':<44} "
          "deep check (dapo verify)")
    rows = []
    with tempfile.TemporaryDirectory(prefix="resume-cost-") as tmp:
        pruned = _copy_run(source, Path(tmp) / "pruned" / source.name)
        rows.append(_case("local folder (pruned)", str(pruned)))
        whole = _copy_run(source, Path(tmp) / "whole" / source.name)
        added = _unprune(whole)
        print(f"(keep all: {added / 1e6:.1f} MB of pruned files written back)", flush=True)
        rows.append(_case("local folder (keep all)", str(whole)))
        if args.s3:
            rows.append(_s3_case(pruned, Path(tmp)))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True).stdout.strip())
    write_result(args.out, {"commit": commit + ("+dirty" if dirty else ""), "cpu": cpu_model(),
                            "load_avg_1m": os.getloadavg()[0], "run": str(source), "cases": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
