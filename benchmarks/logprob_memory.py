"""Peak memory of token log-probs + backward: all logits at once vs dapo_core.logprobs chunks.

Each variant runs in a fresh process (peak RSS from getrusage), on random hidden states with
Qwen2.5's vocabulary (152064) and a small hidden size, so the logits dominate as they do at the
paper's 21504-token samples. Prints a table; writes benchmarks/results/logprob_memory.json.

    .venv/bin/python benchmarks/logprob_memory.py [--tokens 4096] [--vocab 152064] [--chunk 1024]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from result_file import write_result  # (benchmarks/result_file.py)

REPO = Path(__file__).resolve().parents[1]

_CHILD = r"""
import json, resource, sys, time
import torch
sys.path.insert(0, sys.argv[1])
from dapo_core.logprobs import chunked_token_log_probs, token_log_probs_full
torch.set_flush_denormal(True)
tokens, vocab, hidden_size, chunk, variant = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
torch.manual_seed(0)  # the head's init too: both variants must see the same weights
g = torch.Generator().manual_seed(0)
head = torch.nn.Linear(hidden_size, vocab, bias=False)
hidden = torch.randn(1, tokens, hidden_size, generator=g, requires_grad=True)
ids = torch.randint(0, vocab, (1, tokens), generator=g)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
if variant == "full":
    lp = token_log_probs_full(head, hidden, ids)
else:
    lp, _ = chunked_token_log_probs(head, hidden, ids, chunk_tokens=chunk)
lp.sum().backward()
seconds = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"variant": variant, "peak_extra_mib": (peak - base) / 1024, "seconds": seconds,
                  "checksum": float(hidden.grad.abs().sum())}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--vocab", type=int, default=152064)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--chunk", type=int, default=1024)
    args = parser.parse_args()
    rows = []
    for variant in ("full", "chunked"):
        out = subprocess.run([sys.executable, "-c", _CHILD, str(REPO), str(args.tokens), str(args.vocab), str(args.hidden),
                              str(args.chunk), variant], capture_output=True, text=True, check=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
    logits_mib = args.tokens * args.vocab * 4 / 2**20
    print(f"{args.tokens} tokens x vocab {args.vocab} (float32 logits {logits_mib:.0f} MiB), chunk {args.chunk}")
    print(f"{'variant':<10}{'peak extra MiB':>16}{'seconds':>10}")
    for r in rows:
        print(f"{r['variant']:<10}{r['peak_extra_mib']:>16.0f}{r['seconds']:>10.2f}")
    same = abs(rows[0]["checksum"] - rows[1]["checksum"]) <= 1e-4 * abs(rows[0]["checksum"])
    print(f"gradients agree: {same}")
    result = {"config": vars(args), "logits_mib": logits_mib, "rows": rows, "gradients_agree": same,
              "measured_at": time.strftime("%Y-%m-%d %H:%M:%S")}
    out_path = REPO / "benchmarks" / "results" / "logprob_memory.json"
    write_result(out_path, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
