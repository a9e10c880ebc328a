"""``dapo ask``: sample a checkpoint's answers to one problem and judge them with the run's reward.

The problem is rendered with the prompt template the policy was trained on (the run's
``curate.prompt_template`` when the checkpoint lies in a run folder, else ``--template``) and
sampled with the evaluation's settings (the run's ``evaluate`` section, else ``EvalConfig``'s:
temperature 1.0, top_p 0.7), each overridable. With ``--gold`` every answer gets the rule reward's
verdict (``dapo_core.rewards.score_responses``, the reward training and evaluation use). A problem
with characters the checkpoint's tokenizer cannot represent (the tiny policy knows digits, signs
and a few words, not "What is ...?") is refused in one line naming them, exit 2, before sampling.

It runs vLLM offline in this process (``engines.rollout.stage.generate_rollouts``, the evaluation's
own path) rather than calling a ``dapo serve``: one command, no server to start or find, and the
same tokenisation, seeds and engine as ``dapo eval``, so a seed gives the samples evaluation drew
for the same problem. Against a running server, use its OpenAI API (docs/SERVING.md).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from typing import Any

from dapo_core.answers import problem_id, render_prompt
from dapo_core.rewards import Verdict, score_responses
from engines.rollout.stage import RolloutError, generate_rollouts, tokenize_prompts
from settings.evaluate import EvalConfig
from settings.rollout import RolloutConfig
from storage.checkpoints import CheckpointError
from workflows.exit_codes import BAD_INPUT
from workflows.policy_source import PolicySource, resolve_policy

TINY_TEMPLATE = "{problem}=\n"  # configs/tiny-cpu.yaml's curate.prompt_template


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``dapo ask``."""
    parser.add_argument("checkpoint", help="checkpoint folder (path or URI), or a run folder (its final checkpoint)")
    parser.add_argument("problem", help="the problem text, e.g. '37+5-18'")
    parser.add_argument("--gold", help="the gold answer: each sample gets the reward's verdict against it")
    parser.add_argument("--samples", type=int, default=1, help="answers to sample (default: %(default)s)")
    parser.add_argument("--template", default=None,
                        help=f"prompt template with {{problem}} (default: the run's curate.prompt_template, else "
                             f"{TINY_TEMPLATE!r})")
    parser.add_argument("--temperature", type=float, default=None, help="default: the run's evaluate.temperature (1.0)")
    parser.add_argument("--top-p", type=float, default=None, help="default: the run's evaluate.top_p (0.7)")
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="response cap (default: the run's evaluate.max_response_tokens)")
    parser.add_argument("--seed", type=int, default=None, help="sampling seed (default: the run's evaluate.seed)")


def _template(policy: PolicySource, given: str | None) -> str:
    if given is not None:
        return given
    return policy.run_config.curate.prompt_template if policy.run_config else TINY_TEMPLATE


def _given_or(given: Any, default: Any) -> Any:
    return default if given is None else given


def sampling_config(policy: PolicySource, args: argparse.Namespace) -> tuple[RolloutConfig, int]:
    """The engine (the run's rollout section) with the evaluation's sampling; and the seed."""
    run = policy.run_config
    evaluation = run.evaluate if run else EvalConfig()
    config = replace(
        run.rollout if run else RolloutConfig(),
        samples_per_prompt=args.samples,
        temperature=_given_or(args.temperature, evaluation.temperature),
        top_p=_given_or(args.top_p, evaluation.top_p),
        max_response_tokens=_given_or(args.max_tokens, evaluation.max_response_tokens),
    )
    return config, _given_or(args.seed, evaluation.seed)


def verdict_line(verdict: Verdict, gold: str) -> str:
    """``correct (answer 24, gold 24, reward +1)`` / ``wrong (no answer, gold 24, reward -1)``."""
    answer = "no answer" if verdict.extracted_answer is None else f"answer {verdict.extracted_answer}"
    outcome = "correct" if verdict.correct else ("wrong" if verdict.status == "ok" else verdict.status)
    return f"{outcome} ({answer}, gold {gold}, reward {verdict.reward:+g})"


def _print_samples(rows: list[dict[str, Any]], verdicts: list[Verdict] | None, gold: str | None) -> None:
    for i, row in enumerate(rows):
        judged = verdict_line(verdicts[i], gold) if verdicts and gold is not None else "not judged (no --gold)"
        print(f"sample {i + 1}/{len(rows)}: {judged}; {row['response_length']} tokens, {row['finish_reason']}")
        print(f"  {row['response_text']!r}")


def run_cli(args: argparse.Namespace) -> int:
    """``dapo ask``: print each sampled answer, its verdict, and the count of correct ones."""
    try:
        policy = resolve_policy(args.checkpoint)
        prompt = render_prompt(_template(policy, args.template), args.problem)
        # Text the tokenizer would drop or read as unknown is refused (PromptTextError, naming the
        # characters) before anything is printed or an engine starts; not answered without them.
        tokenize_prompts(policy.local_dir, [prompt], problem_ids=[problem_id(args.problem)])
        config, seed = sampling_config(policy, args)
        print(f"checkpoint {policy.checkpoint_id} (step {policy.step}); prompt {prompt!r}; temperature "
              f"{config.temperature}, top_p {config.top_p}, max {config.max_response_tokens} tokens, seed {seed}")
        rows, _ = generate_rollouts(policy.source, [{"problem_id": problem_id(args.problem), "prompt": prompt}], config,
                                    seed=seed, policy_version=policy.step, generation_round=0)
    except (CheckpointError, RolloutError, FileNotFoundError, ValueError) as err:
        print(f"dapo ask: error: {err}", file=sys.stderr)
        return BAD_INPUT
    verdicts = score_responses([r["response_text"] for r in rows], [args.gold] * len(rows)) if args.gold else None
    _print_samples(rows, verdicts, args.gold)
    if verdicts:
        print(f"{sum(v.correct for v in verdicts)}/{len(verdicts)} correct against gold {args.gold}")
    return 0
