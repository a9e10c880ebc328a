"""ScoredRollout rows -> the padded [B, L] tensors one DAPO training step consumes.

A training sample is one kept ScoredRollout row: its prompt and response token ids laid end to
end (right-padded, so position p of every row is real token p of that sample and padding never
shifts a real token), with per-token views over the response part:

- ``advantages``: the sample's group-relative advantage (paper eq. 9) copied onto every response
  token, because DAPO's loss is a token-level sum (eq. 10, sec. 3.3);
- ``rollout_log_probs``: the log-probs the rollout engine reported for the response tokens (kept
  to measure the rollout/trainer mismatch and for truncated importance sampling);
- ``policy_versions``: per sample, the training step whose checkpoint generated it; the trainer
  turns it into a policy lag against the checkpoint it updates (dapo_core/correction.py);
- ``loss_mask``: response tokens that count in the loss. Samples cut by overlong filtering
  (``loss_masked``, paper sec. 3.4) stay in the batch with an all-False mask: they are seen but
  contribute no gradient and no tokens to the normaliser.

Rows with ``kept == False`` (groups dropped by dynamic sampling, paper sec. 3.2) are excluded.

Shapes: ``B`` samples (G per prompt, prompts flattened), ``L`` = the longest prompt + response.
Bad input raises ``TrainBatchError`` naming the file, row and rollout id.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from itertools import chain
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

# Columns of ScoredRollout (docs/ARCHITECTURE.md) a training step reads.
REQUIRED_COLUMNS = (
    "rollout_id",
    "prompt_token_ids",
    "response_token_ids",
    "rollout_log_probs",
    "response_length",
    "advantage",
    "loss_masked",
    "kept",
    "policy_version",
)
# A sampled token's log-prob is <= 0; allow float rounding above it.
_LOG_PROB_SLACK = 1e-4


class TrainBatchError(ValueError):
    """A ScoredRollout row (or the batch as a whole) cannot be trained on."""


@dataclass(frozen=True)
class SampleRow:
    """One kept ScoredRollout row, reduced to what training needs."""

    rollout_id: str
    prompt_token_ids: tuple[int, ...]
    response_token_ids: tuple[int, ...]
    rollout_log_probs: tuple[float, ...]  # one per response token
    advantage: float
    loss_masked: bool  # overlong-filtered: no loss on any of its tokens (paper sec. 3.4)
    origin: str  # "<file>:row <i>", for error messages
    policy_version: int  # the training step whose checkpoint generated it (Rollout.policy_version)


@dataclass(frozen=True)
class TrainBatch:
    """Padded tensors for B samples of at most L tokens (prompt + response)."""

    input_ids: torch.Tensor  # [B, L] int64, right-padded with pad_token_id
    attention_mask: torch.Tensor  # [B, L] bool, True on real tokens
    response_mask: torch.Tensor  # [B, L] bool, True on response tokens
    loss_mask: torch.Tensor  # [B, L] bool, response tokens that count in the loss
    advantages: torch.Tensor  # [B, L] float32, the sample's advantage on response tokens, else 0
    rollout_log_probs: torch.Tensor  # [B, L] float32, rollout engine's log-probs, else 0
    loss_masked: torch.Tensor  # [B] bool, overlong-filtered samples
    rollout_ids: tuple[str, ...]  # [B]
    policy_versions: torch.Tensor  # [B] int64, the step whose checkpoint generated each sample

    @property
    def num_samples(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def loss_tokens(self) -> int:
        """Tokens that count in the token-level loss normaliser (paper eq. 10)."""
        return int(self.loss_mask.sum())


def _is_log_prob(x: float) -> bool:
    return math.isfinite(x) and x <= _LOG_PROB_SLACK


def _check_row(row: dict[str, Any], origin: str) -> SampleRow:
    rid = row["rollout_id"]
    where = f"{origin} (rollout_id {rid!r})"
    prompt = tuple(map(int, row["prompt_token_ids"] or ()))
    response = tuple(map(int, row["response_token_ids"] or ()))
    log_probs = tuple(map(float, row["rollout_log_probs"] or ()))
    if not prompt:
        raise TrainBatchError(f"{where}: field 'prompt_token_ids' is empty")
    if not response:
        raise TrainBatchError(f"{where}: field 'response_token_ids' is empty")
    if int(row["response_length"]) != len(response):
        raise TrainBatchError(
            f"{where}: field 'response_length' is {row['response_length']} but "
            f"'response_token_ids' has {len(response)} tokens"
        )
    if len(log_probs) != len(response):
        raise TrainBatchError(
            f"{where}: field 'rollout_log_probs' has {len(log_probs)} values for {len(response)} response tokens"
        )
    if not all(map(_is_log_prob, log_probs)):
        bad = [i for i, x in enumerate(log_probs) if not _is_log_prob(x)]
        raise TrainBatchError(
            f"{where}: field 'rollout_log_probs' has non-finite or positive values at tokens {bad[:5]}"
        )
    advantage = row["advantage"]
    if advantage is None or not math.isfinite(float(advantage)):
        raise TrainBatchError(f"{where}: field 'advantage' is {advantage!r} (must be finite)")
    if min(prompt + response) < 0:
        raise TrainBatchError(f"{where}: negative token id")
    if row["policy_version"] is None or int(row["policy_version"]) < 0:
        raise TrainBatchError(f"{where}: field 'policy_version' is {row['policy_version']!r} (must be >= 0)")
    return SampleRow(
        rollout_id=str(rid),
        prompt_token_ids=prompt,
        response_token_ids=response,
        rollout_log_probs=log_probs,
        advantage=float(advantage),
        loss_masked=bool(row["loss_masked"]),
        origin=origin,
        policy_version=int(row["policy_version"]),
    )


def select_rows(records: Iterable[dict[str, Any]], *, source: str) -> list[SampleRow]:
    """Validate ScoredRollout records and keep the rows with ``kept == True``.

    Args:
        records: row dicts (e.g. ``table.to_pylist()``) with at least REQUIRED_COLUMNS.
        source: name of where they came from (a file path), used in error messages.
    """
    rows: list[SampleRow] = []
    for i, record in enumerate(records):
        missing = [c for c in REQUIRED_COLUMNS if c not in record]
        if missing:
            raise TrainBatchError(f"{source}: row {i}: missing fields {missing}")
        if record["kept"] is None or record["loss_masked"] is None:
            raise TrainBatchError(f"{source}: row {i}: fields 'kept' and 'loss_masked' must not be null")
        if not record["kept"]:
            continue  # dropped by dynamic sampling (paper sec. 3.2): not part of the batch
        rows.append(_check_row(record, f"{source}: row {i}"))
    return rows


def _read_records(path: Path) -> list[dict[str, Any]]:
    import schemas

    try:
        table = schemas.read_shard(path, schemas.ScoredRollout)  # validates every column (schemas/)
    except schemas.ShardValidationError as err:
        raise TrainBatchError(str(err)) from err
    return table.select(list(REQUIRED_COLUMNS)).to_pylist()


def shard_files(paths: Sequence[str | Path]) -> list[Path]:
    """The shard files of ``paths`` (files, or folders of ``*.parquet``), in reading order."""
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files.extend(sorted(p.glob("*.parquet")))
        elif p.is_file():
            files.append(p)
        else:
            raise TrainBatchError(f"{p}: no such ScoredRollout shard")
    return files


def load_rows(paths: Sequence[str | Path]) -> list[SampleRow]:
    """Read ScoredRollout shards (files, or folders of ``*.parquet``) and select the kept rows.

    Rollout ids must be unique across all shards (a duplicate would train on a sample twice).
    """
    rows: list[SampleRow] = []
    seen: dict[str, str] = {}
    for f in shard_files(paths):
        for row in select_rows(_read_records(f), source=str(f)):
            if row.rollout_id in seen:
                raise TrainBatchError(
                    f"{row.origin}: rollout_id {row.rollout_id!r} also appears at {seen[row.rollout_id]}"
                )
            seen[row.rollout_id] = row.origin
            rows.append(row)
    return rows


def check_trainable(rows: Sequence[SampleRow], *, step: int) -> None:
    """Refuse a batch a training step cannot learn from: no kept rows, or every sample masked."""
    if not rows:
        raise TrainBatchError(f"step {step}: empty training batch (no ScoredRollout rows with kept == True)")
    if all(r.loss_masked for r in rows):
        raise TrainBatchError(
            f"step {step}: all {len(rows)} kept samples are loss_masked (overlong filtering): no token to train on"
        )


def collate(rows: Sequence[SampleRow], *, pad_token_id: int) -> TrainBatch:
    """Lay the rows out as right-padded [B, L] tensors (L = longest prompt + response).

    Vectorised: the [B, L] masks come from each row's lengths, and the tokens and log-probs fill
    them in row-major order (a boolean-mask assignment), so the cost is a few tensor ops for the
    whole batch rather than five per row. ``collate_reference`` is the per-row loop it must equal.
    """
    if not rows:
        raise TrainBatchError("cannot collate an empty list of rows")
    n_prompt = torch.tensor([len(r.prompt_token_ids) for r in rows], dtype=torch.long)  # [B]
    ends = n_prompt + torch.tensor([len(r.response_token_ids) for r in rows], dtype=torch.long)  # [B]
    positions = torch.arange(int(ends.max()), dtype=torch.long)[None, :]  # [1, L]
    attention_mask = positions < ends[:, None]  # [B, L]
    response_mask = attention_mask & (positions >= n_prompt[:, None])  # [B, L]
    input_ids = torch.full(attention_mask.shape, pad_token_id, dtype=torch.long)
    input_ids[attention_mask] = torch.tensor(
        list(chain.from_iterable(chain(r.prompt_token_ids, r.response_token_ids) for r in rows)), dtype=torch.long)
    rollout_log_probs = torch.zeros(attention_mask.shape, dtype=torch.float32)
    rollout_log_probs[response_mask] = torch.tensor(
        list(chain.from_iterable(r.rollout_log_probs for r in rows)), dtype=torch.float32)
    advantage = torch.tensor([r.advantage for r in rows], dtype=torch.float32)  # [B]
    advantages = torch.where(response_mask, advantage[:, None], torch.zeros((), dtype=torch.float32))
    loss_masked = torch.tensor([r.loss_masked for r in rows], dtype=torch.bool)
    # Overlong-filtered samples (paper sec. 3.4) keep their tokens in the batch but none in the loss.
    loss_mask = response_mask & ~loss_masked[:, None]
    return TrainBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        response_mask=response_mask,
        loss_mask=loss_mask,
        advantages=advantages,
        rollout_log_probs=rollout_log_probs,
        loss_masked=loss_masked,
        rollout_ids=tuple(r.rollout_id for r in rows),
        policy_versions=torch.tensor([r.policy_version for r in rows], dtype=torch.long),
    )


def collate_reference(rows: Sequence[SampleRow], *, pad_token_id: int) -> TrainBatch:
    """``collate`` as a plain loop over rows: the slow, obvious version tests compare it with."""
    if not rows:
        raise TrainBatchError("cannot collate an empty list of rows")
    batch_size = len(rows)
    seq_len = max(len(r.prompt_token_ids) + len(r.response_token_ids) for r in rows)
    input_ids = torch.full((batch_size, seq_len), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((batch_size, seq_len), dtype=torch.bool)
    response_mask = torch.zeros((batch_size, seq_len), dtype=torch.bool)
    advantages = torch.zeros((batch_size, seq_len), dtype=torch.float32)
    rollout_log_probs = torch.zeros((batch_size, seq_len), dtype=torch.float32)
    for b, row in enumerate(rows):
        n_prompt, n_resp = len(row.prompt_token_ids), len(row.response_token_ids)
        end = n_prompt + n_resp
        input_ids[b, :end] = torch.tensor(row.prompt_token_ids + row.response_token_ids, dtype=torch.long)
        attention_mask[b, :end] = True
        response_mask[b, n_prompt:end] = True
        advantages[b, n_prompt:end] = row.advantage
        rollout_log_probs[b, n_prompt:end] = torch.tensor(row.rollout_log_probs, dtype=torch.float32)
    loss_masked = torch.tensor([r.loss_masked for r in rows], dtype=torch.bool)
    return TrainBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        response_mask=response_mask,
        loss_mask=response_mask & ~loss_masked[:, None],
        advantages=advantages,
        rollout_log_probs=rollout_log_probs,
        loss_masked=loss_masked,
        rollout_ids=tuple(r.rollout_id for r in rows),
        policy_versions=torch.tensor([r.policy_version for r in rows], dtype=torch.long),
    )


def select(batch: TrainBatch, index: Sequence[int]) -> TrainBatch:
    """Rows ``index`` of ``batch``, trimmed to their own longest sequence (less padding to run).

    Right padding makes the trim exact: every real token keeps its position.
    """
    idx = torch.as_tensor(list(index), dtype=torch.long)
    if idx.numel() == 0:
        raise TrainBatchError("cannot select zero rows")
    attention = batch.attention_mask[idx]
    width = int(attention.sum(dim=1).max())
    return TrainBatch(
        input_ids=batch.input_ids[idx, :width],
        attention_mask=attention[:, :width],
        response_mask=batch.response_mask[idx, :width],
        loss_mask=batch.loss_mask[idx, :width],
        advantages=batch.advantages[idx, :width],
        rollout_log_probs=batch.rollout_log_probs[idx, :width],
        loss_masked=batch.loss_masked[idx],
        rollout_ids=tuple(batch.rollout_ids[i] for i in idx.tolist()),
        policy_versions=batch.policy_versions[idx],
    )


def token_log_probs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Log-prob of each token given the tokens before it, aligned with ``input_ids``.

    Args:
        logits: [B, L, V] next-token logits (position p predicts token p + 1).
        input_ids: [B, L].
    Returns:
        [B, L] float32; position 0 (no context) is 0.
    """
    log_softmax = torch.log_softmax(logits[:, :-1].float(), dim=-1)  # [B, L-1, V]
    picked = log_softmax.gather(-1, input_ids[:, 1:, None]).squeeze(-1)  # [B, L-1]
    return torch.nn.functional.pad(picked, (1, 0), value=0.0)


def token_log_probs_reference(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Slow, obvious loop version of ``token_log_probs`` (for tests)."""
    batch_size, seq_len = input_ids.shape
    out = torch.zeros((batch_size, seq_len), dtype=torch.float32)
    for b in range(batch_size):
        for p in range(1, seq_len):
            row = logits[b, p - 1].double()
            log_z = torch.log(torch.exp(row - row.max()).sum()) + row.max()
            out[b, p] = float(row[input_ids[b, p]] - log_z)
    return out


def mini_batches(num_samples: int, num_mini_batches: int, *, seed: int) -> list[list[int]]:
    """Shuffle sample indices with ``seed`` and split them into ``num_mini_batches`` near-equal parts.

    The paper updates 16 times per rollout step on 1/16 of the batch each (sec. 4.1). Sizes
    differ by at most one; the split depends only on (num_samples, num_mini_batches, seed), never
    on micro-batch size or process count, so those cannot change the result.
    """
    if num_mini_batches < 1:
        raise ValueError(f"num_mini_batches must be >= 1, got {num_mini_batches}")
    if num_samples < num_mini_batches:
        raise TrainBatchError(
            f"{num_samples} samples cannot fill {num_mini_batches} mini-batches (updates_per_step)"
        )
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(num_samples, generator=generator).tolist()
    base, extra = divmod(num_samples, num_mini_batches)
    out, start = [], 0
    for m in range(num_mini_batches):
        size = base + (1 if m < extra else 0)
        out.append(order[start : start + size])
        start += size
    return out


def rank_micro_batches(
    mini_batch: Sequence[int], *, rank: int, world_size: int, micro_batch_samples: int
) -> list[list[int]]:
    """This rank's micro-batches of one mini-batch: a strided share, cut into micro-batches.

    Rank r takes samples r, r + W, r + 2W, ... of the mini-batch. Returns lists of sample
    indices; a rank may get fewer micro-batches than another (see ``accumulation_steps``).
    """
    share = list(mini_batch[rank::world_size])
    return [share[i : i + micro_batch_samples] for i in range(0, len(share), micro_batch_samples)]


def accumulation_steps(mini_batch_sizes: Sequence[int], *, world_size: int, micro_batch_samples: int) -> int:
    """Micro-batches per rank per update: enough for the largest rank share of any mini-batch.

    DeepSpeed needs one fixed count; ranks with fewer real micro-batches run zero-weight ones.
    """
    largest_share = max(math.ceil(n / world_size) for n in mini_batch_sizes)
    return max(1, math.ceil(largest_share / micro_batch_samples))
