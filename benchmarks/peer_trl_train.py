"""The peer side of benchmarks/peer_trl.py: Hugging Face TRL's GRPOTrainer on the main job's work.

Runs under ``.venv-peer/bin/python`` (scripts/setup-peer.sh: TRL beside the project's pinned stack,
which it sees read-only), never under ``.venv``: TRL is a benchmark-only dependency. peer_trl.py
writes a :class:`PeerWork` JSON file from the run config and calls

    .venv-peer/bin/python benchmarks/peer_trl_train.py WORK.json

What maps onto what (the main job's config -> TRL 1.16's GRPOConfig):

- a rollout step of ``prompts_per_step`` groups of G samples -> one generation batch of
  ``prompts_per_step * G`` samples (``steps_per_generation`` = updates per step), trained in
  ``updates_per_step`` mini-batches, one optimizer update each: TRL step ``u`` is update ``u`` and
  rollout step ``u // updates_per_step``;
- DAPO's loss (token-level mean, clip-higher eps_low/eps_high, no KL: ``loss_type="dapo"``,
  ``beta=0``), HF ``generate`` at the rollout's temperature/top_p, ``max_response_tokens``;
- AdamW with the train section's lr, betas, eps, weight decay and gradient clip; a constant LR
  (the main job's ``warmup_steps`` is 0; a warm-up here is refused rather than mapped loosely);
- the reward: the project's own rule reward (dapo_core/rewards.py, +1/-1) plus the soft overlong
  punishment of eq. 13 (dapo_core/overlong.py) on the response's token count, EOS included, as the
  score stage counts it. No dynamic sampling: TRL trains on every group, zero-signal ones too.

Every ``save_steps`` rollout step the policy is published as a project checkpoint
(engines/bootstrap/tiny_policy.py: save_checkpoint) so ``dapo eval`` scores it like the pipeline's
own. Writes ``out_dir/trl_run.json``: seconds per rollout step (checkpoint saving excluded), TRL's
logged metrics per step (``frac_reward_zero_std``: the zero-signal share), the versions.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


@dataclass(frozen=True)
class PeerWork:
    """The main job's work as TRL runs it: one flat record, written by peer_trl.py from the run config."""

    policy_dir: str  # the step-0 policy (the main job's checkpoints/step-0000)
    problems_dir: str  # the main job's curate/problems (train-*.parquet is trained on)
    out_dir: str  # checkpoints/step-NNNN and trl_run.json go here
    steps: int  # rollout steps
    save_steps: list[int]  # rollout steps whose policy is published for evaluation (0 excluded)
    seed: int
    prompts_per_step: int  # groups per step
    samples_per_prompt: int  # G
    updates_per_step: int  # mini-batches (optimizer updates) per step
    max_response_tokens: int
    temperature: float
    top_p: float
    lr: float
    beta1: float
    beta2: float
    adam_eps: float
    weight_decay: float
    grad_clip_norm: float
    eps_low: float
    eps_high: float
    soft_overlong_punishment: bool
    overlong_buffer_tokens: int
    overlong_penalty_factor: float
    reward_timeout_s: float

    @classmethod
    def read(cls, path: str | Path) -> PeerWork:
        return cls(**json.loads(Path(path).read_text()))

    def write(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(dataclasses.asdict(self), indent=2) + "\n")


def rewards(work: PeerWork, completions: list[str], completion_ids: list[list[int]], answers: list[Any]) -> list[float]:
    """The score stage's reward of each completion: rule reward (eq. 7) + soft overlong penalty (eq. 13)."""
    import torch

    from dapo_core.overlong import soft_overlong_penalty
    from dapo_core.rewards import score_responses

    verdicts = score_responses(completions, list(answers), timeout_s=work.reward_timeout_s)
    rule = torch.tensor([v.reward for v in verdicts], dtype=torch.float32)
    if not work.soft_overlong_punishment:
        return rule.tolist()
    lengths = torch.tensor([len(ids) for ids in completion_ids], dtype=torch.long)
    penalty = soft_overlong_penalty(lengths, work.max_response_tokens, work.overlong_buffer_tokens,
                                    work.overlong_penalty_factor)
    return (rule + penalty).tolist()


def _train_rows(problems_dir: str) -> list[dict[str, Any]]:
    """The train split as TRL's dataset rows: the rendered prompt and the gold answer."""
    import schemas

    files = sorted(str(p) for p in Path(problems_dir).glob("train-*.parquet"))
    if not files:
        raise SystemExit(f"{problems_dir}: no train-*.parquet (a curated problems folder is expected)")
    rows = schemas.read_shards(files, schemas.Problem).select(["prompt", "answer"]).to_pylist()
    return [{"prompt": r["prompt"], "answer": r["answer"]} for r in rows]


def grpo_config(work: PeerWork, trl: Any) -> Any:
    """TRL's GRPOConfig for the work (see the module docstring for the mapping)."""
    return trl.GRPOConfig(
        output_dir=str(Path(work.out_dir) / "trainer"),
        max_steps=work.steps * work.updates_per_step,
        per_device_train_batch_size=work.prompts_per_step * work.samples_per_prompt // work.updates_per_step,
        gradient_accumulation_steps=1,
        steps_per_generation=work.updates_per_step,
        num_iterations=1,
        num_generations=work.samples_per_prompt,
        max_completion_length=work.max_response_tokens,
        temperature=work.temperature,
        top_p=work.top_p,
        top_k=0,
        loss_type="dapo",
        beta=0.0,
        epsilon=work.eps_low,
        epsilon_high=work.eps_high,
        scale_rewards="group",
        mask_truncated_completions=False,
        learning_rate=work.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        adam_beta1=work.beta1,
        adam_beta2=work.beta2,
        adam_epsilon=work.adam_eps,
        weight_decay=work.weight_decay,
        max_grad_norm=work.grad_clip_norm,
        seed=work.seed,
        use_cpu=True,
        bf16=False,
        fp16=False,
        use_vllm=False,
        save_strategy="no",
        logging_steps=work.updates_per_step,
        report_to="none",
        disable_tqdm=True,
        remove_unused_columns=False,
        dataloader_num_workers=0,
        log_completions=False,
    )


class StepClock:
    """A TrainerCallback (duck-typed: the trainer calls the hooks it finds) that times each rollout
    step, publishes the policy at ``work.save_steps`` (not timed) and keeps TRL's logs."""

    def __init__(self, work: PeerWork) -> None:
        self.work = work
        self.trainer: Any = None  # set once the trainer exists
        self.step_seconds: list[float] = []
        self.logs: list[dict[str, float]] = []
        self._started = 0.0

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._started = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step % self.work.updates_per_step:
            return
        step = state.global_step // self.work.updates_per_step
        self.step_seconds.append(time.perf_counter() - self._started)
        if step in self.work.save_steps:
            self._publish(step)
        self._started = time.perf_counter()

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        if logs:
            step = state.global_step // self.work.updates_per_step
            self.logs.append({"step": step, **{k: float(v) for k, v in logs.items() if isinstance(v, (int, float))}})

    def _publish(self, step: int) -> None:
        from engines.bootstrap.tiny_policy import save_checkpoint

        save_checkpoint(self.trainer.model, self.trainer.processing_class, Path(self.work.out_dir) / "checkpoints" /
                        f"step-{step:04d}", step=step, produced_by="trl", parent_checkpoint_id=None,
                        inputs={"peer": "trl GRPOTrainer", "seed": self.work.seed, "step": step})

    def __getattr__(self, name: str) -> Any:
        # Every other TrainerCallback hook: nothing to do.
        if name.startswith("on_"):
            return lambda *args, **kwargs: None
        raise AttributeError(name)


def run(work: PeerWork) -> dict[str, Any]:
    """Train with TRL; returns what trl_run.json holds."""
    import datasets
    import torch
    import transformers
    import trl

    torch.set_flush_denormal(True)  # DEVELOPERS.md: tiny models stall on denormals without it
    tokenizer = transformers.AutoTokenizer.from_pretrained(work.policy_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(work.policy_dir, dtype=torch.float32)

    def dapo_reward(prompts: list[str], completions: list[str], completion_ids: list[list[int]], answer: list[Any],
                    **kwargs: Any) -> list[float]:
        return rewards(work, completions, completion_ids, answer)

    clock = StepClock(work)
    trainer = trl.GRPOTrainer(model=model, reward_funcs=dapo_reward, args=grpo_config(work, trl),
                              train_dataset=datasets.Dataset.from_list(_train_rows(work.problems_dir)),
                              processing_class=tokenizer, callbacks=[clock])
    clock.trainer = trainer
    trainer.train()
    return {
        "versions": {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__,
                     "datasets": datasets.__version__},
        "torch_threads": torch.get_num_threads(),
        "step_seconds": [round(s, 3) for s in clock.step_seconds],
        "logs": clock.logs,
    }


def main() -> int:
    if len(sys.argv) != 2:
        sys.exit("usage: .venv-peer/bin/python benchmarks/peer_trl_train.py WORK.json")
    work = PeerWork.read(sys.argv[1])
    result = run(work)
    out = Path(work.out_dir) / "trl_run.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
