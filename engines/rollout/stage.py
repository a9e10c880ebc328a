"""Rollout stage: G sampled responses per prompt with vLLM, written as Rollout shards.

Given a published checkpoint, Problem shards (and which problem ids to generate for) and the
sampling settings, every prompt gets G samples (the group of the group-relative advantage, paper
eq. 9). Each row records the token ids, the text, the per-token log-probs the engine saw, the
length, the finish reason (``length`` = truncated by the response cap: what overlong filtering and
soft punishment act on, sec. 3.4), the checkpoint, the policy version, the round of dynamic
sampling (sec. 3.2) and the request's seed.

Determinism: every request carries its own seed derived from (rollout seed, problem id, round,
sample index), and rows are sorted by (problem_id, sample_index), so the output does not depend on
how prompts are spread over engines or batched. Several engines (one per GPU, Ray actors) run when
more than one GPU is visible; otherwise one in-process engine, kept alive between calls and given
new weights by reload (engines/rollout/vllm_engine.py). With a long-lived Ray cluster named
(settings/rollout.py: EngineHosting) every part runs on named, detached engine actors that outlive the
task process and keep their weights between tasks (engines/rollout/ray_engines.py).

Log-probs are the engine's raw log-probs (``vllm_engine.LOGPROBS_MODE``): log-softmax of the
logits before temperature and top-p, i.e. the policy at temperature 1, which is what the trainer
recomputes. A manifest beside each shard (``<shard>.manifest.json``) records the mode, settings,
engine count and timings.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
import unicodedata
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from engines.rollout import host_weights, ray_engines, vllm_engine
from engines.runtime import ray_actors
from settings.rollout import EngineHosting, RolloutConfig
from storage import checkpoints, pruning, run_store

_RAY_ACTORS: list[_RayEngine] = []  # this process's engine actors, reused across rounds
_log = logging.getLogger(__name__)


class RolloutError(RuntimeError):
    """Bad rollout input (missing problem, prompt too long, bad checkpoint); names what and where."""


class EngineOutputError(RuntimeError):
    """The engine returned what a rollout cannot record (no log-prob per sampled token, an unknown
    finish reason): an engine fault, not bad input, so the commands report it as a failure (exit 1)."""


class PromptTooLongError(RolloutError):
    """A prompt of the pool does not fit the model's context with the response cap (a config/input error)."""


class PromptTextError(RolloutError):
    """A problem's text holds characters the policy's tokenizer cannot represent (it would drop them or
    read them as unknown): refused by problem id (reason code ``REASON_UNREPRESENTABLE``), never
    generated from with characters missing (a config/input error)."""


REASON_UNREPRESENTABLE = "unrepresentable_text"  # the reason code PromptTextError's message carries
# Stands for the user message when the chat template is rendered once to find its own text around it.
_CONTENT_MARK = "\x00dapo-user-message\x00"


def derive_request_seed(seed: int, problem_id: str, generation_round: int, sample_index: int) -> int:
    """The seed of one sample: a hash of what identifies it, 63 bits (fits int64 and vLLM).

    Independent of batch composition and engine count, so any split of the prompts over engines
    samples the same responses.
    """
    key = f"{seed}|{problem_id}|{generation_round}|{sample_index}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "big") >> 1


def make_rollout_id(problem_id: str, generation_round: int, sample_index: int, checkpoint_id: str, seed: int) -> str:
    """``"<problem_id>-r<round>-s<index>-<8 hex>"``: readable, and unique across checkpoints and seeds."""
    tail = hashlib.sha256(f"{checkpoint_id}|{seed}".encode()).hexdigest()[:8]
    return f"{problem_id}-r{generation_round}-s{sample_index}-{tail}"


def engine_settings(config: RolloutConfig, max_model_len: int) -> vllm_engine.EngineSettings:
    """The engine part of a RolloutConfig (what decides whether a cached engine can be reused)."""
    return vllm_engine.EngineSettings(
        dtype=config.dtype,
        max_model_len=max_model_len,
        cpu_threads=config.cpu_threads,
        cpu_kvcache_gib=config.cpu_kvcache_gib,
        gpu_memory_utilization=config.gpu_memory_utilization,
        enforce_eager=config.enforce_eager,
        tensor_parallel_size=config.tensor_parallel_size,
        sleep_between_calls=config.sleep_between_rounds,
    )


def load_problems(problem_paths: list[str], problem_ids: list[str] | None) -> list[dict[str, str]]:
    """``[{"problem_id", "prompt"}]`` for ``problem_ids`` (all rows when None), in that order."""
    import schemas

    table = schemas.read_shards(problem_paths, schemas.Problem).select(["problem_id", "prompt"])
    by_id: dict[str, str] = {}
    for pid, prompt in zip(table.column("problem_id").to_pylist(), table.column("prompt").to_pylist()):
        by_id.setdefault(pid, prompt)
    if problem_ids is None:
        problem_ids = list(by_id)
    missing = [pid for pid in problem_ids if pid not in by_id]
    if missing:
        raise RolloutError(f"problem id(s) {missing[:5]} not found in Problem shards {problem_paths}")
    duplicated = sorted({pid for pid in problem_ids if problem_ids.count(pid) > 1})
    if duplicated:
        raise RolloutError(f"problem id(s) {duplicated[:5]} requested more than once (rollout ids would collide)")
    return [{"problem_id": pid, "prompt": by_id[pid]} for pid in problem_ids]


def tokenize_prompts(checkpoint_dir: str | Path, prompts: list[str], *,
                     problem_ids: list[str] | None = None) -> list[list[int]]:
    """Prompt token ids, through the tokenizer's chat template when it has one.

    The tiny tokenizer's template renders the user message verbatim; a chat model's wraps it in
    its own turn markers (what the model was tuned on). The prompt's text is encoded with special
    tokens read as text, so a problem holding ``<|im_end|>`` or ``<eos>`` cannot close its turn or
    open another; only the template's own text around it yields the markers. A prompt with a
    character the tokenizer cannot represent raises PromptTextError naming its problem
    (``problem_ids[i]``, else its index). All prompts are rendered and encoded in one batch, with
    the checkpoint's tokenizer kept while its files stay the same (every step's checkpoint copies
    its parent's).
    """
    if not prompts:
        return []
    names = list(problem_ids) if problem_ids is not None else [f"#{i}" for i in range(len(prompts))]
    with _TOKENIZER_LOCK:  # one caller at a time: pipelined runs tokenize from two task threads
        tokenizer = _tokenizer(Path(checkpoint_dir))
        if not tokenizer.chat_template:
            _refuse_unrepresentable(tokenizer, prompts, _text_ids(tokenizer, prompts), names)
            return tokenizer(prompts, split_special_tokens=True).input_ids  # with the tokenizer's own BOS/EOS
        head, tail = _template_around_message(tokenizer, checkpoint_dir)
        messages = [_message_text(text, head, tail, name, checkpoint_dir)
                    for text, name in zip(_render(tokenizer, prompts), names)]
        message_ids = _text_ids(tokenizer, messages)
        _refuse_unrepresentable(tokenizer, messages, message_ids, names)
        head_ids, tail_ids = tokenizer([head, tail], add_special_tokens=False).input_ids  # the markers, parsed
        return [head_ids + ids + tail_ids for ids in message_ids]


def _render(tokenizer: Any, prompts: list[str]) -> list[str]:
    """Each prompt as the chat template renders it: one user message and the generation prompt."""
    return tokenizer.apply_chat_template([[{"role": "user", "content": prompt}] for prompt in prompts],
                                         add_generation_prompt=True, tokenize=False)


def _template_around_message(tokenizer: Any, checkpoint_dir: str | Path) -> tuple[str, str]:
    """The template's text before and after the user message (the same for every message)."""
    marked = _render(tokenizer, [_CONTENT_MARK])[0]
    if marked.count(_CONTENT_MARK) != 1:
        raise RolloutError(f"{checkpoint_dir}: the chat template renders the user message {marked.count(_CONTENT_MARK)} "
                           "times, not once: its text cannot be kept apart from the template's markers")
    head, tail = marked.split(_CONTENT_MARK)
    return head, tail


def _message_text(rendered: str, head: str, tail: str, name: str, checkpoint_dir: str | Path) -> str:
    """The user message's part of one rendered prompt (as the template wrote it, e.g. trimmed)."""
    if len(rendered) < len(head) + len(tail) or not (rendered.startswith(head) and rendered.endswith(tail)):
        raise RolloutError(f"problem {name}: the chat template of {checkpoint_dir} renders the text around this "
                           "problem's message differently from other messages; its text cannot be kept apart "
                           "from the template's markers")
    return rendered[len(head):len(rendered) - len(tail)]


def _text_ids(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    """Token ids of plain text: a special token's string in it is text, never that token."""
    return tokenizer(texts, add_special_tokens=False, split_special_tokens=True).input_ids


def _refuse_unrepresentable(tokenizer: Any, texts: list[str], ids: list[list[int]], names: list[str]) -> None:
    """Raise PromptTextError when a text's ids do not give the text back: the tokenizer dropped a
    character or read it as unknown (a special id). Compared under NFKC: a tokenizer may normalise."""
    special = set(tokenizer.all_special_ids) | {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    decoded = tokenizer.batch_decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    bad = [(name, text, back) for name, text, back, seq in zip(names, texts, decoded, ids)
           if special.intersection(seq) or unicodedata.normalize("NFKC", back) != unicodedata.normalize("NFKC", text)]
    if bad:
        name, text, back = bad[0]
        lost = "".join(sorted(set(text) - set(back))) or text
        raise PromptTextError(
            f"{len(bad):,} of {len(texts):,} prompts hold text the policy's tokenizer cannot represent "
            f"({REASON_UNREPRESENTABLE}): problem {name}: {lost[:20]!r} would be dropped or read as unknown; "
            "curate without such problems or use a policy whose tokenizer covers them"
        )


_TOKENIZERS: dict[str, Any] = {}  # architecture digest (config + tokenizer files) -> loaded tokenizer
_TOKENIZER_LOCK = threading.Lock()


def _tokenizer(checkpoint_dir: Path) -> Any:
    """The checkpoint's tokenizer, loaded once per distinct set of tokenizer files in this process."""
    from transformers import AutoTokenizer

    key = vllm_engine.architecture_digest(checkpoint_dir)
    if key not in _TOKENIZERS:
        if len(_TOKENIZERS) >= 4:  # a process rarely sees more than one; do not keep every one it saw
            _TOKENIZERS.clear()
        _TOKENIZERS[key] = AutoTokenizer.from_pretrained(str(checkpoint_dir))
    return _TOKENIZERS[key]


def model_max_positions(checkpoint_dir: str | Path) -> int:
    """The context the checkpoint's model was built for (its config.json; a path or a URI)."""
    config = json.loads(run_store.read_text(run_store.join(str(checkpoint_dir), "config.json")))
    return int(config.get("max_position_embeddings") or 2048)


def check_prompt_lengths(checkpoint_dir: str | Path, problems: list[dict[str, Any]], *, max_response_tokens: int,
                         max_model_len: int, field: str) -> None:
    """Refuse a pool with any prompt too long for the model's context at ``max_response_tokens``.

    Run by the driver once the step-0 policy exists (its tokenizer decides the lengths), before
    any rollout: otherwise a long prompt kills the run only when a step draws it, maybe hours in.
    The error names the longest prompt's problem, how many prompts overflow and the fields; a
    prompt whose text the tokenizer cannot represent is refused here too (PromptTextError).
    """
    limit = max_model_len or model_max_positions(checkpoint_dir)
    prompts, ids = [p["prompt"] for p in problems], [p["problem_id"] for p in problems]
    lengths = [len(token_ids) for token_ids in tokenize_prompts(checkpoint_dir, prompts, problem_ids=ids)]
    over = [(n, p["problem_id"]) for n, p in zip(lengths, problems) if n + max_response_tokens > limit]
    if over:
        n, worst = max(over)
        raise PromptTooLongError(
            f"{len(over):,} of {len(problems):,} prompts do not fit the context: problem {worst} has {n} prompt "
            f"tokens + {field}={max_response_tokens} > max_model_len={limit}; lower {field}, raise "
            "rollout.max_model_len (if the model allows), or curate with a smaller curate.max_problem_chars"
        )


def _request_list(
    problems: list[dict[str, Any]], config: RolloutConfig, seed: int, generation_round: int
) -> list[dict[str, Any]]:
    """One request per (problem, sample index), each with its own seed."""
    requests = []
    for problem in problems:
        for index in range(config.samples_per_prompt):
            requests.append(
                {
                    "problem_id": problem["problem_id"],
                    "sample_index": index,
                    "prompt_token_ids": problem["prompt_token_ids"],
                    "seed": derive_request_seed(seed, problem["problem_id"], generation_round, index),
                }
            )
    return requests


@dataclass(frozen=True)
class GeneratedPart:
    """One engine's results and the seconds it spent in vLLM's ``generate`` alone (not in starting
    the engine or reloading its weights, which the round's ``seconds`` include)."""

    results: list[dict[str, Any]]  # one per request, in request order
    generate_seconds: float
    engine: str = ""  # how the engine got the weights: vllm_engine.get_engine's "started", "reloaded", ...


def generate_part(
    checkpoint_dir: str,
    settings: vllm_engine.EngineSettings,
    sampling: dict[str, Any],
    requests: list[dict[str, Any]],
    label: str = "",
) -> GeneratedPart:
    """Generate ``requests`` on this process's engine for ``checkpoint_dir``; one result dict each.

    Runs the same way in-process and inside a Ray actor (one GPU each). Results carry the response
    token ids, text, the sampled tokens' log-probs and vLLM's finish reason.
    """
    params = [request_params(r["seed"], sampling) for r in requests]
    # One caller at a time (pipelined: a rollout and an evaluation may come from two threads); a CUDA
    # engine that shares its GPU with training sleeps when the call ends (vllm_engine.engine_for_call).
    with vllm_engine.engine_for_call(checkpoint_dir, settings) as (llm, how):
        started = time.perf_counter()
        outputs = vllm_engine.generate(llm, [r["prompt_token_ids"] for r in requests], params, progress_label=label)
        generate_seconds = time.perf_counter() - started
        tokenizer = llm.get_tokenizer()
    completions = [output.outputs[0] for output in outputs]
    token_ids = [list(completion.token_ids) for completion in completions]
    texts = response_texts(tokenizer, token_ids)
    results = []
    for request, completion, ids, text in zip(requests, completions, token_ids, texts):
        results.append(
            {
                **request,
                "response_token_ids": ids,
                "response_text": text,
                "rollout_log_probs": sampled_log_probs(completion.logprobs, ids, problem=request["problem_id"]),
                "finish_reason": completion.finish_reason,
            }
        )
    return GeneratedPart(results, generate_seconds, how)


def request_params(seed: int, sampling: dict[str, Any]) -> Any:
    """One request's vLLM ``SamplingParams`` as a round asks for them (``sampling``: temperature,
    top_p, max_tokens, ...).

    The sampled token's log-prob only (``logprobs=0``), kept in vLLM's flat lists; no detokenizing
    in the engine, which would also decode the token of every log-prob: the texts are decoded once
    per round (``response_texts``). Together 15-20% of a tiny-policy round's time
    (benchmarks/RESULTS.md).
    """
    from vllm import SamplingParams

    return SamplingParams(n=1, logprobs=0, flat_logprobs=True, detokenize=False, seed=seed, **sampling)


def response_texts(tokenizer: Any, token_ids: list[list[int]]) -> list[str]:
    """The responses' texts, one batch decode: what the engine's detokenizer would have given
    (tests/integration/test_rollout.py checks it)."""
    return tokenizer.batch_decode(token_ids, skip_special_tokens=True)


def sampled_log_probs(logprobs: Any, token_ids: list[int], *, problem: str) -> list[float]:
    """The log-prob of each sampled token, from a completion's flat log-prob record (``L`` floats).

    With ``logprobs=0`` vLLM records one entry per position, the sampled token's; anything else
    (no record, another layout, other tokens) is an error naming the problem.
    """
    from vllm.logprobs import FlatLogprobs

    one_per_position = (isinstance(logprobs, FlatLogprobs) and logprobs.token_ids == token_ids
                        and logprobs.end_indices == list(range(1, len(token_ids) + 1)))
    if not one_per_position:
        raise EngineOutputError(f"problem {problem}: engine returned no log-prob per sampled token")
    return list(logprobs.logprobs)


@dataclass(frozen=True)
class EnginePlace:
    """Where an engine actor runs: its Ray node and its process (named when it dies)."""

    node_id: str
    pid: int


class EngineLostError(RuntimeError):
    """A part's engine actor died (process killed, node lost) and so did the fresh one that ran it
    again: an infrastructure fault (exit 1), named by engine, process and node."""


class _EngineActor:
    """A Ray actor holding one engine on one GPU; its engine survives across calls (reload)."""

    def where(self) -> EnginePlace:
        import ray

        return EnginePlace(ray.get_runtime_context().get_node_id(), os.getpid())

    def generate(self, checkpoint_dir: str, settings: Any, sampling: dict[str, Any], requests: list[dict[str, Any]],
                 label: str, namespace: str = "") -> GeneratedPart:
        # The actor may sit on another node than the task body: it fetches the checkpoint itself
        # (once per checkpoint and node, without its optimizer state; a path on a shared
        # filesystem is used in place), or a long-lived one (``namespace``) takes the weights from
        # the train host's memory (engines/rollout/host_weights.py).
        folder, weights = host_weights.policy_for_engine(checkpoint_dir, settings, namespace)
        loaded = host_weights.load(folder, settings, weights)
        del weights  # the tensors are in the engine now: not held beside it while it generates
        part = generate_part(str(folder), settings, sampling, requests, label)
        return replace(part, engine=loaded or part.engine)


@dataclass(frozen=True)
class _RayEngine:
    """One engine actor (this process's, kept in ``_RAY_ACTORS``; or a long-lived one of ``namespace``,
    found by ``name``) and where it runs."""

    actor: Any
    place: EnginePlace
    name: str = ""  # the actor's name in ``namespace`` (long-lived engines only)
    namespace: str = ""

    def named(self, index: int) -> str:
        return f"engine {index} (pid {self.place.pid} on Ray node {self.place.node_id})"


def _ray_engines(count: int, gpus_per_engine: int) -> list[_RayEngine]:
    """``count`` engine actors: the live ones kept from earlier rounds, then new ones (a GPU set each)."""
    import ray

    actor_class = ray.remote(num_gpus=gpus_per_engine)(_EngineActor)
    new = [actor_class.remote() for _ in range(count - len(_RAY_ACTORS))]
    for actor, place in zip(new, ray.get([actor.where.remote() for actor in new])):
        _RAY_ACTORS.append(_RayEngine(actor, place))
    return _RAY_ACTORS[:count]


def _named_engines(count: int, gpus_per_engine: int, namespace: str) -> list[_RayEngine]:
    """The long-lived engines 0..count-1 of ``namespace``, each found by name or started. A name whose
    actor is dead but not yet unregistered (killed just before this call) is freed and looked up again."""
    import ray

    for _attempt in range(2):
        found = ray_engines.named_actors(_EngineActor, count, gpus_per_engine, namespace)
        asked = [(name, actor, actor.where.remote()) for name, actor in found]
        engines, dead = [], []
        for name, actor, place in asked:
            try:
                engines.append(_RayEngine(actor, ray.get(place), name, namespace))
            except ray.exceptions.RayActorError:
                dead.append(name)
                ray_actors.forget(name, namespace)
        if not dead:
            return engines
        _log.warning("long-lived engine actor(s) %s of Ray namespace %s were dead; started again", dead, namespace)
    raise EngineLostError(f"long-lived engine actors {dead} of Ray namespace {namespace} died as they started; "
                          "check the Ray cluster's nodes (memory, preemption)")


def _drop_engine(engine: _RayEngine) -> None:
    """Forget a dead engine actor: out of this process's engines, killed (an unreachable one must not
    keep holding its GPU), and a long-lived one's name freed for the fresh actor that replaces it."""
    import ray

    if engine in _RAY_ACTORS:
        _RAY_ACTORS.remove(engine)
    ray.kill(engine.actor)
    if engine.name:
        ray_actors.forget(engine.name, engine.namespace)


def _ray_generate(
    checkpoint_dir: str, settings: vllm_engine.EngineSettings, sampling: dict[str, Any], parts: list[list[dict[str, Any]]],
    hosting: EngineHosting = EngineHosting(),
) -> list[GeneratedPart]:
    """Run each part on its own GPU engine: Ray actors, started once per process and reused, or with
    ``hosting.persistent`` long-lived named actors that outlive the process (engines/rollout/ray_engines.py;
    on a cluster without GPUs, a CPU workstation's `ray start`, they hold none).

    An actor that died (kill -9, a lost node; before or during this round) is dropped from the
    process's engines and its part runs once more on a fresh actor: each request carries its own
    seed, so the re-run samples exactly what the dead engine would have. A part whose second actor
    dies too raises EngineLostError naming the engines and nodes; a round never comes back short.
    """
    import ray

    if not ray.is_initialized():
        ray.init(include_dashboard=False, ignore_reinit_error=True)
    # An actor holds its GPU alone (Ray schedules num_gpus exclusively): no trainer to make room for.
    settings = replace(settings, sleep_between_calls=False)
    done: dict[int, GeneratedPart] = {}
    lost: list[str] = []
    for _attempt in range(2):
        if hosting.persistent:
            per_engine = settings.tensor_parallel_size if vllm_engine.gpu_count() else 0
            engines = _named_engines(len(parts), per_engine, hosting.ray_namespace)
        else:
            engines = _ray_engines(len(parts), settings.tensor_parallel_size)
        futures = {
            i: engines[i].actor.generate.remote(checkpoint_dir, settings, sampling, parts[i], f"engine {i}",
                                                hosting.ray_namespace if hosting.persistent else "")
            for i in range(len(parts)) if i not in done
        }
        for i, future in futures.items():
            try:
                done[i] = ray.get(future)
            except ray.exceptions.RayActorError as err:
                lost.append(engines[i].named(i))
                _drop_engine(engines[i])
                _log.warning("%s died (%s); its %d requests run again on a fresh engine",
                             engines[i].named(i), type(err).__name__, len(parts[i]))
        if len(done) == len(parts):
            return [done[i] for i in range(len(parts))]
    raise EngineLostError(f"Ray engine actors died twice for the same part of this round: {', '.join(lost)}; "
                          "check the nodes (memory, preemption) and run the round again")


def split_parts(requests: list[dict[str, Any]], parts: int) -> list[list[dict[str, Any]]]:
    """Split requests into ``parts`` contiguous slices of whole prompts (groups stay together)."""
    by_problem: dict[str, list[dict[str, Any]]] = {}
    for request in requests:
        by_problem.setdefault(request["problem_id"], []).append(request)
    groups = list(by_problem.values())
    parts = max(1, min(parts, len(groups)))
    bounds = [round(i * len(groups) / parts) for i in range(parts + 1)]
    return [[r for g in groups[bounds[i] : bounds[i + 1]] for r in g] for i in range(parts)]


def _check_prompts_fit(
    problems: list[dict[str, str]], token_ids: list[list[int]], *, max_response_tokens: int, max_model_len: int
) -> None:
    """Refuse a problem whose prompt plus the response cap does not fit the context."""
    for problem, ids in zip(problems, token_ids):
        if len(ids) + max_response_tokens > max_model_len:
            raise RolloutError(
                f"problem {problem['problem_id']}: prompt of {len(ids)} tokens + max_response_tokens "
                f"{max_response_tokens} exceeds the context limit max_model_len={max_model_len}"
            )


def _attach_to_ray_cluster(hosting: EngineHosting) -> None:
    """Join the Ray cluster named by ``RAY_ADDRESS`` (a cluster's Ray head sets it for its driver), or the
    long-lived one of ``hosting``, before the GPUs are counted, so its GPUs, not this machine's, decide
    the engines (vllm_engine.gpu_count). Without either nothing happens: a laptop run counts its own GPUs
    and starts no Ray."""
    if hosting.persistent:
        ray_actors.attach(hosting)
        return
    if not os.environ.get("RAY_ADDRESS"):
        return
    import ray

    if not ray.is_initialized():
        ray.init(include_dashboard=False, ignore_reinit_error=True)  # ray.init reads RAY_ADDRESS


def _engine_count(engines: int | None, config: RolloutConfig, gpus: int) -> int:
    """Engines wanted: the override, else the config, else one per ``tensor_parallel_size`` GPUs."""
    wanted = engines if engines is not None else config.engines
    return wanted or max(1, gpus // max(1, config.tensor_parallel_size))


def _generate_parts(
    source: str, checkpoint_dir: Path, settings: vllm_engine.EngineSettings, sampling: dict[str, Any],
    parts: list[list[dict[str, Any]]], *, on_ray: bool, hosting: EngineHosting = EngineHosting(),
) -> tuple[list[dict[str, Any]], float, list[str]]:
    """Every part's results, in part order, the seconds spent generating, and how each part's engine got
    the weights: on Ray actors (each fetches ``source``; the parts generate at once, so the longest
    part's) or one after another on this process's engine (the sum). Fewer results than requests is an
    EngineOutputError, never a short round (a smaller group would skew its advantages, eq. 9)."""
    if on_ray:
        done = _ray_generate(source, settings, sampling, parts, hosting)
        seconds = max(part.generate_seconds for part in done)
    else:
        done = [generate_part(str(checkpoint_dir), settings, sampling, part, f"part {i + 1}/{len(parts)}")
                for i, part in enumerate(parts)]
        seconds = sum(part.generate_seconds for part in done)
    results = [r for part in done for r in part.results]
    _check_whole_round(parts, results)
    return results, seconds, [part.engine for part in done]


def _check_whole_round(parts: list[list[dict[str, Any]]], results: list[dict[str, Any]]) -> None:
    """Refuse results that are not one per request, in request order; names a missing request."""
    asked = [(r["problem_id"], r["sample_index"]) for part in parts for r in part]
    got = [(r["problem_id"], r["sample_index"]) for r in results]
    if got != asked:
        answered = set(got)
        missing = [key for key in asked if key not in answered] or asked
        raise EngineOutputError(f"the engines returned {len(got)} results for {len(asked)} requests "
                                f"(first unanswered or out of order: problem {missing[0][0]} sample {missing[0][1]})")


def _rollout_rows(
    results: list[dict[str, Any]], *, checkpoint_id: str, seed: int, policy_version: int, generation_round: int
) -> list[dict[str, Any]]:
    """Rollout rows of the engine results, sorted by (problem_id, sample_index)."""
    rows = []
    for r in sorted(results, key=lambda r: (r["problem_id"], r["sample_index"])):
        if r["finish_reason"] not in ("stop", "length"):
            raise EngineOutputError(f"problem {r['problem_id']} sample {r['sample_index']}: "
                                   f"finish reason {r['finish_reason']!r}")
        rows.append(
            {
                "rollout_id": make_rollout_id(r["problem_id"], generation_round, r["sample_index"], checkpoint_id, seed),
                "problem_id": r["problem_id"],
                "sample_index": r["sample_index"],
                "prompt_token_ids": r["prompt_token_ids"],
                "response_token_ids": r["response_token_ids"],
                "response_text": r["response_text"],
                "rollout_log_probs": r["rollout_log_probs"],
                "response_length": len(r["response_token_ids"]),
                "finish_reason": r["finish_reason"],
                "truncated": r["finish_reason"] == "length",
                "checkpoint_id": checkpoint_id,
                "policy_version": policy_version,
                "seed": r["seed"],
                "generation_round": generation_round,
            }
        )
    return rows


def _manifest(
    rows: list[dict[str, Any]], config: RolloutConfig, *, source: str, checkpoint_id: str, policy_version: int,
    generation_round: int, seed: int, max_model_len: int, engines: int, backend: str, prompts: int, seconds: float,
    generate_seconds: float, weights_from: list[str],
) -> dict[str, Any]:
    """What the shard's manifest records: inputs, log-prob mode, settings, engines and timings."""
    tokens = sum(r["response_length"] for r in rows)
    return {
        "checkpoint_dir": source,
        "checkpoint_id": checkpoint_id,
        "policy_version": policy_version,
        "generation_round": generation_round,
        "rollout_seed": seed,
        "seed_column": "per-request seed = derive_request_seed(rollout_seed, problem_id, round, sample_index)",
        "logprobs_mode": vllm_engine.LOGPROBS_MODE,
        "config": asdict(config),
        "max_model_len": max_model_len,
        "engines": engines,
        "engine_backend": backend,
        "engine_weights": weights_from,  # per engine: "started", "reused", "reloaded", "reloaded from memory"
        "prompts": prompts,
        "samples": len(rows),
        "response_tokens": tokens,
        "seconds": round(seconds, 3),  # the whole round: engine start or weight reload, tokenizing, generating
        "generate_seconds": round(generate_seconds, 3),  # in vLLM's generate alone
        "tokens_per_second": round(tokens / max(seconds, 1e-9), 1),
    }


def generate_rollouts(
    checkpoint_dir: str | Path,
    problems: list[dict[str, str]],
    config: RolloutConfig,
    *,
    seed: int,
    policy_version: int,
    generation_round: int,
    engines: int | None = None,
    hosting: EngineHosting | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Generate G samples for each problem; returns (Rollout rows sorted by problem and sample, manifest).

    ``problems`` are ``{"problem_id", "prompt"}`` dicts. ``engines`` overrides ``config.engines``;
    with more than one GPU the parts run on Ray actors, otherwise sequentially on this process's
    engine (the same code path, used to test that the split does not change the output).
    ``hosting`` (default: the one the environment names, settings/rollout.py: EngineHosting.from_environ)
    set to a Ray address runs every part, one engine included, on the long-lived named engines; the rows
    are the same either way.
    """
    hosting = hosting if hosting is not None else EngineHosting.from_environ(os.environ)
    started = time.perf_counter()
    source = str(checkpoint_dir)  # a path, or a URI that each engine's node fetches into its mirror
    pruning.require_weights(source)  # a clear error for a checkpoint the retention policy pruned
    # Long-lived engines fetch (or are handed) the weights themselves: this process reads the rest alone.
    checkpoint_dir = checkpoints.fetch_policy(source, weights=not hosting.persistent)
    info = checkpoints.read_info(checkpoint_dir)  # a clear error for an incomplete folder
    if config.samples_per_prompt < 1 or config.max_response_tokens < 1:
        raise RolloutError(f"samples_per_prompt and max_response_tokens must be >= 1, got {config}")
    max_model_len = config.max_model_len or model_max_positions(checkpoint_dir)
    token_ids = tokenize_prompts(checkpoint_dir, [p["prompt"] for p in problems],
                                 problem_ids=[p["problem_id"] for p in problems])
    _check_prompts_fit(problems, token_ids, max_response_tokens=config.max_response_tokens, max_model_len=max_model_len)
    requests = _request_list(
        [{**p, "prompt_token_ids": ids} for p, ids in zip(problems, token_ids)], config, seed, generation_round
    )
    _attach_to_ray_cluster(hosting)
    gpus = vllm_engine.gpu_count()
    parts = split_parts(requests, _engine_count(engines, config, gpus))
    on_ray = hosting.persistent or (len(parts) > 1 and gpus > 1)
    settings = engine_settings(config, max_model_len)
    sampling = {"temperature": config.temperature, "top_p": config.top_p, "max_tokens": config.max_response_tokens}
    results, generate_seconds, weights_from = _generate_parts(source, checkpoint_dir, settings, sampling, parts,
                                                              on_ray=on_ray, hosting=hosting)
    rows = _rollout_rows(results, checkpoint_id=info.checkpoint_id, seed=seed, policy_version=policy_version,
                         generation_round=generation_round)
    manifest = _manifest(
        rows, config, source=source, checkpoint_id=info.checkpoint_id, policy_version=policy_version,
        generation_round=generation_round, seed=seed, max_model_len=max_model_len, engines=len(parts),
        backend="ray-persistent" if hosting.persistent else "ray" if on_ray else "in-process", prompts=len(problems),
        seconds=time.perf_counter() - started, generate_seconds=generate_seconds, weights_from=weights_from,
    )
    return rows, manifest


def write_rollout_shard(rows: list[dict[str, Any]], manifest: dict[str, Any], out_path: str | Path) -> Path:
    """Validate and write the Rollout shard atomically, then its manifest beside it."""
    import schemas

    out_path = Path(out_path)
    table = schemas.arrow_schema(schemas.Rollout).empty_table() if not rows else rows
    schemas.write_shard(table, out_path, schemas.Rollout)
    run_store.write_text(manifest_path(out_path), json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return out_path


def manifest_path(shard_path: str | Path) -> str:
    """The manifest beside a Rollout shard (a path or a URI): ``<shard>.manifest.json``."""
    return f"{shard_path}.manifest.json"


def rollout_shard(
    checkpoint_dir: str | Path,
    problem_paths: list[str],
    problem_ids: list[str] | None,
    out_path: str | Path,
    config: RolloutConfig,
    *,
    seed: int,
    policy_version: int,
    generation_round: int,
    engines: int | None = None,
) -> Path:
    """Read problems, generate, write the Rollout shard at ``out_path``; returns the path."""
    problems = load_problems(list(problem_paths), None if problem_ids is None else list(problem_ids))
    rows, manifest = generate_rollouts(
        checkpoint_dir, problems, config, seed=seed, policy_version=policy_version,
        generation_round=generation_round, engines=engines,
    )
    return write_rollout_shard(rows, manifest, out_path)


def load_problems_ids(problem_paths: list[str]) -> list[str]:
    """All problem ids of the shards, in shard order."""
    return [p["problem_id"] for p in load_problems(problem_paths, None)]
