"""Pandera models of the Arrow tables that cross each stage boundary (the pipeline's contracts).

One model per boundary: curate -> ``Problem`` / ``RejectedProblem``; rollout -> ``Rollout``;
score/filter -> ``ScoredRollout``; train -> ``StepMetrics``; evaluate -> ``EvalResult``. Column
names and Arrow types follow docs/ARCHITECTURE.md exactly; each field is documented once here.

The models use pandera's pyarrow backend (``pandera.pyarrow``, served through narwhals), so a
``pyarrow.Table`` is validated as is, with exact types (``int32`` is not ``int64``,
``list<int32>`` is not ``list<int64>``). Row rules that span several columns (a log-prob per
response token, reward = rule_reward + overlong_penalty, ...) are ``dataframe_check``s whose
logic lives in plain functions in ``ROW_RULES``, so the shard helpers can re-run them to name the
offending rows.
"""

import functools
import importlib.util
import sys
from collections.abc import Callable
from typing import Optional

import pyarrow as pa
import pyarrow.compute as pc
import pandera.pyarrow as pdp
from pandera.api.pyarrow.types import PyArrowData

# pandera's narwhals backend runs `from pandera.engines import pyspark_engine` in every column's
# dtype check, on every validation; without pyspark that import fails each time, and a failed
# import searches sys.path again (~0.8 ms a column: a third to a half of validating a shard).
# Recording the module as absent makes the import fail at once with the same ImportError, which
# pandera catches (benchmarks/journal/2026-11-21_to_2026-11-27.md, "Fixed per-step cost").
if importlib.util.find_spec("pyspark") is None:
    sys.modules.setdefault("pandera.engines.pyspark_engine", None)

_HEX16 = r"^[0-9a-f]{16}$"
NONEMPTY = {"min_value": 1}

# ----------------------------------------------------------------------------- row rules
# Each takes the whole table and returns one boolean per row (True = row is fine); null counts as
# fine here because nullability is checked per column.


def _rule_log_probs_per_token(table: pa.Table) -> pa.ChunkedArray:
    """One rollout log-prob per response token, and response_length counts those tokens."""
    n_tokens = pc.list_value_length(table["response_token_ids"])
    same_as_log_probs = pc.equal(n_tokens, pc.list_value_length(table["rollout_log_probs"]))
    same_as_length = pc.equal(pc.cast(n_tokens, pa.int64()), pc.cast(table["response_length"], pa.int64()))
    return pc.and_kleene(same_as_log_probs, same_as_length)


def _rule_truncated_iff_length(table: pa.Table) -> pa.ChunkedArray:
    """``truncated`` is exactly ``finish_reason == "length"``."""
    return pc.equal(table["truncated"], pc.equal(table["finish_reason"], "length"))


def _rule_reward_is_sum(table: pa.Table) -> pa.ChunkedArray:
    """reward == rule_reward + overlong_penalty (eq. 7 + eq. 13), to float32 precision."""
    total = pc.add(pc.cast(table["rule_reward"], pa.float64()), pc.cast(table["overlong_penalty"], pa.float64()))
    gap = pc.abs(pc.subtract(total, pc.cast(table["reward"], pa.float64())))
    return pc.less_equal(gap, 1e-5)


def _rule_kept_iff_filter_kept(table: pa.Table) -> pa.ChunkedArray:
    """``kept`` is exactly ``filter_reason == "kept"`` (dynamic sampling, sec. 3.2)."""
    return pc.equal(table["kept"], pc.equal(table["filter_reason"], "kept"))


def _rule_num_correct_le_k(table: pa.Table) -> pa.ChunkedArray:
    """0 <= num_correct <= k."""
    return pc.less_equal(table["num_correct"], table["k"])


def _rule_avg_is_fraction(table: pa.Table) -> pa.ChunkedArray:
    """avg_at_k == num_correct / k, and pass_at_k == (num_correct > 0)."""
    expected = pc.divide(pc.cast(table["num_correct"], pa.float64()), pc.cast(table["k"], pa.float64()))
    close = pc.less_equal(pc.abs(pc.subtract(expected, table["avg_at_k"])), 1e-9)
    return pc.and_kleene(close, pc.equal(table["pass_at_k"], pc.greater(table["num_correct"], 0)))


ROW_RULES: dict[str, Callable[[pa.Table], pa.ChunkedArray]] = {
    "log_probs_per_token": _rule_log_probs_per_token,
    "truncated_iff_length": _rule_truncated_iff_length,
    "reward_is_sum": _rule_reward_is_sum,
    "kept_iff_filter_kept": _rule_kept_iff_filter_kept,
    "num_correct_le_k": _rule_num_correct_le_k,
    "avg_is_fraction": _rule_avg_is_fraction,
}


# The columns each rule reads (shown beside the offending rows in error messages).
ROW_RULE_COLUMNS: dict[str, tuple[str, ...]] = {
    "log_probs_per_token": ("response_token_ids", "rollout_log_probs", "response_length"),
    "truncated_iff_length": ("finish_reason", "truncated"),
    "reward_is_sum": ("rule_reward", "overlong_penalty", "reward"),
    "kept_iff_filter_kept": ("filter_reason", "kept"),
    "num_correct_le_k": ("num_correct", "k"),
    "avg_is_fraction": ("num_correct", "k", "avg_at_k", "pass_at_k"),
}


def rule_passes(rule: str, table: pa.Table) -> bool:
    """Whether every row of ``table`` keeps row rule ``rule`` (nulls count as fine)."""
    return bool(pc.all(pc.fill_null(ROW_RULES[rule](table), True)).as_py() is not False)


def _passes(rule: str, data: PyArrowData) -> bool:
    return rule_passes(rule, data.table)


# ----------------------------------------------------------------------------- models


class Problem(pdp.DataFrameModel):
    """A curated problem with an integer answer (curate -> rollout, evaluate)."""

    problem_id: pa.string() = pdp.Field(str_matches=_HEX16)
    """sha256 of the normalised problem text, first 16 hex chars (dapo_core.answers.problem_id)."""
    source: pa.string() = pdp.Field(str_length=NONEMPTY)
    """Where the row came from: input file name, ``hf:<name>`` or ``synthetic``."""
    source_row: pa.int64() = pdp.Field(ge=0)
    """0-based row (line for JSONL) of the problem in its source."""
    problem: pa.string() = pdp.Field(str_length=NONEMPTY)
    """The bare problem text (no prompt template)."""
    answer: pa.int64()
    """The integer gold answer the rule-based reward compares with (eq. 7)."""
    original_answer: pa.string()
    """The answer as written in the source, before integer conversion or rewriting (for audit)."""
    prompt: pa.string() = pdp.Field(str_length=NONEMPTY)
    """The problem rendered into the run's prompt template (what the policy sees)."""
    split: pa.string() = pdp.Field(str_length=NONEMPTY)
    """``train`` or ``test`` (fixed by the input or by a hash of problem_id)."""
    answer_rule: pa.string() = pdp.Field(str_matches=r"^[a-z][a-z0-9_]*$")
    """How ``answer`` came from ``original_answer``: ``integer`` (it is one), a rewrite rule of
    dapo_core.answer_rewrite.REWRITE_RULES (``problem`` then ends with the rule's instruction), or
    ``hook_<i>`` (the i-th CurateConfig.answer_rewrites hook)."""

    class Config:
        strict = True


class RejectedProblem(pdp.DataFrameModel):
    """A source row the curation stage did not keep, and why (every input row is accounted for)."""

    source: pa.string() = pdp.Field(str_length=NONEMPTY)
    """As in Problem."""
    source_row: pa.int64() = pdp.Field(ge=0)
    """As in Problem."""
    problem: Optional[pa.string()] = pdp.Field(nullable=True)
    """The problem text when it could be read, else null."""
    original_answer: Optional[pa.string()] = pdp.Field(nullable=True)
    """The raw answer when it could be read, else null."""
    reason_code: pa.string() = pdp.Field(str_matches=r"^[a-z_]+$")
    """Stable code, a key of dapo_core.answers.REASON_CODES (e.g. ``not_integer_fraction``)."""
    reason: pa.string() = pdp.Field(str_length=NONEMPTY)
    """Human message quoting the offending value."""

    class Config:
        strict = True


class Rollout(pdp.DataFrameModel):
    """One sampled response (rollout -> score). G rows per prompt."""

    rollout_id: pa.string() = pdp.Field(unique=True, str_length=NONEMPTY)
    """Unique id of this sample."""
    problem_id: pa.string() = pdp.Field(str_matches=_HEX16)
    """The Problem it answers."""
    sample_index: pa.int32() = pdp.Field(ge=0)
    """0..G-1 within the prompt's group."""
    prompt_token_ids: pa.list_(pa.int32())
    """Token ids of the rendered prompt."""
    response_token_ids: pa.list_(pa.int32())
    """Token ids the engine generated."""
    response_text: pa.string()
    """The decoded response."""
    rollout_log_probs: pa.list_(pa.float32())
    """Log-prob of each response token under the generating policy, as the engine saw them."""
    response_length: pa.int32() = pdp.Field(ge=0)
    """Number of response tokens."""
    finish_reason: pa.string() = pdp.Field(isin=["stop", "length"])
    """``stop`` (EOS / stop string) or ``length`` (hit the response-token cap)."""
    truncated: pa.bool_()
    """finish_reason == "length" (the rows overlong filtering / punishment act on, sec. 3.4)."""
    checkpoint_id: pa.string() = pdp.Field(str_length=NONEMPTY)
    """Checkpoint whose weights generated the sample."""
    policy_version: pa.int32() = pdp.Field(ge=0)
    """The training step whose weights generated it."""
    seed: pa.int64()
    """Sampling seed."""
    generation_round: pa.int32() = pdp.Field(ge=0)
    """Which dynamic-sampling round (sec. 3.2) produced it, 0-based."""

    class Config:
        strict = True

    @pdp.dataframe_check
    def log_probs_per_token(cls, data: PyArrowData) -> bool:
        return _passes("log_probs_per_token", data)

    @pdp.dataframe_check
    def truncated_iff_length(cls, data: PyArrowData) -> bool:
        return _passes("truncated_iff_length", data)


class ScoredRollout(Rollout):
    """A Rollout plus its reward, advantage and filter decision (score -> train)."""

    gold_answer: pa.int64()
    """The Problem's integer answer."""
    extracted_answer: Optional[pa.string()] = pdp.Field(nullable=True)
    """The answer read from the response's last ``Answer:`` line, null if none."""
    correct: pa.bool_()
    """Whether the extracted answer equals the gold answer."""
    verdict_status: pa.string() = pdp.Field(isin=["ok", "timeout", "error"])
    """Whether the verifier finished (``ok``), timed out or failed."""
    rule_reward: pa.float32() = pdp.Field(isin=[1.0, -1.0])
    """+1 correct / -1 otherwise (eq. 7)."""
    overlong_penalty: pa.float32() = pdp.Field(le=0.0)
    """Soft overlong punishment (eq. 13), <= 0."""
    reward: pa.float32()
    """rule_reward + overlong_penalty."""
    advantage: pa.float32()
    """Group-normalised advantage (eq. 9)."""
    loss_masked: pa.bool_()
    """True if overlong filtering (sec. 3.4) masks this sample out of the loss."""
    kept: pa.bool_()
    """True if dynamic sampling keeps the sample's group for training."""
    filter_reason: pa.string() = pdp.Field(isin=["kept", "all_correct", "all_wrong", "zero_reward_std", "surplus"])
    """Why the group was kept or dropped (sec. 3.2: groups with accuracy 0 or 1 are dropped)."""
    reward_version: pa.string() = pdp.Field(str_length=NONEMPTY)
    """Version of the reward code/config that scored it (lineage)."""

    class Config:
        strict = True

    @pdp.dataframe_check
    def reward_is_sum(cls, data: PyArrowData) -> bool:
        return _passes("reward_is_sum", data)

    @pdp.dataframe_check
    def kept_iff_filter_kept(cls, data: PyArrowData) -> bool:
        return _passes("kept_iff_filter_kept", data)


_NULLABLE_FLOAT = {"nullable": True}

# What each StepMetrics column is besides its type: the one place a step statistic is declared.
# The step's frozen record (schemas/step_stats.py: StepStats) and the trackers' scalar names
# (tracking/scalars.py) and the run report's step table (reports/run.py: columns, labels, formats)
# are derived from it.
# ``group``: the tracker panel (scalar ``<group>/<column>``); ``by``: who measures it, "worker"
# (the training workers report it; engines/train/publish.py copies it) or "driver" (rollout,
# scoring, sampling or timing: NaN / 0 in the train task's row, filled by the driver).
STEP_KEY = "key"  # ``by`` of the columns naming the step (step, checkpoint ids): no tracker scalar
BY_WORKER = "worker"  # ``by`` of what the training workers report
BY_DRIVER = "driver"  # ``by`` of what rollout, scoring, sampling or the driver's clock measure
# ``unit``: how a reader shows the value (the run page's step table): "fraction" (0-1, shown as percent),
# "s" (seconds), or "" (a plain number, an integer for integer columns).
UNITS = ("", "fraction", "s")


def _key() -> dict[str, str]:
    return {"group": "", "by": STEP_KEY}


def _stat(group: str, by: str, unit: str = "") -> dict[str, str]:
    if by not in (BY_WORKER, BY_DRIVER):
        raise ValueError(f"StepMetrics: 'by' must be {BY_WORKER!r} or {BY_DRIVER!r}, not {by!r}")
    if unit not in UNITS:
        raise ValueError(f"StepMetrics: 'unit' must be one of {UNITS}, not {unit!r}")
    return {"group": group, "by": by, "unit": unit}


class StepMetrics(pdp.DataFrameModel):
    """One row per training step (train -> driver, summary). Float metrics a stage does not
    fill are NaN (or null)."""

    step: pa.int32() = pdp.Field(ge=0, unique=True, metadata=_key())
    """Training step number (0-based)."""
    checkpoint_id: pa.string() = pdp.Field(str_length=NONEMPTY, metadata=_key())
    """The checkpoint this step produced."""
    parent_checkpoint_id: pa.string() = pdp.Field(str_length=NONEMPTY, metadata=_key())
    """The checkpoint this step started from."""
    loss: Optional[pa.float64()] = pdp.Field(**_NULLABLE_FLOAT, metadata=_stat("train", "worker"))
    """DAPO objective (eq. 8), token-level mean over the batch."""
    entropy: Optional[pa.float64()] = pdp.Field(**_NULLABLE_FLOAT, metadata=_stat("train", "worker"))
    """Mean token entropy of the policy on the batch (entropy collapse watch, sec. 3.1)."""
    clip_frac_low: Optional[pa.float64()] = pdp.Field(**_NULLABLE_FLOAT, metadata=_stat("train", "worker", "fraction"))
    """Fraction of tokens clipped at 1 - eps_low."""
    clip_frac_high: Optional[pa.float64()] = pdp.Field(**_NULLABLE_FLOAT, metadata=_stat("train", "worker", "fraction"))
    """Fraction of tokens clipped at 1 + eps_high (clip-higher, sec. 3.1)."""
    dual_clip_frac: Optional[pa.float64()] = pdp.Field(**_NULLABLE_FLOAT, metadata=_stat("train", "worker", "fraction"))
    """Fraction of tokens hit by the dual clip (negative advantages)."""
    approx_kl: Optional[pa.float64()] = pdp.Field(**_NULLABLE_FLOAT, metadata=_stat("train", "worker"))
    """Approximate KL(old || new) on the batch (monitoring only; DAPO has no KL term)."""
    grad_norm: Optional[pa.float64()] = pdp.Field(**_NULLABLE_FLOAT, metadata=_stat("train", "worker"))
    """Gradient norm before clipping."""
    lr: Optional[pa.float64()] = pdp.Field(**_NULLABLE_FLOAT, metadata=_stat("train", "worker"))
    """Learning rate used at this step."""
    tokens: pa.int64() = pdp.Field(ge=0, metadata=_stat("train", "worker"))
    """Response tokens in the loss."""
    samples: pa.int64() = pdp.Field(ge=0, metadata=_stat("train", "worker"))
    """Samples trained on."""
    masked_samples: pa.int64() = pdp.Field(ge=0, metadata=_stat("train", "worker"))
    """Samples masked out by overlong filtering."""
    reward_mean: Optional[pa.float64()] = pdp.Field(**_NULLABLE_FLOAT, metadata=_stat("rollout", "driver"))
    """Mean reward of the step's kept samples."""
    accuracy: Optional[pa.float64()] = pdp.Field(**_NULLABLE_FLOAT, metadata=_stat("rollout", "driver", "fraction"))
    """Fraction of all generated samples that were correct."""
    response_length_mean: Optional[pa.float64()] = pdp.Field(**_NULLABLE_FLOAT, metadata=_stat("rollout", "driver"))
    """Mean response length in tokens."""
    truncation_ratio: Optional[pa.float64()] = pdp.Field(**_NULLABLE_FLOAT, metadata=_stat("rollout", "driver", "fraction"))
    """Fraction of samples that hit the response-token cap."""
    generation_rounds: pa.int32() = pdp.Field(ge=0, metadata=_stat("sampling", "driver"))
    """Dynamic-sampling rounds needed to fill the batch (sec. 3.2)."""
    trained_groups: pa.int32() = pdp.Field(ge=0, metadata=_stat("sampling", "driver"))
    """Groups the step trained on: prompts_per_step, fewer (partial), or 0 (skipped: no informative group)."""
    carried_groups: pa.int32() = pdp.Field(ge=0, metadata=_stat("sampling", "driver"))
    """Of those, groups carried in as surplus from an earlier step (generated by an older policy)."""
    samples_generated: Optional[pa.int64()] = pdp.Field(ge=0, nullable=True, metadata=_stat("sampling", "driver"))
    """Samples the step's generation rounds produced (every round, kept or not; 0 when carried surplus
    alone filled the batch)."""
    over_generation: Optional[pa.float64()] = pdp.Field(**_NULLABLE_FLOAT, metadata=_stat("sampling", "driver"))
    """Samples generated per sample trained (``samples_generated / samples``; carried surplus counts as
    trained, so a step can be below 1); NaN when nothing was trained. At least 1 / informative rate
    over a run: every zero-signal group must be generated to be found (issue 51)."""
    zero_signal_share: Optional[pa.float64()] = pdp.Field(**_NULLABLE_FLOAT, metadata=_stat("sampling", "driver", "fraction"))
    """Share of the step's generated groups whose G rewards are all equal (zero advantage, no gradient:
    TRL's ``frac_reward_zero_std``); NaN when no round ran."""
    max_policy_lag_steps: pa.int32() = pdp.Field(ge=0, metadata=_stat("off_policy", "driver"))
    """Largest policy lag in the batch: steps between a group's generation and this training step
    (the driver's count; ``policy_lag_max`` counts checkpoints, which differs after skipped steps)."""
    policy_lag_mean: Optional[pa.float64()] = pdp.Field(**_NULLABLE_FLOAT, metadata=_stat("off_policy", "worker"))
    """Mean over the trained samples of the parent checkpoint's step minus the sample's
    ``policy_version`` (0 = on-policy; > 0: generated by an older checkpoint, e.g. carried surplus)."""
    policy_lag_max: pa.int32() = pdp.Field(ge=0, metadata=_stat("off_policy", "worker"))
    """Largest such policy lag among the trained samples."""
    stale_sample_fraction: Optional[pa.float64()] = pdp.Field(**_NULLABLE_FLOAT, metadata=_stat("off_policy", "worker", "fraction"))
    """Fraction of the trained samples with policy lag > 0."""
    logprob_mismatch_mean_abs: Optional[pa.float64()] = pdp.Field(**_NULLABLE_FLOAT, metadata=_stat("off_policy", "worker"))
    """Mean |trainer log-prob of the parent - recorded rollout log-prob| over response tokens
    (numerical rollout/trainer mismatch, plus the policy change for stale samples)."""
    logprob_mismatch_max_abs: Optional[pa.float64()] = pdp.Field(**_NULLABLE_FLOAT, metadata=_stat("off_policy", "worker"))
    """Largest such difference on one token."""
    logprob_mismatch_on_policy_mean_abs: Optional[pa.float64()] = pdp.Field(**_NULLABLE_FLOAT, metadata=_stat("off_policy", "worker"))
    """The same mean over the on-policy samples only (policy lag 0): the rollout engine's numerical
    disagreement with the trainer on the weights both hold, which the stale samples' policy change
    would hide in ``logprob_mismatch_mean_abs`` (0 for the tiny policy in fp32 on CPU; a jump means the
    engine sampled from other weights than the parent's). NaN when no sample is on-policy."""
    logprob_mismatch_on_policy_max_abs: Optional[pa.float64()] = pdp.Field(**_NULLABLE_FLOAT, metadata=_stat("off_policy", "worker"))
    """Largest such difference on one token of an on-policy sample; NaN when none."""
    behaviour_weight_mean: Optional[pa.float64()] = pdp.Field(**_NULLABLE_FLOAT, metadata=_stat("off_policy", "worker"))
    """Mean off-policy correction weight min(pi_prox / pi_behav, cap) over the loss tokens
    (uncorrected samples count 1); NaN when the step applied no correction."""
    behaviour_weight_capped_fraction: Optional[pa.float64()] = pdp.Field(**_NULLABLE_FLOAT, metadata=_stat("off_policy", "worker", "fraction"))
    """Fraction of the loss tokens whose correction weight was truncated at the cap; NaN when none applied."""
    verdict_timeouts: pa.int64() = pdp.Field(ge=0, metadata=_stat("verifier", "driver"))
    """Verifier timeouts during scoring."""
    verdict_errors: pa.int64() = pdp.Field(ge=0, metadata=_stat("verifier", "driver"))
    """Verifier errors during scoring."""
    time_rollout_s: Optional[pa.float64()] = pdp.Field(**_NULLABLE_FLOAT, metadata=_stat("time", "driver", "s"))
    """Wall-clock seconds spent generating."""
    time_score_s: Optional[pa.float64()] = pdp.Field(**_NULLABLE_FLOAT, metadata=_stat("time", "driver", "s"))
    """Wall-clock seconds spent scoring/filtering."""
    time_train_s: Optional[pa.float64()] = pdp.Field(**_NULLABLE_FLOAT, metadata=_stat("time", "driver", "s"))
    """Wall-clock seconds spent in the optimizer step."""

    class Config:
        strict = True


class EvalResult(pdp.DataFrameModel):
    """One row per (eval_set, problem_id, checkpoint_id): the outcome of k samples."""

    eval_set: pa.string() = pdp.Field(str_length=NONEMPTY)
    """Name of the evaluation set (e.g. ``aime24``)."""
    problem_id: pa.string() = pdp.Field(str_matches=_HEX16)
    """The Problem evaluated."""
    checkpoint_id: pa.string() = pdp.Field(str_length=NONEMPTY)
    """The checkpoint evaluated."""
    step: pa.int32() = pdp.Field(ge=0)
    """Training step of that checkpoint."""
    k: pa.int32() = pdp.Field(ge=1)
    """Samples drawn for the problem."""
    num_correct: pa.int32() = pdp.Field(ge=0)
    """How many of the k were correct."""
    avg_at_k: pa.float64() = pdp.Field(in_range={"min_value": 0.0, "max_value": 1.0})
    """num_correct / k (the paper's avg@32 averages this over problems)."""
    pass_at_k: pa.bool_()
    """num_correct > 0."""
    maj_answer: Optional[pa.string()] = pdp.Field(nullable=True)
    """Most frequent answer among the k, by judged value (34, 34.0 and 68/2 are one answer, "34");
    null if none was extracted."""
    maj_correct: pa.bool_()
    """Whether maj_answer is correct."""
    verdict_timeouts: pa.int32() = pdp.Field(ge=0)
    """Verifier timeouts among the k (scored -1)."""
    verdict_errors: pa.int32() = pdp.Field(ge=0)
    """Verifier errors among the k (scored -1)."""
    temperature: pa.float64() = pdp.Field(ge=0.0)
    """Sampling temperature (paper: 1.0)."""
    top_p: pa.float64() = pdp.Field(gt=0.0, le=1.0)
    """Nucleus sampling p (paper: 0.7)."""
    seed: pa.int64()
    """Sampling seed."""

    class Config:
        strict = True
        unique = ["eval_set", "problem_id", "checkpoint_id"]

    @pdp.dataframe_check
    def num_correct_le_k(cls, data: PyArrowData) -> bool:
        return _passes("num_correct_le_k", data)

    @pdp.dataframe_check
    def avg_is_fraction(cls, data: PyArrowData) -> bool:
        return _passes("avg_is_fraction", data)


ALL_MODELS: tuple[type[pdp.DataFrameModel], ...] = (
    Problem,
    RejectedProblem,
    Rollout,
    ScoredRollout,
    StepMetrics,
    EvalResult,
)

_SCHEMA_METADATA_KEY = b"dapo.schema"  # names the model in every shard's Arrow schema

# Nullable columns added to a model after run folders were written without them (model name ->
# columns). A shard that lacks one reads as holding nulls there (schemas/shards.py: read_shard), so
# an earlier version's run folder stays readable by `dapo lineage`, `dapo verify` and a resume; any
# other missing column is still an error. tests/unit/test_schemas.py checks each is nullable.
ADDED_COLUMNS: dict[str, tuple[str, ...]] = {
    "StepMetrics": ("logprob_mismatch_on_policy_mean_abs", "logprob_mismatch_on_policy_max_abs", "samples_generated",
                    "over_generation", "zero_signal_share"),
}


@functools.cache
def arrow_schema(model: type) -> pa.Schema:
    """The exact Arrow schema (column order and types) every writer of ``model`` produces."""
    schema = model.empty().schema.remove_metadata()
    return schema.with_metadata({_SCHEMA_METADATA_KEY: model.__name__.encode()})
