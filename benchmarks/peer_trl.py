"""The peer benchmark (issue 51): TRL's GRPOTrainer and this project on the same work, back to back.

For each seed, on the same machine one after the other: the main job (``dapo run --config
configs/tiny-cpu.yaml`` with ``run.steps``/``run.seed``/``train.seed`` set), then Hugging Face TRL's
``GRPOTrainer`` (``loss_type="dapo"``, beta 0, HF generate: benchmarks/peer_trl_train.py, run under
``.venv-peer``, made by scripts/setup-peer.sh) on exactly its work: the same step-0 policy and
curated train split (the main job's own ``checkpoints/step-0000`` and ``curate/problems``), prompt,
reward with soft overlong punishment, G, groups per step, lr, updates per step, clip range and
response cap, all read from the same config. Every checkpoint the main job evaluates (steps 0,
every ``run.eval_every_steps``, and the last) is scored for TRL too, with the project's own
evaluation (``dapo eval`` with the config's ``evaluate`` section: held-out avg@k).

Per run: avg@k at each checkpoint, the gain (last - step 0, points), seconds per step (the main
job's ``summary.json`` ``step_seconds``: evaluations excluded; TRL's from step end to step end,
checkpoint saving excluded), the gain per minute of step time, samples generated per sample trained
and the share of zero-signal groups (benchmarks/sample_use.py for the main job; TRL trains every
sample it generates, and logs ``frac_reward_zero_std``), and the 1-minute load average sampled
over the training. Writes a markdown table and JSON (``--out``, default
benchmarks/results/peer_trl.json and .md beside it).

    scripts/setup-peer.sh                                            # once: .venv-peer with trl 1.16.0
    .venv/bin/python benchmarks/peer_trl.py --seeds 0 1 2 --steps 75 # the full comparison (quiet machine)
    .venv/bin/python benchmarks/peer_trl.py --seeds 0 --steps 2 --out benchmarks/results/peer_trl-smoke.json

``--only trl|dapo`` runs one side (TRL alone still needs the main job's curation and step-0
policy: a 0-step main job gives them). A finished run under ``--keep`` is read, not run again.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from machine import cpu_model  # noqa: E402  (benchmarks/machine.py)
from main_job import LoadSampler, _commit, _dapo  # noqa: E402  (benchmarks/main_job.py)
from peer_trl_train import PeerWork  # noqa: E402  (benchmarks/peer_trl_train.py)
from result_file import write_result  # noqa: E402  (benchmarks/result_file.py)
from sample_use import run_sample_use  # noqa: E402  (benchmarks/sample_use.py)
from scratch import scratch_dir  # noqa: E402  (benchmarks/scratch.py)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from storage import run_store  # noqa: E402
from workflows.config import ConfigError, RunConfig, load_config  # noqa: E402
from workflows.driver import evaluates_after  # noqa: E402
from workflows.exit_codes import BAD_INPUT  # noqa: E402

PEER_PYTHON = REPO / ".venv-peer" / "bin" / "python"
SIDES = ("dapo", "trl")


@dataclass(frozen=True)
class PeerRow:
    """One run of the table: one side, one seed."""

    run: str  # "dapo" (this project) or "trl"
    seed: int
    steps: int
    avg_at_k: dict[int, float]  # held-out avg@k (fraction) by evaluated step, 0 first
    step_seconds: list[float]
    load: dict[str, float]  # 1-minute load average over the training: mean, min, max, samples
    over_generation: float  # samples generated per sample trained, over the run
    zero_signal_share: float  # groups with all-equal rewards over all groups generated
    sample_use: dict  # per step (the main job: benchmarks/sample_use.py; TRL: its logs)

    @property
    def gain_points(self) -> float:
        return 100 * (self.avg_at_k[max(self.avg_at_k)] - self.avg_at_k[0])

    @property
    def seconds_per_step(self) -> float:
        return statistics.fmean(self.step_seconds) if self.step_seconds else float("nan")

    @property
    def gain_per_minute(self) -> float:
        """Held-out points gained per minute of step time."""
        return self.gain_points / (sum(self.step_seconds) / 60) if self.step_seconds else float("nan")

    @property
    def first_checkpoint(self) -> int:
        """The first evaluated step after 0 (25 in the main job)."""
        return min(s for s in self.avg_at_k if s) if len(self.avg_at_k) > 1 else 0

    @property
    def first_gain_per_minute(self) -> float:
        """Points per minute of step time from step 0 to :attr:`first_checkpoint` (issue 51: the first 25 steps)."""
        first = self.first_checkpoint
        seconds = sum(self.step_seconds[:first])
        return 100 * (self.avg_at_k[first] - self.avg_at_k[0]) / (seconds / 60) if first and seconds else float("nan")

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "avg_at_k": {str(k): v for k, v in self.avg_at_k.items()},
                "gain_points": round(self.gain_points, 2), "seconds_per_step": round(self.seconds_per_step, 3),
                "gain_per_minute": round(self.gain_per_minute, 3), "first_checkpoint": self.first_checkpoint,
                "first_gain_per_minute": round(self.first_gain_per_minute, 3)}


def eval_steps(steps: int, every: int) -> list[int]:
    """The steps the main job evaluates: 0 (``prepare_run``), those the driver's rule names after a step
    (workflows/driver.py: evaluates_after, the one declaration of the schedule), and the last."""
    between = (s for s in range(1, steps + 1) if evaluates_after(s, every, steps))
    return sorted({0, *between, steps})


def peer_work(cfg: RunConfig, *, source_run: Path, out_dir: Path, steps: int, seed: int) -> PeerWork:
    """The main job's work for TRL, from its config and its run folder (step-0 policy, curated problems).
    A warm-up (``train.warmup_steps``) is refused before this by :func:`check_ready`."""
    return PeerWork(
        policy_dir=str(source_run / "checkpoints" / "step-0000"), problems_dir=str(source_run / "curate" / "problems"),
        out_dir=str(out_dir), steps=steps, save_steps=[s for s in eval_steps(steps, cfg.run.eval_every_steps) if s],
        seed=seed, prompts_per_step=cfg.run.prompts_per_step, samples_per_prompt=cfg.rollout.samples_per_prompt,
        updates_per_step=cfg.train.optimizer_updates_per_step, max_response_tokens=cfg.rollout.max_response_tokens,
        temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p, lr=cfg.train.lr, beta1=cfg.train.beta1,
        beta2=cfg.train.beta2, adam_eps=cfg.train.adam_eps, weight_decay=cfg.train.weight_decay,
        grad_clip_norm=cfg.train.grad_clip_norm, eps_low=cfg.train.eps_low, eps_high=cfg.train.eps_high,
        soft_overlong_punishment=cfg.score.soft_overlong_punishment,
        overlong_buffer_tokens=cfg.score.overlong_buffer_tokens,
        overlong_penalty_factor=cfg.score.overlong_penalty_factor, reward_timeout_s=cfg.score.reward_timeout_s,
    )


def _call(args: list[str], what: str, python_path: bool = True) -> str:
    """Run a command from the repository root; its stdout, or exit with its output's tail."""
    env = {**os.environ, "PYTHONPATH": str(REPO)} if python_path else None
    proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.exit(f"{what} failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return proc.stdout


def _finished(run_dir: Path) -> dict | None:
    path = run_dir / "summary.json"
    summary = json.loads(path.read_text()) if path.exists() else None
    return summary if summary and summary.get("status") == "finished" else None


def main_job(args: argparse.Namespace, root: Path, name: str, seed: int, steps: int) -> tuple[dict, dict]:
    """The main job's run ``root/name`` (run, or read when finished there) and its load over the run."""
    run_dir, load_path = root / name, root / f"{name}.load.json"
    summary = _finished(run_dir)
    if summary is None:
        print(f"{name}: dapo run, {steps} steps ...", flush=True)
        sets = [*args.set, f"run.steps={steps}", f"run.seed={seed}", f"train.seed={seed}", f"run.name={name}"]
        with LoadSampler() as sampler:
            _call([*_dapo(), "run", "--config", args.config, "--run-root", str(root),
                   *[x for item in sets for x in ("--set", item)]], f"dapo run ({name})")
        load_path.write_text(json.dumps(sampler.stats()) + "\n")
        summary = json.loads((run_dir / "summary.json").read_text())
    return summary, json.loads(load_path.read_text())


def dapo_row(args: argparse.Namespace, root: Path, seed: int) -> PeerRow:
    summary, load = main_job(args, root, f"dapo-seed-{seed}", seed, args.steps)
    use = run_sample_use(root / f"dapo-seed-{seed}", args.steps)
    return PeerRow(run="dapo", seed=seed, steps=args.steps, avg_at_k={e["step"]: e["avg_at_k"] for e in summary["evals"]},
                   step_seconds=summary["step_seconds"], load=load, over_generation=use.over_generation,
                   zero_signal_share=use.zero_signal_share, sample_use=use.as_dict())


def evaluate(args: argparse.Namespace, checkpoint: Path, problems_dir: Path, out: Path, step: int) -> float:
    """Held-out avg@k of a checkpoint by the project's own evaluation (``dapo eval``), cached in ``out``.json."""
    summary_path = out.with_suffix(".json")
    if not summary_path.exists():
        stdout = _call([*_dapo(), "eval", str(checkpoint), *sorted(str(p) for p in problems_dir.glob("test-*.parquet")),
                        "--out", str(out), "--config", args.config, "--step", str(step)], f"dapo eval ({checkpoint})")
        summary_path.write_text(stdout)
    return json.loads(summary_path.read_text())["avg_at_k"]


def trl_row(args: argparse.Namespace, cfg: RunConfig, root: Path, seed: int) -> PeerRow:
    """TRL on the main job's work (its run folder for the seed, else a 0-step one), then each checkpoint scored."""
    source = root / f"dapo-seed-{seed}"
    if _finished(source) is None:
        source = root / f"prep-seed-{seed}"
        main_job(args, root, source.name, seed, 0)  # curation, the step-0 policy, its evaluation
    out_dir = root / f"trl-seed-{seed}"
    result_path, load_path = out_dir / "trl_run.json", root / f"trl-seed-{seed}.load.json"
    work = peer_work(cfg, source_run=source, out_dir=out_dir, steps=args.steps, seed=seed)
    if not result_path.exists():
        print(f"trl-seed-{seed}: TRL GRPOTrainer, {args.steps} steps ...", flush=True)
        out_dir.mkdir(parents=True, exist_ok=True)
        work.write(out_dir / "work.json")
        with LoadSampler() as sampler:
            _call([str(PEER_PYTHON), str(REPO / "benchmarks" / "peer_trl_train.py"), str(out_dir / "work.json")],
                  f"TRL run (trl-seed-{seed})", python_path=False)
        load_path.write_text(json.dumps(sampler.stats()) + "\n")
    result = json.loads(result_path.read_text())
    scores = {}
    (out_dir / "eval").mkdir(exist_ok=True)
    for step in [0, *work.save_steps]:
        checkpoint = Path(work.policy_dir) if step == 0 else out_dir / "checkpoints" / f"step-{step:04d}"
        scores[step] = evaluate(args, checkpoint, Path(work.problems_dir), out_dir / "eval" / f"step-{step:04d}.parquet",
                                step)
    zero = [log["frac_reward_zero_std"] for log in result["logs"] if "frac_reward_zero_std" in log]
    return PeerRow(run="trl", seed=seed, steps=args.steps, avg_at_k=scores, step_seconds=result["step_seconds"],
                   load=json.loads(load_path.read_text()), over_generation=1.0,  # TRL trains every sample it draws
                   zero_signal_share=statistics.fmean(zero) if zero else float("nan"),
                   sample_use={"versions": result["versions"], "torch_threads": result["torch_threads"],
                               "per_step": [{k: v for k, v in log.items() if k in TRL_LOG_KEYS} for log in result["logs"]
                                            if "frac_reward_zero_std" in log]})


TRL_LOG_KEYS = ("step", "frac_reward_zero_std", "reward", "completions/mean_length", "completions/clipped_ratio",
                "entropy", "loss", "step_time")


def markdown(rows: list[PeerRow], header: str) -> str:
    """The table of issue 51: one line per run, avg@k in percent."""
    steps = sorted({s for r in rows for s in r.avg_at_k})
    lines = [header, "",
             f"| run | seed | avg@k at steps {'/'.join(map(str, steps))} | gain | s/step | gain per minute | "
             f"gain per minute to step {rows[0].first_checkpoint if rows else '-'} | generated per trained | "
             "zero-signal share | load mean (min-max) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        accs = "/".join(f"{100 * r.avg_at_k[s]:.1f}" if s in r.avg_at_k else "-" for s in steps)
        lines.append(f"| {'this project' if r.run == 'dapo' else 'TRL'} | {r.seed} | {accs} | {r.gain_points:+.1f} | "
                     f"{r.seconds_per_step:.2f} | {r.gain_per_minute:.2f} | {r.first_gain_per_minute:.2f} | {r.over_generation:.2f} | "
                     f"{100 * r.zero_signal_share:.1f}% | {r.load['mean']:.1f} ({r.load['min']:.1f}-{r.load['max']:.1f}) |")
    return "\n".join(lines) + "\n"


def check_ready(args: argparse.Namespace) -> RunConfig:
    """The config with its overrides, and TRL's virtualenv; exit 2 with one line before any work."""
    try:
        cfg = load_config(args.config, args.set)
    except (ConfigError, OSError) as err:
        print(f"peer_trl: {err}", file=sys.stderr)
        raise SystemExit(BAD_INPUT) from None
    if args.steps < 1:
        print(f"peer_trl: --steps {args.steps}: must be >= 1", file=sys.stderr)
        raise SystemExit(BAD_INPUT)
    if args.only != "dapo" and cfg.train.warmup_steps:
        print(f"peer_trl: train.warmup_steps={cfg.train.warmup_steps}: the TRL side maps a constant LR only",
              file=sys.stderr)
        raise SystemExit(BAD_INPUT)
    if args.only != "dapo" and not PEER_PYTHON.exists():
        print(f"peer_trl: {PEER_PYTHON} is missing; run scripts/setup-peer.sh first (TRL beside .venv)", file=sys.stderr)
        raise SystemExit(BAD_INPUT)
    return cfg


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(REPO / "configs" / "tiny-cpu.yaml"))
    parser.add_argument("--set", action="append", default=[], help="a config override for both sides (k=v)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=75)
    parser.add_argument("--only", choices=SIDES, help="run one side only")
    parser.add_argument("--keep", help="keep the run folders under this directory (finished runs there are read)")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "peer_trl.json"),
                        help="JSON output; the markdown table goes beside it (.md)")
    args = parser.parse_args()
    cfg = check_ready(args)
    rows: list[PeerRow] = []
    with scratch_dir(args.keep, "dapo-peer-trl-") as root:
        for seed in args.seeds:
            if args.only != "trl":
                rows.append(dapo_row(args, root, seed))
            if args.only != "dapo":
                rows.append(trl_row(args, cfg, root, seed))
    header = (f"commit {_commit()}, cpu {cpu_model()} ({os.cpu_count()} cores); config {args.config} "
              f"{' '.join(args.set)}; {args.steps} steps; held-out avg@{cfg.evaluate.samples_per_problem} in percent; "
              "gain per minute = points per minute of step time")
    table = markdown(rows, header)
    print(table)
    out = Path(args.out)
    write_result(out, {"commit": _commit(), "cpu": cpu_model(), "cores": os.cpu_count(), "config": args.config,
                       "overrides": args.set, "steps": args.steps, "seeds": args.seeds,
                       "rows": [r.as_dict() for r in rows]})
    run_store.write_text(out.with_suffix(".md"), table)  # whole or not at all, as the JSON
    print(f"wrote {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
