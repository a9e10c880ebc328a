"""Tests for dapo_core.correction: behaviour-policy weights of the decoupled PPO objective."""

from __future__ import annotations

import math

import pytest
import torch

from dapo_core.correction import (
    behaviour_weights,
    behaviour_weights_reference,
    policy_lags,
)


def _random(seed: int, batch: int = 5, width: int = 7) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    behav = -torch.rand(batch, width, generator=gen) * 3
    # log-ratio spread over [-1.5, 1.5]: weights from e^-1.5 = 0.22 to e^1.5 = 4.5, so cap 2 bites.
    prox = behav + (torch.rand(batch, width, generator=gen) - 0.5) * 3
    lengths = torch.randint(0, width + 1, (batch,), generator=gen)
    lengths[0], lengths[1] = width, 0  # a full row and an empty (overlong-filtered) one
    mask = torch.arange(width)[None, :] < lengths[:, None]
    return prox, behav, mask


def test_hand_worked_weights_and_metrics() -> None:
    # Tokens: log-ratio 0 -> 1; ln 1.5 -> 1.5; ln 3 -> 3 capped to 2; ln 0.5 -> 0.5; last masked.
    prox = torch.tensor([[math.log(1.5) - 1.0, -1.0, math.log(3.0) - 2.0], [math.log(0.5) - 1.0, 9.0, 0.0]])
    behav = torch.tensor([[-1.0, -1.0, -2.0], [-1.0, -1.0, 0.0]])
    mask = torch.tensor([[True, True, True], [True, False, False]])
    w, m = behaviour_weights(prox, behav, mask, cap=2.0)
    expected = torch.tensor([[1.5, 1.0, 2.0], [0.5, 1.0, 1.0]])
    assert torch.allclose(w, expected, atol=1e-6)
    assert m["weight_mean"].item() == pytest.approx((1.5 + 1.0 + 2.0 + 0.5) / 4, abs=1e-6)
    assert m["capped_frac"].item() == pytest.approx(1 / 4)
    assert m["num_tokens"].item() == 4
    assert not w.requires_grad


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("cap", [1.5, 2.0, 100.0])
def test_vectorised_matches_reference(seed: int, cap: float) -> None:
    prox, behav, mask = _random(seed)
    stale = torch.tensor([True, False, True, True, False])
    for samples in (None, stale):
        w, m = behaviour_weights(prox, behav, mask, cap=cap, sample_mask=samples)
        w_ref, m_ref = behaviour_weights_reference(prox, behav, mask, cap=cap, sample_mask=samples)
        assert torch.allclose(w, w_ref, atol=1e-6)
        for key in m_ref:
            assert m[key].item() == pytest.approx(m_ref[key], abs=1e-6), key


def test_weights_are_capped_and_detached() -> None:
    prox, behav, mask = _random(3)
    prox.requires_grad_(True)
    w, m = behaviour_weights(prox, behav, mask, cap=2.0)
    assert not w.requires_grad and all(not v.requires_grad for v in m.values())
    assert float(w.max()) <= 2.0 and float(w.min()) > 0
    assert 0 < m["capped_frac"].item() < 1  # the fixture's spread makes the cap bite on some tokens
    # Nothing above the cap survives: the capped tokens are exactly those with ratio > cap.
    ratio = torch.exp(prox.detach() - behav)
    assert torch.equal(w == 2.0, (ratio >= 2.0) & mask)


def test_weight_is_exactly_one_where_proximal_equals_behaviour() -> None:
    _, behav, mask = _random(4)
    w, m = behaviour_weights(behav.clone(), behav, mask, cap=2.0)
    assert torch.equal(w, torch.ones_like(w))  # bitwise: exp(0) == 1
    assert m["weight_mean"].item() == 1.0 and m["capped_frac"].item() == 0.0


def test_only_selected_samples_are_weighted() -> None:
    prox, behav, mask = _random(5)
    stale = torch.tensor([True, False, False, True, False])
    w, m = behaviour_weights(prox, behav, mask, cap=2.0, sample_mask=stale)
    assert torch.equal(w[~stale], torch.ones_like(w[~stale]))  # fresh samples: exactly 1
    assert not torch.equal(w[0], torch.ones_like(w[0]))
    # The mean is over every loss token, fresh ones counting 1.
    assert m["weight_mean"].item() == pytest.approx(float(w[mask].mean()), abs=1e-6)
    assert m["num_tokens"].item() == int(mask.sum())


def test_empty_mask_gives_nan_metrics_not_an_error() -> None:
    prox, behav, _ = _random(6)
    w, m = behaviour_weights(prox, behav, torch.zeros_like(prox, dtype=torch.bool), cap=2.0)
    assert torch.equal(w, torch.ones_like(w))
    assert math.isnan(m["weight_mean"].item()) and m["num_tokens"].item() == 0


def test_bad_arguments() -> None:
    prox, behav, mask = _random(7)
    with pytest.raises(ValueError, match="cap"):
        behaviour_weights(prox, behav, mask, cap=0.0)
    with pytest.raises(ValueError, match="shape"):
        behaviour_weights(prox, behav[:, :-1], mask, cap=2.0)
    with pytest.raises(ValueError, match="sample_mask"):
        behaviour_weights(prox, behav, mask, cap=2.0, sample_mask=torch.ones(2, dtype=torch.bool))


def test_policy_lags() -> None:
    # Step 5 trains from checkpoint 4: samples of policy 4 are fresh, of policy 2 two steps stale.
    lags = policy_lags(torch.tensor([4, 4, 2, 3]), current_version=4)
    assert lags.tolist() == [0, 0, 2, 1]
    with pytest.raises(ValueError, match="sample 1 .*policy_version 5.*newer"):
        policy_lags(torch.tensor([4, 5]), current_version=4)
