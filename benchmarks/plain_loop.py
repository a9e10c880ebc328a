"""A plain in-process DAPO loop: the reference the pipeline's per-step learning is compared with.

No Flyte, no DeepSpeed, no shards: vLLM rollouts (engines/rollout/stage.py, the pipeline's sampling
code), the pipeline's reward (dapo_core/rewards.py r2 + the eq. 13 soft overlong penalty), group
advantages (eq. 9), dynamic sampling (first ``--groups`` informative groups of ``--prompts``
drawn, sec. 3.2), and the eq. 10 loss (dapo_core/losses.py, token-mean over each mini-batch),
with torch AdamW in this process. It starts from a published step-0 checkpoint (e.g. a run
folder's ``checkpoints/step-0000``) and the run's curated problems, so the pipeline and this loop
can be compared from the SAME policy, switching one difference at a time:

- ``--carry``: keep the surplus informative groups of a step for the next one (the pipeline's
  dynamic-sampling carry; stale by one step, trained without behaviour correction here);
- ``--weight-decay``, ``--betas``, ``--grad-clip``: the optimizer (the pipeline's DeepSpeed AdamW
  takes the run config's values);
- ``--updates``: mini-batch updates per step.

Held-out avg@k is measured exactly as the pipeline's evaluation stage does (temperature 1.0,
top_p 0.7, the same per-request seeds), so the step-0 numbers agree with a run's.

    python benchmarks/plain_loop.py --checkpoint RUN/checkpoints/step-0000 --problems RUN/curate/problems \
        --steps 20 --eval-every 5 --out /tmp/plain.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

import schemas  # noqa: E402
from dapo_core.advantages import group_advantages  # noqa: E402
from dapo_core.losses import policy_loss  # noqa: E402
from dapo_core.overlong import soft_overlong_penalty  # noqa: E402
from dapo_core.rewards import score_responses  # noqa: E402
from engines.train import batch as tb  # noqa: E402
from engines.rollout.stage import generate_rollouts  # noqa: E402
from engines.train.engine import forward_log_probs  # noqa: E402
from settings.rollout import RolloutConfig  # noqa: E402
from result_file import write_result  # noqa: E402  (benchmarks/result_file.py)


def _problems(folder: Path, split: str) -> list[dict]:
    files = sorted(folder.glob(f"{split}-*.parquet"))
    return schemas.read_shards([str(f) for f in files], schemas.Problem).to_pylist()


def _publish(model, tokenizer, out_dir: Path, step: int) -> Path:
    from engines.bootstrap.tiny_policy import save_checkpoint

    return save_checkpoint(model, tokenizer, out_dir, step=step, produced_by="plain", parent_checkpoint_id=None,
                           inputs={"plain_loop": step})


def evaluate(checkpoint: Path, test: list[dict], *, k: int, max_tokens: int) -> float:
    """Held-out avg@k with the evaluation stage's sampling (temperature 1.0, top_p 0.7, seed 0)."""
    cfg = RolloutConfig(samples_per_prompt=k, temperature=1.0, top_p=0.7, max_response_tokens=max_tokens)
    rows, _ = generate_rollouts(str(checkpoint), [{"problem_id": p["problem_id"], "prompt": p["prompt"]} for p in test],
                                cfg, seed=0, policy_version=0, generation_round=0)
    gold = {p["problem_id"]: int(p["answer"]) for p in test}
    verdicts = score_responses([r["response_text"] for r in rows], [gold[r["problem_id"]] for r in rows])
    return sum(v.correct for v in verdicts) / len(verdicts)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--problems", required=True, help="a run's curate/problems folder (train-*.parquet, test-*.parquet)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--prompts", type=int, default=48, help="prompts drawn per step")
    p.add_argument("--groups", type=int, default=32, help="informative groups trained per step (at most)")
    p.add_argument("--samples", type=int, default=8, help="G")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--updates", type=int, default=2)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--betas", type=float, nargs=2, default=(0.9, 0.999))
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--overlong-buffer", type=int, default=8)
    p.add_argument("--carry", action="store_true", help="carry surplus informative groups into the next step")
    p.add_argument("--fill", action="store_true", help="draw another round while fewer than --groups are informative")
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--eval-k", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--out")
    args = p.parse_args()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_flush_denormal(True)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    work = Path(tempfile.mkdtemp(prefix="plain-loop-"))
    model = AutoModelForCausalLM.from_pretrained(args.checkpoint, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(args.checkpoint)
    pad = int(model.config.pad_token_id or 0)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=tuple(args.betas), weight_decay=args.weight_decay)
    train, test = _problems(Path(args.problems), "train"), _problems(Path(args.problems), "test")
    gold = {q["problem_id"]: int(q["answer"]) for q in train}
    rng = random.Random(args.seed)
    order: list[dict] = []
    current = Path(args.checkpoint)
    history: list[dict] = []
    carried: list[list[dict]] = []
    started = time.perf_counter()
    acc0 = evaluate(current, test, k=args.eval_k, max_tokens=args.max_tokens)
    history.append({"step": 0, "avg_at_k": acc0})
    print(f"step 0 avg@{args.eval_k} {acc0:.3f}", flush=True)
    roll_cfg = RolloutConfig(samples_per_prompt=args.samples, temperature=1.0, top_p=1.0,
                             max_response_tokens=args.max_tokens)
    for step in range(1, args.steps + 1):
        groups: list[list[dict]] = list(carried)
        carried = []
        informative_fresh = 0
        rounds = 0
        while len(groups) < args.groups and (rounds == 0 or args.fill) and rounds < 3:
            rounds += 1
            drawn = []
            while len(drawn) < args.prompts:
                if not order:
                    order = list(train)
                    rng.shuffle(order)
                drawn.append(order.pop())
            rows, _ = generate_rollouts(str(current), [{"problem_id": q["problem_id"], "prompt": q["prompt"]} for q in drawn],
                                        roll_cfg, seed=args.seed * 1000 + step, policy_version=step - 1,
                                        generation_round=rounds)
            verdicts = score_responses([r["response_text"] for r in rows], [gold[r["problem_id"]] for r in rows])
            lengths = torch.tensor([r["response_length"] for r in rows])
            reward = torch.tensor([1.0 if v.correct else -1.0 for v in verdicts])
            reward = reward + soft_overlong_penalty(lengths, args.max_tokens, args.overlong_buffer)
            by_pid: dict[str, list[int]] = {}
            for i, r in enumerate(rows):
                by_pid.setdefault(r["problem_id"], []).append(i)
            adv = group_advantages(reward, [r["problem_id"] for r in rows])
            for idx in by_pid.values():
                n_ok = sum(verdicts[i].correct for i in idx)
                if 0 < n_ok < len(idx):
                    informative_fresh += 1
                    groups.append([{**rows[i], "advantage": float(adv[i])} for i in idx])
        if args.carry:
            carried = groups[args.groups:]
        groups = groups[: args.groups]
        samples = [s for g in groups for s in g]
        batch = tb.collate([tb.SampleRow(rollout_id=f"{s['rollout_id']}", prompt_token_ids=tuple(s["prompt_token_ids"]),
                                         response_token_ids=tuple(s["response_token_ids"]),
                                         rollout_log_probs=tuple(s["rollout_log_probs"]), advantage=s["advantage"],
                                         loss_masked=False, origin="plain", policy_version=s["policy_version"])
                            for s in samples], pad_token_id=pad)
        model.eval()
        with torch.no_grad():
            old, _ = forward_log_probs(model, batch, device=torch.device("cpu"), chunk_tokens=0, head_calls=None)
        model.train()
        grad_norms = []
        for mini in tb.mini_batches(batch.num_samples, args.updates, seed=args.seed + step):
            mb = tb.select(batch, mini)
            lp, _ = forward_log_probs(model, mb, device=torch.device("cpu"), chunk_tokens=0, head_calls=None)
            old_mb = old[torch.as_tensor(mini)][:, : lp.shape[1]]
            loss, _ = policy_loss(lp.float(), old_mb, mb.advantages, mb.loss_mask, eps_low=0.2, eps_high=0.28)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            gn = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip if args.grad_clip > 0 else 1e9)
            grad_norms.append(float(gn))
            opt.step()
        model.eval()
        nxt = work / f"step-{step:04d}"
        current = _publish(model, tokenizer, nxt, step)
        row = {"step": step, "groups": len(groups), "informative_fresh": informative_fresh, "rounds": rounds,
               "carried_next": len(carried), "grad_norm": sum(grad_norms) / len(grad_norms),
               "seconds": round(time.perf_counter() - started, 1)}
        if args.eval_every and (step % args.eval_every == 0 or step == args.steps):
            row["avg_at_k"] = evaluate(current, test, k=args.eval_k, max_tokens=args.max_tokens)
        history.append(row)
        print(json.dumps(row), flush=True)
        prev = work / f"step-{step - 1:04d}"
        if prev.exists():
            shutil.rmtree(prev, ignore_errors=True)
    result = {"args": vars(args), "load": os.getloadavg(), "history": history,
              "seconds": round(time.perf_counter() - started, 1)}
    if args.out:
        write_result(args.out, result)
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
