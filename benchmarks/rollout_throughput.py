"""Rollout throughput: vLLM vs transformers ``generate`` on the same model, prompts and samples.

Builds a random Qwen2 model with the tiny tokenizer (default ~38M parameters, bf16), then
generates ``--prompts`` x ``--samples`` responses of exactly ``--tokens`` tokens (EOS ignored, so
both engines do the same work) with each engine, and measures vLLM's engine start and in-place
weight-reload times. Prints a table and writes benchmarks/results/rollout_throughput.json.

transformers runs ``--repeats`` times first (in this process, before vLLM's CPU engine binds its
threads: run after it, transformers slows down by an order of magnitude); then vLLM runs in four
sampling modes, one of each per repeat, so that the modes see about the same load (the load
average is recorded per measurement):

* ``pipeline``: exactly what engines/rollout/stage.py asks for: one request per sample (``n=1``) with
  its own seed and ``logprobs=0`` (the sampled token's log-prob, in vLLM's flat lists), no
  detokenizing in the engine, and the texts decoded in one batch afterwards (inside the timing);
* ``detok``: the pipeline's earlier mode: the same requests with vLLM detokenizing (which also
  decodes every log-prob's token) and log-probs as per-position dicts;
* ``seeds``: the same requests without log-probs; ``logprobs``: without seeds;
* ``plain``: ``n=samples`` per prompt, no seed, no log-probs (a bare throughput test).

A mode's speedup is its median tokens/s over transformers' median; the table also gives each
one's range over the repeats. ``--hf-cache static`` gives transformers a preallocated KV cache
(``cache_implementation="static"``) instead of its default growing one, which copies itself at
every new token: the fairer baseline at long responses.

The run also times the model's matrix products alone at the same shape (``matmul_ceiling``), fused
as vLLM fuses them (q/k/v, gate/up) and the output projection included: over each distinct
prompt's tokens once, then over one row per sequence for each further token, each pass the
fastest of several tries, with torch's GEMM. No engine can generate faster than that, so
``ceiling / transformers`` is the largest speedup over transformers this machine allows at this
shape, and each engine's share of the ceiling says how much of its time goes to anything but
matrix products.

    .venv/bin/python benchmarks/rollout_throughput.py [--threads 2] [--dtype bfloat16] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from machine import cpu_model  # noqa: E402  (benchmarks/machine.py)
from scratch import scratch_dir  # noqa: E402  (benchmarks/scratch.py)
from result_file import write_result  # noqa: E402  (benchmarks/result_file.py)

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from engines.rollout import stage as rollout, vllm_engine
from engines.bootstrap import tiny_policy


MODES = ("pipeline", "detok", "seeds", "logprobs", "plain")


def _build(folder: Path, args: argparse.Namespace, seed: int) -> Path:
    tok = tiny_policy.build_tokenizer()
    model = tiny_policy.build_random_model(tok, seed=seed, num_layers=args.layers, hidden_size=args.hidden,
                                           num_heads=args.hidden // 64,
                                           max_positions=max(tiny_policy.DEFAULT_MAX_POSITIONS, 64 + args.tokens))
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
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hf-cache", default="dynamic", choices=["dynamic", "static"],
                        help="transformers' KV cache: its default growing one, or preallocated")
    parser.add_argument("--compiled", action="store_true",
                        help="vLLM with its torch.compile graph (enforce_eager=False) instead of eager mode")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES, help="vLLM sampling modes to time")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "rollout_throughput.json"))
    args = parser.parse_args()
    torch.set_flush_denormal(True)
    torch.set_num_threads(args.threads)
    with scratch_dir(None, "rollout-bench-") as work:  # the two policies' checkpoints
        return _compare(args, work)


def _compare(args: argparse.Namespace, work: Path) -> int:
    """Both engines on the same requests, ``args.repeats`` times; writes ``args.out``."""
    ckpt_a, ckpt_b = _build(work / "a", args, 0), _build(work / "b", args, 1)
    from transformers import AutoModelForCausalLM

    tok = tiny_policy.build_tokenizer()
    prompts = [tiny_policy.render_prompt(f"{i + 3}+{2 * i + 5}-{i + 1}") for i in range(args.prompts)]
    prompt_ids = [tok(p, add_special_tokens=False).input_ids for p in prompts]
    model = AutoModelForCausalLM.from_pretrained(ckpt_a, dtype=getattr(torch, args.dtype)).eval()
    params = sum(p.numel() for p in model.parameters())
    enc = tok(prompts * args.samples, return_tensors="pt", padding=True, add_special_tokens=False)

    cache = {"cache_implementation": "static"} if args.hf_cache == "static" else {}

    def timed_hf(model: Any) -> tuple[float, int]:
        with torch.no_grad():
            started = time.perf_counter()
            out = model.generate(**enc, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                                 max_new_tokens=args.tokens, min_new_tokens=args.tokens, pad_token_id=0,
                                 **cache)
            seconds = time.perf_counter() - started
        return seconds, (out.shape[1] - enc.input_ids.shape[1]) * out.shape[0]

    with torch.no_grad():
        model.generate(**{k: v[:2] for k, v in enc.items()}, do_sample=True, max_new_tokens=4, pad_token_id=0, **cache)  # warm-up
    hf_runs = []
    for repeat in range(args.repeats):
        load = [round(x, 2) for x in os.getloadavg()]
        hf_s, hf_tokens = timed_hf(model)
        hf_runs.append({"repeat": repeat, "load_average": load, "transformers_tokens_per_s": round(hf_tokens / hf_s, 1)})
        print(json.dumps(hf_runs[-1]), flush=True)
    ceiling = matmul_ceiling(fused_weights(model), prompt_tokens=sum(map(len, prompt_ids)),
                             sequences=len(prompts) * args.samples, new_tokens=args.tokens)
    print(json.dumps({"matmul_ceiling": ceiling}), flush=True)
    del model

    from vllm import SamplingParams

    max_model_len = max(len(p) for p in prompt_ids) + args.tokens  # the longest request fits, whatever --tokens is
    # KV cache for every sequence at once (keys and values, every layer), so that no request is preempted.
    kv_bytes = (args.prompts * args.samples * max_model_len * args.layers * 2 * args.hidden
                * torch.tensor([], dtype=getattr(torch, args.dtype)).element_size())
    settings = vllm_engine.EngineSettings(dtype=args.dtype, max_model_len=max_model_len, cpu_threads=args.threads,
                                          cpu_kvcache_gib=max(1, -(-kv_bytes // 2**30)),
                                          enforce_eager=not args.compiled)
    started = time.perf_counter()
    llm = vllm_engine.create_engine(ckpt_a, settings)
    start_s = time.perf_counter() - started

    def requests(mode: str) -> tuple[list[list[int]], list[SamplingParams]]:
        common = dict(temperature=1.0, max_tokens=args.tokens, ignore_eos=True)
        if mode == "plain":
            return prompt_ids, [SamplingParams(n=args.samples, **common) for _ in prompt_ids]
        # As engines/rollout/stage.py: one request per sample, each with its own seed (output independent
        # of batching and engine count) and/or the sampled token's log-prob.
        ids = [p for p in prompt_ids for _ in range(args.samples)]
        if mode == "pipeline":
            return ids, [rollout.request_params(1000 + i, common) for i in range(len(ids))]
        return ids, [SamplingParams(n=1, logprobs=0 if mode in ("detok", "logprobs") else None,
                                    seed=1000 + i if mode in ("detok", "seeds") else None, **common)
                     for i in range(len(ids))]

    def timed_vllm(mode: str) -> tuple[float, int]:
        ids, sp = requests(mode)
        llm.generate([{"prompt_token_ids": p} for p in ids[:2]], sp[:2], use_tqdm=False)  # warm-up
        started = time.perf_counter()
        outs = llm.generate([{"prompt_token_ids": p} for p in ids], sp, use_tqdm=False)
        if mode == "pipeline":  # the rollout decodes the texts itself (engines/rollout/stage.generate_part)
            rollout.response_texts(llm.get_tokenizer(), [list(o.outputs[0].token_ids) for o in outs])
        return time.perf_counter() - started, sum(len(c.token_ids) for o in outs for c in o.outputs)

    modes = tuple(args.modes)
    runs = []
    for repeat in range(args.repeats):
        run: dict = {"repeat": repeat, "load_average": [round(x, 2) for x in os.getloadavg()]}
        for mode in modes:
            seconds, tokens = timed_vllm(mode)
            run[f"vllm_{mode}_tokens_per_s"] = round(tokens / seconds, 1)
        runs.append(run)
        print(json.dumps(run), flush=True)
    reload_s = [vllm_engine.reload_weights(llm, ckpt) for ckpt in (ckpt_b, ckpt_a, ckpt_b)]

    def summary(key: str, rows: list[dict]) -> dict:
        values = [r[key] for r in rows]
        return {"median": statistics.median(values), "min": min(values), "max": max(values)}

    hf = summary("transformers_tokens_per_s", hf_runs)

    result = {
        "model_parameters": params, "dtype": args.dtype, "threads": args.threads,
        "prompts": args.prompts, "samples_per_prompt": args.samples, "tokens_per_sample": args.tokens,
        "transformers_cache": args.hf_cache,
        "vllm_compiled": args.compiled,
        "env": {k: os.environ.get(k) for k in ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_KVCACHE_SPACE", "OMP_NUM_THREADS")},
        "transformers_tokens_per_s": hf,
        **{f"vllm_{m}_tokens_per_s": summary(f"vllm_{m}_tokens_per_s", runs) for m in modes},
        **{f"speedup_{m}": {k: round(v / hf["median"], 2)
                            for k, v in summary(f"vllm_{m}_tokens_per_s", runs).items()} for m in modes},
        "transformers_runs": hf_runs,
        "vllm_runs": runs,
        "matmul_ceiling": ceiling,
        "matmul_ceiling_over_transformers": round(ceiling["tokens_per_s"] / hf["median"], 2),
        "share_of_matmul_ceiling": {
            "transformers": round(hf["median"] / ceiling["tokens_per_s"], 3),
            **{f"vllm_{m}": round(statistics.median(r[f"vllm_{m}_tokens_per_s"] for r in runs) / ceiling["tokens_per_s"], 3)
               for m in modes},
        },
        "vllm_engine_start_s": round(start_s, 2),
        "vllm_weight_reload_s": [round(s, 3) for s in reload_s],
        "load_average_before": hf_runs[0]["load_average"],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "cpu": cpu_model(),
        "python": platform.python_version(), "torch": torch.__version__,
    }
    print(f"{'':28}{'tok/s (median, range)':>30}{'speedup vs transformers':>28}")
    print(f"{'transformers (' + args.hf_cache + ' cache)':28}{_fmt(result['transformers_tokens_per_s']):>30}")
    for m in modes:
        print(f"{'vLLM ' + m:28}{_fmt(result[f'vllm_{m}_tokens_per_s']):>30}{_fmt(result[f'speedup_{m}'], 2):>28}")
    print(f"{'matrix products alone':28}{ceiling['tokens_per_s']:>30.1f}"
          f"{result['matmul_ceiling_over_transformers']:>28.2f}   (the ceiling; shares of it: "
          + ", ".join(f"{k} {v:.0%}" for k, v in result["share_of_matmul_ceiling"].items()) + ")")
    print(f"engine start {start_s:.2f} s, weight reload {result['vllm_weight_reload_s']} s, load (1 min) per "
          f"transformers repeat {[r['load_average'][0] for r in hf_runs]}, per vLLM repeat "
          f"{[r['load_average'][0] for r in runs]}")
    write_result(args.out, result)
    return 0


def fused_weights(model: Any) -> list[torch.Tensor]:
    """The weight matrices of a Qwen2 decoder step as an engine that fuses them multiplies them:
    q, k and v as one matrix and gate and up as one (they share their input), o, down, and the output
    projection. transformers multiplies them one by one, vLLM fused."""
    weights = []
    for layer in model.model.layers:
        attention, mlp = layer.self_attn, layer.mlp
        weights.append(torch.cat([attention.q_proj.weight, attention.k_proj.weight, attention.v_proj.weight]))
        weights.append(attention.o_proj.weight)
        weights.append(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))
        weights.append(mlp.down_proj.weight)
    weights.append(model.lm_head.weight)
    return [w.detach() for w in weights]


def matmul_ceiling(weights: list[torch.Tensor], *, prompt_tokens: int, sequences: int, new_tokens: int,
                   tries: int = 5) -> dict[str, float]:
    """The fastest a decoder could generate ``sequences`` x ``new_tokens`` tokens doing nothing but
    its matrix products with ``weights`` (each ``[out, in]``): one pass over ``prompt_tokens`` rows
    (the prefill, which samples each sequence's first token; a prompt shared by several samples
    counted once), then ``new_tokens - 1`` passes over ``sequences`` rows (decoding). Each pass is the
    fastest of ``tries``; attention, norms, sampling and scheduling cost nothing here.
    """
    def fastest_pass_s(rows: int) -> float:
        inputs = [torch.randn(rows, w.shape[1], dtype=w.dtype) for w in weights]
        best = math.inf
        with torch.no_grad():
            for _ in range(tries):
                started = time.perf_counter()
                for w, x in zip(weights, inputs):
                    torch.nn.functional.linear(x, w)
                best = min(best, time.perf_counter() - started)
        return best

    prefill_s, decode_step_s = fastest_pass_s(prompt_tokens), fastest_pass_s(sequences)
    seconds = prefill_s + (new_tokens - 1) * decode_step_s
    return {"matrices": len(weights), "prompt_tokens": prompt_tokens, "prefill_s": prefill_s,
            "decode_step_s": decode_step_s, "seconds": seconds, "tokens_per_s": round(sequences * new_tokens / seconds, 1)}


def _fmt(s: dict, digits: int = 1) -> str:
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"


if __name__ == "__main__":
    raise SystemExit(main())
