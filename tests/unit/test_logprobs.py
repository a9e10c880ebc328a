"""Chunked token log-probs equal the all-at-once computation, in value and in gradient."""

from __future__ import annotations

import pytest
import torch

from dapo_core.logprobs import chunked_token_log_probs, token_log_probs_full


def _setup(seed: int = 0, B: int = 3, L: int = 11, H: int = 8, V: int = 17):
    g = torch.Generator().manual_seed(seed)
    head = torch.nn.Linear(H, V, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(V, H, generator=g))
    hidden = torch.randn(B, L, H, generator=g, requires_grad=True)
    ids = torch.randint(0, V, (B, L), generator=g)
    return head, hidden, ids


@pytest.mark.parametrize("chunk", [1, 3, 4, 10, 64])
def test_values_and_gradients_match_the_full_computation(chunk: int) -> None:
    head, hidden, ids = _setup()
    weights = torch.randn(ids.shape, generator=torch.Generator().manual_seed(1))
    full = token_log_probs_full(head, hidden, ids)
    (full * weights).sum().backward()
    grad_h, grad_w = hidden.grad.clone(), head.weight.grad.clone()
    hidden.grad, head.weight.grad = None, None

    got, _ = chunked_token_log_probs(head, hidden, ids, chunk_tokens=chunk)
    (got * weights).sum().backward()
    torch.testing.assert_close(got, full, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(hidden.grad, grad_h, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(head.weight.grad, grad_w, rtol=1e-5, atol=1e-5)
    assert torch.all(got[:, 0] == 0)


def test_hand_worked_two_token_vocabulary() -> None:
    # V = 2, identity head: logits = hidden. Position 1 predicted from hidden[0] = (0, ln 3):
    # p = (1/4, 3/4); token 1 -> ln(3/4). Entropy = -(1/4 ln 1/4 + 3/4 ln 3/4).
    hidden = torch.tensor([[[0.0, float(torch.log(torch.tensor(3.0)))], [5.0, 5.0]]])
    ids = torch.tensor([[0, 1]])
    lp, ent = chunked_token_log_probs(lambda h: h, hidden, ids, chunk_tokens=1, with_entropy=True)
    assert lp[0, 1].item() == pytest.approx(float(torch.log(torch.tensor(0.75))), abs=1e-6)
    expected = -(0.25 * torch.log(torch.tensor(0.25)) + 0.75 * torch.log(torch.tensor(0.75)))
    assert ent[0, 1].item() == pytest.approx(float(expected), abs=1e-6)
    assert lp[0, 0].item() == 0.0 and ent[0, 0].item() == 0.0


def test_entropy_matches_softmax_entropy() -> None:
    head, hidden, ids = _setup(seed=3)
    with torch.no_grad():
        _, ent = chunked_token_log_probs(head, hidden, ids, chunk_tokens=4, with_entropy=True)
        p = torch.softmax(head(hidden[:, :-1]), -1)
        expected = -(p * p.log()).sum(-1)
    torch.testing.assert_close(ent[:, 1:], expected, rtol=1e-5, atol=1e-6)


def test_a_fixed_chunk_count_pads_with_empty_head_calls() -> None:
    # ZeRO-3 ranks must call the head equally often whatever their micro-batch length.
    head, hidden, ids = _setup()  # L = 11: 10 positions -> 3 chunks of 4
    calls = []

    def counting_head(h: torch.Tensor) -> torch.Tensor:
        calls.append(h.shape[1])
        return head(h)

    expected, _ = chunked_token_log_probs(head, hidden, ids, chunk_tokens=4)
    got, _ = chunked_token_log_probs(counting_head, hidden, ids, chunk_tokens=4, num_chunks=5)
    got.sum().backward()  # the empty chunks' backward runs too
    torch.testing.assert_close(got, expected)
    assert calls[:5] == [4, 4, 2, 0, 0]  # forward calls (then recomputation in backward)
    with torch.no_grad():
        calls.clear()
        chunked_token_log_probs(counting_head, hidden, ids, chunk_tokens=4, num_chunks=5, with_entropy=True)
    assert calls == [4, 4, 2, 0, 0]  # one call per chunk gives both log-probs and entropy
    with pytest.raises(ValueError, match="num_chunks=2 cannot cover 10 positions"):
        chunked_token_log_probs(head, hidden, ids, chunk_tokens=4, num_chunks=2)


def test_bad_arguments_are_errors() -> None:
    head, hidden, ids = _setup()
    with pytest.raises(ValueError, match="chunk_tokens"):
        chunked_token_log_probs(head, hidden, ids, chunk_tokens=0)
    with pytest.raises(ValueError, match="input_ids"):
        chunked_token_log_probs(head, hidden, ids[:, :-1])
