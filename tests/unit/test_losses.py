"""Tests for dapo_core.losses: clip-higher policy loss (sec. 3.1, eq. 10) and aggregations (eq. 12)."""

from __future__ import annotations

import math

import pytest
import torch

from dapo_core.losses import AGGREGATIONS, policy_loss, policy_loss_reference


def _random_batch(seed: int, batch: int = 6, width: int = 9) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, width, generator=gen, dtype=torch.float64) * 3
    # Ratios spread over ~[0.45, 2.2] so every clip branch is exercised.
    new = old + (torch.rand(batch, width, generator=gen, dtype=torch.float64) - 0.5) * 1.6
    adv = torch.randn(batch, 1, generator=gen, dtype=torch.float64).expand(batch, width).clone()
    lengths = torch.randint(0, width + 1, (batch,), generator=gen)
    lengths[0] = width  # at least one full row
    lengths[1] = 0  # one fully masked row (e.g. overlong-filtered)
    mask = torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)
    ref = old + (torch.rand(batch, width, generator=gen, dtype=torch.float64) - 0.5) * 0.4
    return {"new": new, "old": old, "adv": adv, "mask": mask, "ref": ref}


def test_hand_worked_token_mean() -> None:
    # Row 0 (A = +1): ratios e^0.1 = 1.10517 (inside, loss -1.10517), e^0.5 = 1.64872 (clipped to 1.28,
    #   loss -1.28). Row 1 (A = -2): ratio e^-0.5 = 0.60653 < 0.8 -> max(2*0.60653, 2*0.8) = 1.6;
    #   second token padding (masked). token-mean = (-1.10517 - 1.28 + 1.6) / 3 = -0.26172.
    old = torch.zeros(2, 2)
    new = torch.tensor([[0.1, 0.5], [-0.5, 9.0]])
    adv = torch.tensor([[1.0, 1.0], [-2.0, -2.0]])
    mask = torch.tensor([[True, True], [True, False]])
    loss, m = policy_loss(new, old, adv, mask)
    expected = (-math.exp(0.1) - 1.28 + 1.6) / 3
    assert abs(loss.item() - expected) < 1e-6
    # One of three tokens clipped high (row 0 token 1), one clipped low (row 1 token 0).
    assert abs(m["clip_frac_high"].item() - 1 / 3) < 1e-7
    assert abs(m["clip_frac_low"].item() - 1 / 3) < 1e-7
    assert m["num_tokens"].item() == 3
    assert m["dual_clip_frac"].item() == 0
    # approx_kl = mean of (r - 1) - log r: (e^0.1-1-0.1) + (e^0.5-1-0.5) + (e^-0.5-1+0.5), / 3.
    k3 = ((math.exp(0.1) - 1.1) + (math.exp(0.5) - 1.5) + (math.exp(-0.5) - 0.5)) / 3
    assert abs(m["approx_kl"].item() - k3) < 1e-6
    assert all(not v.requires_grad for v in m.values())


def test_hand_worked_seq_aggregations() -> None:
    # Ratios all 1 (new == old), so token loss = -A. Row 0: A = 1, 3 valid tokens -> sum -3.
    # Row 1: A = -1, 1 valid token -> sum +1. Row 2: no valid tokens. Width L = 4.
    #   seq-mean-token-mean: row means (-1, +1), averaged over the 2 non-empty rows -> 0.
    #   seq-mean-token-sum-norm: (-3/4 + 1/4 + 0/4) / 3 rows = -1/6.
    #   with max_response_tokens = 8: (-3/8 + 1/8) / 3 = -1/12.
    #   token-mean: (-3 + 1) / 4 tokens = -0.5.
    z = torch.zeros(3, 4)
    adv = torch.tensor([[1.0] * 4, [-1.0] * 4, [5.0] * 4])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)
    assert abs(policy_loss(z, z, adv, mask, agg="seq-mean-token-mean")[0].item()) < 1e-7
    assert abs(policy_loss(z, z, adv, mask, agg="seq-mean-token-sum-norm")[0].item() + 1 / 6) < 1e-7
    assert abs(policy_loss(z, z, adv, mask, agg="seq-mean-token-sum-norm", max_response_tokens=8)[0].item()
               + 1 / 12) < 1e-7
    assert abs(policy_loss(z, z, adv, mask, agg="token-mean")[0].item() + 0.5) < 1e-7


@pytest.mark.parametrize("agg", AGGREGATIONS)
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("dual_clip_c", [None, 1.5])
@pytest.mark.parametrize("kl_beta", [0.0, 0.1])
def test_vectorised_matches_reference(agg: str, seed: int, dual_clip_c: float | None, kl_beta: float) -> None:
    b = _random_batch(seed)
    new_fast = b["new"].clone().requires_grad_(True)
    new_slow = b["new"].clone().requires_grad_(True)
    kwargs = dict(agg=agg, dual_clip_c=dual_clip_c, kl_beta=kl_beta, ref_log_probs=b["ref"])
    fast, _ = policy_loss(new_fast, b["old"], b["adv"], b["mask"], **kwargs)
    slow = policy_loss_reference(new_slow, b["old"], b["adv"], b["mask"], **kwargs)
    torch.testing.assert_close(fast, slow, rtol=1e-12, atol=1e-12)
    fast.backward()
    slow.backward()
    torch.testing.assert_close(new_fast.grad, new_slow.grad, rtol=1e-12, atol=1e-12)
    assert new_fast.grad.abs().sum() > 0  # the comparison is not vacuous


def test_dual_clip_caps_negative_advantage_loss() -> None:
    # A = -1, ratio e^1.2 = 3.3201 > c = 3: loss without dual clip = 3.3201 (grows with r);
    # with dual clip it is capped at -A * c = 3 and carries no gradient. Positive A untouched.
    old = torch.zeros(1, 2)
    new = torch.tensor([[1.2, 1.2]], requires_grad=True)
    adv = torch.tensor([[-1.0, 1.0]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    loss, m = policy_loss(new, old, adv, mask, dual_clip_c=3.0, agg="token-mean")
    # token 1: A = +1, r = 3.32 > 1.28 -> clipped to -1.28. Mean = (3 - 1.28) / 2 = 0.86.
    assert abs(loss.item() - 0.86) < 1e-6
    assert m["dual_clip_frac"].item() == 0.5 and m["clip_frac_high"].item() == 0.5
    loss.backward()
    assert new.grad.tolist() == [[0.0, 0.0]]
    loss_plain, _ = policy_loss(new, old, adv, mask)
    assert abs(loss_plain.item() - (math.exp(1.2) - 1.28) / 2) < 1e-6


def _grad_at(log_ratio: float, advantage: float, **kwargs: float) -> float:
    new = torch.tensor([[log_ratio]], dtype=torch.float64, requires_grad=True)
    loss, _ = policy_loss(new, torch.zeros(1, 1, dtype=torch.float64),
                          torch.tensor([[advantage]], dtype=torch.float64),
                          torch.ones(1, 1, dtype=torch.bool), **kwargs)
    loss.backward()
    return float(new.grad)


def test_clip_higher_positive_advantage_stops_at_one_plus_eps_high() -> None:
    # A = +1: d loss / d logp = -r while r < 1 + eps_high = 1.28, and 0 once r > 1.28.
    below, above = math.log(1.27), math.log(1.29)
    assert abs(_grad_at(below, 1.0) + 1.27) < 1e-9
    assert _grad_at(above, 1.0) == 0.0
    # The old symmetric clip (eps_high = 0.2) would already have stopped at 1.27.
    assert _grad_at(below, 1.0, eps_high=0.2) == 0.0
    # A low ratio with A > 0 is never clipped (the min picks r * A): the gradient still pushes up.
    assert abs(_grad_at(math.log(0.5), 1.0) + 0.5) < 1e-9


def test_eps_low_bound_for_negative_advantage() -> None:
    # A = -1: d loss / d logp = +r while r > 1 - eps_low = 0.8, and 0 once r < 0.8.
    assert abs(_grad_at(math.log(0.81), -1.0) - 0.81) < 1e-9
    assert _grad_at(math.log(0.79), -1.0) == 0.0
    # A high ratio with A < 0 is not clipped without dual-clip: the gradient keeps pulling down.
    assert abs(_grad_at(math.log(2.0), -1.0) - 2.0) < 1e-9


@pytest.mark.parametrize("agg", AGGREGATIONS)
def test_gradient_accumulation_equals_full_batch(agg: str) -> None:
    b = _random_batch(11, batch=8, width=10)
    full_new = b["new"].clone().requires_grad_(True)
    extra: dict[str, object] = {}
    if agg == "token-mean":
        extra["total_tokens"] = int(b["mask"].sum())
    elif agg == "seq-mean-token-mean":
        extra["total_sequences"] = int((b["mask"].sum(-1) > 0).sum())
    else:
        extra["total_sequences"] = b["mask"].shape[0]
        extra["max_response_tokens"] = b["mask"].shape[1]
    full, _ = policy_loss(full_new, b["old"], b["adv"], b["mask"], agg=agg)
    full.backward()

    micro_new = b["new"].clone().requires_grad_(True)
    for rows in (slice(0, 3), slice(3, 5), slice(5, 8)):  # 3 uneven micro-batches
        loss, _ = policy_loss(micro_new[rows], b["old"][rows], b["adv"][rows], b["mask"][rows], agg=agg, **extra)
        loss.backward()
    torch.testing.assert_close(micro_new.grad, full_new.grad, rtol=0, atol=1e-6)


def test_per_micro_batch_denominator_is_the_known_bug() -> None:
    # Without total_tokens each micro-batch divides by its own count: the sum differs from the
    # full-batch gradient whenever micro-batches hold different token counts. This guards the test
    # above against passing trivially.
    b = _random_batch(11, batch=8, width=10)
    full_new = b["new"].clone().requires_grad_(True)
    policy_loss(full_new, b["old"], b["adv"], b["mask"])[0].backward()
    micro_new = b["new"].clone().requires_grad_(True)
    for rows in (slice(0, 3), slice(3, 5), slice(5, 8)):
        policy_loss(micro_new[rows], b["old"][rows], b["adv"][rows], b["mask"][rows])[0].backward()
    assert (micro_new.grad - full_new.grad).abs().max() > 1e-3


def test_kl_term_hand_worked() -> None:
    # new = old = 0 so the pg loss is -A = -1 per token. ref - new = ln 2 -> k3 = 2 - ln 2 - 1 = 0.30685.
    # loss = -1 + 0.5 * 0.30685 = -0.84657.
    z = torch.zeros(1, 1)
    loss, m = policy_loss(z, z, torch.ones(1, 1), torch.ones(1, 1, dtype=torch.bool),
                          ref_log_probs=torch.full((1, 1), math.log(2)), kl_beta=0.5)
    k3 = 2 - math.log(2) - 1
    assert abs(loss.item() - (-1 + 0.5 * k3)) < 1e-6
    assert abs(m["kl_ref"].item() - k3) < 1e-6


def test_empty_mask_gives_zero_loss_with_graph() -> None:
    new = torch.randn(2, 3, requires_grad=True)
    loss, m = policy_loss(new, torch.zeros(2, 3), torch.ones(2, 3), torch.zeros(2, 3, dtype=torch.bool))
    assert loss.item() == 0.0 and m["num_tokens"].item() == 0
    loss.backward()
    assert new.grad.abs().sum() == 0


def test_padding_garbage_does_not_leak() -> None:
    # Huge log-ratio at a masked position would overflow exp(); it must not affect the loss.
    new = torch.tensor([[0.0, 1e4]])
    loss, m = policy_loss(new, torch.zeros(1, 2), torch.ones(1, 2), torch.tensor([[True, False]]))
    assert loss.item() == -1.0 and math.isfinite(m["approx_kl"].item())


def test_bad_inputs_name_the_argument() -> None:
    z = torch.zeros(2, 3)
    m = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="advantages has shape"):
        policy_loss(z, z, torch.zeros(2, 4), m)
    with pytest.raises(TypeError, match="mask must be a bool"):
        policy_loss(z, z, z, m.float())
    with pytest.raises(ValueError, match="agg must be one of"):
        policy_loss(z, z, z, m, agg="sum")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="dual_clip_c must be > 1"):
        policy_loss(z, z, z, m, dual_clip_c=0.9)
    with pytest.raises(ValueError, match="needs ref_log_probs"):
        policy_loss(z, z, z, m, kl_beta=0.1)
    with pytest.raises(ValueError, match="total_tokens must be > 0"):
        policy_loss(z, z, z, m, total_tokens=0)
    with pytest.raises(ValueError, match="total_tokens only applies"):
        policy_loss(z, z, z, m, agg="seq-mean-token-mean", total_tokens=3)


def test_tensor_total_tokens_matches_int() -> None:
    # The trainer may all-reduce the token count as a tensor; it must act exactly like the int.
    b = _random_batch(3)
    n = int(b["mask"].sum())
    as_int, _ = policy_loss(b["new"][:3], b["old"][:3], b["adv"][:3], b["mask"][:3], total_tokens=n)
    as_tensor, _ = policy_loss(b["new"][:3], b["old"][:3], b["adv"][:3], b["mask"][:3],
                               total_tokens=torch.tensor(float(n), dtype=torch.float64))
    torch.testing.assert_close(as_int, as_tensor)


def test_the_aggregation_registry_is_what_policy_loss_uses() -> None:
    from dapo_core.losses import AGGREGATIONS, aggregate

    torch.manual_seed(0)
    token_loss = torch.randn(3, 5)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.float32)
    assert list(AGGREGATIONS) == ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
    torch.testing.assert_close(aggregate(token_loss, mask, "token-mean"), (token_loss * mask).sum() / 9)
    per_seq = (token_loss * mask).sum(-1) / mask.sum(-1)
    torch.testing.assert_close(aggregate(token_loss, mask, "seq-mean-token-mean"), per_seq.mean())
    torch.testing.assert_close(aggregate(token_loss, mask, "seq-mean-token-sum-norm", max_response_tokens=8),
                               (token_loss * mask).sum() / (8 * 3))
