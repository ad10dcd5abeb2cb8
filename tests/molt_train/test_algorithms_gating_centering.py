"""``is_correction_gating binary_kl`` and score centering (``score_centering_top_k``), by hand."""

import math

import pytest
import torch

from molt_train.algorithms import centering_term, is_correction

T, F = True, False


def k3(u: float) -> float:
    return u - 1 - math.log(u)


def test_binary_kl_gate_on_tokens_keeps_the_exact_ratio_of_kept_tokens():
    # u = 1, 2, 0.5: k3 = 0, 1 - ln2 = 0.307, ln2 - 0.5 = 0.193; bound 0.25 drops the middle token only
    log_u = torch.tensor([[0.0, math.log(2.0), math.log(0.5)]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    weights, metrics = is_correction(
        log_u, torch.zeros(1, 3), mask, level="token", mode="mask", threshold=0.25, gating="binary_kl"
    )
    torch.testing.assert_close(weights, torch.tensor([[1.0, 0.0, 0.5]]))
    assert metrics["is_filter_ratio"].item() == pytest.approx(1 / 3)


def test_binary_kl_gate_sums_the_kl_over_a_sequence_and_averages_it_for_geo():
    # one row u = 2, 0.5: sum k3 = 0.5, mean 0.25; a bound of 0.3 drops it under seq and keeps it under geo
    log_u = torch.tensor([[math.log(2.0), math.log(0.5), 9.0]])
    mask = torch.tensor([[T, T, F]])
    assert k3(2.0) + k3(0.5) == pytest.approx(0.5)
    seq, seq_metrics = is_correction(
        log_u, torch.zeros(1, 3), mask, level="seq", mode="mask", threshold=0.3, gating="binary_kl"
    )
    geo, _ = is_correction(log_u, torch.zeros(1, 3), mask, level="geo", mode="mask", threshold=0.3, gating="binary_kl")
    torch.testing.assert_close(seq, torch.zeros(1, 3))
    torch.testing.assert_close(geo, torch.tensor([[2.0, 0.5, 0.0]]))
    assert seq_metrics["is_seq_kl_mean"].item() == pytest.approx(0.5)
    with pytest.raises(ValueError, match="needs mode 'mask'"):
        is_correction(log_u, torch.zeros(1, 3), mask, level="token", mode="trunc", threshold=0.3, gating="binary_kl")


def expected_score_gradient(p_logits: torch.Tensor, q: torch.Tensor, k: int, **is_kw) -> torch.Tensor:
    """sum_y q_y * d/dlogits (log p_y - C) at one position, the engine reporting its top-k of q."""
    logits = p_logits.clone().requires_grad_(True)
    logp = logits.log_softmax(-1)
    top_q, top_ids = q.log().topk(k)
    c = centering_term(logp[top_ids], top_q, (logp.detach().exp() * logp).sum(), **is_kw)
    objective = (q * logp).sum() - c  # E_{y~q}[log p_y] - C
    (grad,) = torch.autograd.grad(objective, logits)
    return grad


def test_centering_removes_the_drift_when_the_engine_reports_every_token():
    p_logits = torch.tensor([0.3, -1.2, 2.0, 0.1])
    q = torch.tensor([0.1, 0.2, 0.3, 0.4])  # the engine disagrees with the trainer
    logits = p_logits.clone().requires_grad_(True)
    (drift,) = torch.autograd.grad((q * logits.log_softmax(-1)).sum(), logits)
    assert drift.abs().max() > 0.1  # without centering the expected update is not zero
    torch.testing.assert_close(expected_score_gradient(p_logits, q, k=4), torch.zeros(4), atol=1e-6, rtol=0)


def test_centering_tail_spreads_the_rest_of_q_like_p():
    # p = (0.5, 0.3, 0.2); the engine reports its top-1: token 0 with q = 0.6
    logp = torch.tensor([0.5, 0.3, 0.2]).log()
    c = centering_term(logp[:1], torch.tensor([math.log(0.6)]), (logp.exp() * logp).sum())
    tail = 0.3 * math.log(0.3) + 0.2 * math.log(0.2)
    assert c.item() == pytest.approx(0.6 * math.log(0.5) + 0.4 / 0.5 * tail)
    # TIS (level token, trunc at 1): f(r0) = min(0.5/0.6, 1); the tail's r = 0.5/0.4 = 1.25 -> 1
    c = centering_term(
        logp[:1], torch.tensor([math.log(0.6)]), (logp.exp() * logp).sum(), level="token", mode="trunc", threshold=1.0
    )
    assert c.item() == pytest.approx(0.6 * (0.5 / 0.6) * math.log(0.5) + 0.8 * 1.0 * tail)
    # IcePop (mask, band [0.9, 1.1]): r0 = 0.833 is outside -> 0; the tail's 1.25 too -> C = 0
    c = centering_term(
        logp[:1],
        torch.tensor([math.log(0.6)]),
        (logp.exp() * logp).sum(),
        level="token",
        mode="mask",
        threshold=(0.9, 1.1),
    )
    assert c.item() == pytest.approx(0.0)


def test_centering_with_top_k_is_exact_when_q_tail_is_proportional_to_p():
    p_logits = torch.tensor([0.5, 0.3, 0.2]).log()
    q = torch.tensor([0.6, 0.4 * 0.6, 0.4 * 0.4])  # q's tail (0.4) spread like p's tail
    torch.testing.assert_close(expected_score_gradient(p_logits, q, k=1), torch.zeros(3), atol=1e-6, rtol=0)


def test_centering_refuses_a_sequence_gate():
    logp = torch.tensor([0.5, 0.5]).log()
    with pytest.raises(ValueError, match="token-level IS weight only"):
        centering_term(logp[:1], logp[:1], (logp.exp() * logp).sum(), level="geo")


def test_logprob_model_returns_the_candidates_log_probs(tiny_model):
    from molt_train.logprob_model import LogProbModel

    model = LogProbModel(tiny_model, chunk_size=5)
    ids = torch.randint(5, 200, (2, 9), generator=torch.Generator().manual_seed(0))
    attn = torch.ones_like(ids)
    cand = torch.randint(0, 300, (2, 8, 3), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = model(ids, attn, 1.0, candidates=cand)
        plain = model(ids, attn, 1.0)
        full = tiny_model(input_ids=ids, attention_mask=attn).logits[:, :-1].float().log_softmax(-1)
    assert out.shape == (2, 8, 5)
    torch.testing.assert_close(out[..., 0], plain)
    torch.testing.assert_close(out[..., 1], (full.exp() * full).sum(-1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[..., 2:], full.gather(-1, cand), atol=1e-5, rtol=1e-5)


def test_hf_engine_records_the_top_k_of_every_generated_token(tiny_model, tiny_tokenizer):
    import asyncio

    from molt_envs import SamplingParams
    from molt_train.engines.hf import HFEngine

    engine = HFEngine(tiny_model, tiny_tokenizer, top_logprobs=4)
    prompt = tiny_tokenizer("1+1=")["input_ids"]
    gen = asyncio.run(engine.generate(prompt, SamplingParams(max_tokens=5, seed=3)))
    ids, logq = engine.pop_top_logprobs(prompt, gen.token_ids)
    assert ids.shape == logq.shape == (len(gen.token_ids), 4)
    assert (logq[:, :-1] >= logq[:, 1:]).all()  # sorted, highest first
    assert all(logq[t, 0] >= gen.log_probs[t] - 1e-6 for t in range(len(gen.token_ids)))
    with torch.no_grad():  # the recorded top-1 is the model's own most likely next token
        first = tiny_model(input_ids=torch.tensor([prompt])).logits[0, -1].log_softmax(-1)
    assert int(ids[0, 0]) == int(first.argmax()) and float(logq[0, 0]) == pytest.approx(float(first.max()), abs=1e-5)
    assert engine.pop_top_logprobs(prompt, gen.token_ids) is None  # popped once
    with pytest.raises(ValueError, match="score_centering_top_k"):
        HFEngine(tiny_model, tiny_tokenizer, top_logprobs=10**6)
