"""Benchmark the run store: the tiny pipeline with its run folder on local disk vs in S3.

Runs `dapo run --config configs/tiny-cpu.yaml --set run.steps=N` twice from scratch, once with
`--run-root` a local folder and once with an `s3://` URI on a local S3 server (moto, in a child
process; tests/s3_server.py), and prints wall time, mean step time, and what the S3 run put in
the store (objects and bytes, per kind). A local S3 server has no network latency and little
bandwidth limit, so the difference measures the run store's own work (uploads, fetches into the
mirror, listing), not a real bucket's. Writes benchmarks/results/run_store.json.

    .venv/bin/python benchmarks/run_store.py [--steps 2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests import s3_server  # noqa: E402
from result_file import write_result  # noqa: E402  (benchmarks/result_file.py)


def _run(run_root: str, steps: int, env: dict[str, str]) -> float:
    args = [str(REPO / ".venv" / "bin" / "dapo"), "run", "--config", "configs/tiny-cpu.yaml", "--run-root", run_root,
            "--set", f"run.steps={steps}", "--set", "run.name=bench"]
    started = time.perf_counter()
    proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(f"dapo run failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return seconds


def _summary(root: str, env: dict[str, str]) -> dict:
    code = ("import json,sys; from storage import run_store; "
            "print(run_store.read_text(run_store.join(sys.argv[1], 'bench', 'summary.json')))")
    out = subprocess.run([sys.executable, "-c", code, root], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def _store_contents(root: str, env: dict[str, str]) -> dict[str, dict[str, int]]:
    code = ("import json,sys; from storage import run_store; fs = run_store._fs(sys.argv[1]); "
            "print(json.dumps({k: fs.info(k)['size'] for k in fs.find(sys.argv[1])}))")
    out = subprocess.run([sys.executable, "-c", code, root], cwd=REPO, env=env, capture_output=True, text=True, check=True)
    kinds: dict[str, dict[str, int]] = {}
    for key, size in json.loads(out.stdout).items():
        rel = key.split("/bench/", 1)[1]
        kind = ("checkpoints/ds_state" if "/ds_state/" in rel else rel.split("/", 1)[0])
        entry = kinds.setdefault(kind, {"objects": 0, "bytes": 0})
        entry["objects"] += 1
        entry["bytes"] += int(size)
    return kinds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2, help="local/S3 pairs, alternating (the first run pays warm-ups)")
    args = parser.parse_args()
    if not s3_server.available():
        sys.exit("moto is not installed (requirements-test.txt)")
    base_env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    results: dict = {"steps": args.steps, "python": platform.python_version(), "load_before": os.getloadavg()[0],
                     "runs": []}
    server = s3_server.start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for repeat in range(args.repeats):
                local_root = str(Path(tmp) / f"runs-{repeat}")
                seconds = _run(local_root, args.steps, base_env)
                summary = json.loads((Path(local_root) / "bench" / "summary.json").read_text())
                results["runs"].append({"root": "local", "wall_s": round(seconds, 1), "step_s": summary["step_seconds"],
                                        "accuracy_after": summary["accuracy_after"]})
                env = {**base_env, **server.env, "DAPO_MIRROR_DIR": str(Path(tmp) / f"mirror-{repeat}")}
                s3_root = f"s3://dapo-test/runs-{repeat}"
                seconds = _run(s3_root, args.steps, env)
                summary = _summary(s3_root, env)
                results["runs"].append({"root": "s3", "wall_s": round(seconds, 1), "step_s": summary["step_seconds"],
                                        "accuracy_after": summary["accuracy_after"]})
                results["store"] = _store_contents(f"{s3_root}/bench", env)
    finally:
        server.stop()
    results["load_after"] = os.getloadavg()[0]
    print(f"tiny pipeline, {args.steps} steps (load {results['load_before']:.2f} -> {results['load_after']:.2f})")
    print("| run root | wall s | step s (each) | held-out avg@k after |")
    print("|---|---:|---|---:|")
    for r in results["runs"]:
        print(f"| {r['root']} | {r['wall_s']} | {', '.join(f'{s:.1f}' for s in r['step_s'])} | {r['accuracy_after']:.3f} |")
    print("\n| in the store (one run) | objects | MB |")
    print("|---|---:|---:|")
    for kind, entry in sorted(results["store"].items()):
        print(f"| {kind} | {entry['objects']} | {entry['bytes'] / 1e6:.2f} |")
    out = REPO / "benchmarks" / "results" / "run_store.json"
    print()
    write_result(out, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
