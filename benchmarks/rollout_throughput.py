"""Rollout throughput: vLLM vs transformers ``generate`` on the same model, prompts and samples.

Builds a random Qwen2 model with the tiny tokenizer (default ~38M parameters, bf16), then
generates ``--prompts`` x ``--samples`` responses of exactly ``--tokens`` tokens (EOS ignored, so
both engines do the same work) with each engine, and measures vLLM's engine start and in-place
weight-reload times. Prints a table and writes benchmarks/results/rollout_throughput.json.

    .venv/bin/python benchmarks/rollout_throughput.py [--threads 2] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from engines import tiny_policy, vllm_engine


def _build(folder: Path, args: argparse.Namespace, seed: int) -> Path:
    tok = tiny_policy.build_tokenizer()
    model = tiny_policy.build_random_model(tok, seed=seed, num_layers=args.layers, hidden_size=args.hidden,
                                           num_heads=args.hidden // 64)
    model = model.to(getattr(torch, args.dtype))
    model.config.dtype = args.dtype
    return tiny_policy.save_checkpoint(model, tok, folder, step=0, produced_by="bootstrap",
                                       parent_checkpoint_id=None, inputs={"kind": "benchmark", "seed": seed})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "rollout_throughput.json"))
    args = parser.parse_args()
    torch.set_flush_denormal(True)
    torch.set_num_threads(args.threads)
    load = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="rollout-bench-"))
    ckpt_a, ckpt_b = _build(work / "a", args, 0), _build(work / "b", args, 1)
    from transformers import AutoModelForCausalLM

    tok = tiny_policy.build_tokenizer()
    prompts = [tiny_policy.render_prompt(f"{i + 3}+{2 * i + 5}-{i + 1}") for i in range(args.prompts)]
    prompt_ids = [tok(p, add_special_tokens=False).input_ids for p in prompts]
    model = AutoModelForCausalLM.from_pretrained(ckpt_a, dtype=getattr(torch, args.dtype)).eval()
    params = sum(p.numel() for p in model.parameters())
    enc = tok(prompts * args.samples, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad():
        model.generate(**{k: v[:2] for k, v in enc.items()}, do_sample=True, max_new_tokens=4, pad_token_id=0)  # warm-up
        started = time.perf_counter()
        out = model.generate(**enc, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                             max_new_tokens=args.tokens, min_new_tokens=args.tokens, pad_token_id=0)
        hf_s = time.perf_counter() - started
    hf_tokens = (out.shape[1] - enc.input_ids.shape[1]) * out.shape[0]
    del model

    from vllm import SamplingParams

    settings = vllm_engine.EngineSettings(dtype=args.dtype, max_model_len=256, cpu_threads=args.threads)
    started = time.perf_counter()
    llm = vllm_engine.create_engine(ckpt_a, settings)
    start_s = time.perf_counter() - started
    def timed_vllm(seeded: bool) -> tuple[float, int]:
        # As the pipeline samples: a seed per request (output independent of batching) and the
        # sampled token's log-prob; "plain" drops both, as a bare throughput test would.
        sp = [SamplingParams(n=args.samples, temperature=1.0, max_tokens=args.tokens, ignore_eos=True,
                             logprobs=0 if seeded else None, seed=i if seeded else None)
              for i in range(args.prompts)]
        llm.generate([{"prompt_token_ids": p} for p in prompt_ids[:2]], sp[:2], use_tqdm=False)  # warm-up
        started = time.perf_counter()
        outs = llm.generate([{"prompt_token_ids": p} for p in prompt_ids], sp, use_tqdm=False)
        return time.perf_counter() - started, sum(len(c.token_ids) for o in outs for c in o.outputs)

    vllm_s, vllm_tokens = timed_vllm(seeded=True)
    plain_s, plain_tokens = timed_vllm(seeded=False)
    reload_s = [vllm_engine.reload_weights(llm, ckpt) for ckpt in (ckpt_b, ckpt_a, ckpt_b)]

    result = {
        "model_parameters": params, "dtype": args.dtype, "threads": args.threads,
        "prompts": args.prompts, "samples_per_prompt": args.samples, "tokens_per_sample": args.tokens,
        "transformers_tokens_per_s": round(hf_tokens / hf_s, 1),
        "vllm_tokens_per_s": round(vllm_tokens / vllm_s, 1),
        "speedup": round((vllm_tokens / vllm_s) / (hf_tokens / hf_s), 2),
        "vllm_plain_tokens_per_s": round(plain_tokens / plain_s, 1),
        "speedup_plain": round((plain_tokens / plain_s) / (hf_tokens / hf_s), 2),
        "vllm_engine_start_s": round(start_s, 2),
        "vllm_weight_reload_s": [round(s, 3) for s in reload_s],
        "load_average_before": [round(x, 2) for x in load],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(), "torch": torch.__version__,
    }
    print(f"{'metric':<28}{'value':>14}")
    for key in ("model_parameters", "transformers_tokens_per_s", "vllm_tokens_per_s", "speedup",
                "vllm_plain_tokens_per_s", "speedup_plain",
                "vllm_engine_start_s", "vllm_weight_reload_s", "load_average_before"):
        print(f"{key:<28}{str(result[key]):>14}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
