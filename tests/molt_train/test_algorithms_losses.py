"""Policy loss, loss aggregation, KL estimators and the KL loss, by hand."""

import math

import pytest
import torch

from molt_train.algorithms import (
    aggregate,
    approx_kl,
    get_policy_loss,
    kl_loss,
    ppo_loss,
    unit_token_counts,
)

T, F = True, False


def ppo_case(ratios, advantages, **kw):
    logp = torch.tensor([[math.log(r) for r in ratios]], requires_grad=True)
    mask = torch.ones(1, len(ratios), dtype=torch.bool)
    loss, metrics = ppo_loss(logp, torch.zeros(1, len(ratios)), torch.tensor([advantages]), mask, **kw)
    return logp, loss, metrics


# --- ppo ----------------------------------------------------------------------------------------


def test_ppo_symmetric_clip_four_quadrants():
    # eps 0.2: band [0.8, 1.2]
    # A=+1, rho=1.5: min(1.5, 1.2) = 1.2 (clipped)     -> loss -1.2
    # A=+1, rho=0.5: min(0.5, 0.8) = 0.5               -> loss -0.5
    # A=-1, rho=1.5: min(-1.5, -1.2) = -1.5            -> loss  1.5
    # A=-1, rho=0.5: min(-0.5, -0.8) = -0.8 (clipped)  -> loss  0.8
    logp, loss, metrics = ppo_case([1.5, 0.5, 1.5, 0.5], [1.0, 1.0, -1.0, -1.0])
    torch.testing.assert_close(loss, torch.tensor([[-1.2, -0.5, 1.5, 0.8]]))
    assert metrics["clip_ratio"].item() == pytest.approx(0.5)
    # ppo_kl = mean(logp_old - logp) = -(ln1.5 + ln0.5 + ln1.5 + ln0.5) / 4
    assert metrics["ppo_kl"].item() == pytest.approx(-(2 * math.log(1.5) + 2 * math.log(0.5)) / 4)
    # d(-rho*A)/d logp = -rho*A on unclipped tokens, 0 where the clipped branch is taken
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -0.5, 1.5, 0.0]]))


def test_ppo_asymmetric_clip():
    # eps_low 0.2, eps_high 0.28: band [0.8, 1.28]
    _, loss, _ = ppo_case([1.5, 0.5], [1.0, -1.0], eps_low=0.2, eps_high=0.28)
    torch.testing.assert_close(loss, torch.tensor([[-1.28, 0.8]]))


def test_ppo_dual_clip_bounds_negative_advantage():
    # c = 3, A = -1: rho=5: min(-5, -1.2) = -5, c*A = -3 > -5 -> surrogate -3 -> loss 3
    #               rho=1.5: min = -1.5 > -3 -> unchanged, loss 1.5
    # A = +1, rho=5: dual clip does not apply -> loss -1.2
    _, loss, metrics = ppo_case([5.0, 1.5, 5.0], [-1.0, -1.0, 1.0], dual_clip=3.0)
    torch.testing.assert_close(loss, torch.tensor([[3.0, 1.5, -1.2]]))
    assert metrics["dual_clip_ratio"].item() == pytest.approx(1 / 3)
    _, loss, _ = ppo_case([5.0], [-1.0])
    torch.testing.assert_close(loss, torch.tensor([[5.0]]))  # without dual clip


def test_ppo_log_ratio_clamped_to_30_and_garbage_outside_mask_is_harmless():
    logp = torch.tensor([[100.0, float("nan"), 0.0]], requires_grad=True)
    logp_old = torch.tensor([[0.0, 0.0, float("-inf")]])
    advantages = torch.tensor([[-1.0, float("nan"), float("nan")]])
    mask = torch.tensor([[T, F, F]])
    loss, _ = ppo_loss(logp, logp_old, advantages, mask)
    # rho = exp(30); A = -1: min(-e^30, -1.2) = -e^30 -> loss e^30; masked tokens 0
    torch.testing.assert_close(loss, torch.tensor([[math.exp(30.0), 0.0, 0.0]]))
    loss.sum().backward()
    assert torch.isfinite(logp.grad).all()
    assert logp.grad[0, 1] == 0 and logp.grad[0, 2] == 0


def test_policy_loss_registry():
    assert get_policy_loss("ppo") is ppo_loss
    with pytest.raises(ValueError, match="unknown policy loss 'grpo'.*cispo.*gspo.*ppo"):
        get_policy_loss("grpo")
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        ppo_case([1.0], [1.0], dual_clip=0.5)


# --- aggregation --------------------------------------------------------------------------------
# rows: [1, 2, x] (2 tokens), [3, 3, 3] (3 tokens), [4, x, x] (1 token); x = garbage outside the mask
X = float("nan")
LOSS = torch.tensor([[1.0, 2.0, X], [3.0, 3.0, 3.0], [4.0, X, X]])
MASK = torch.tensor([[T, T, F], [T, T, T], [T, F, F]])
GROUPS = ["p", "p", "q"]


def test_token_mean_local_and_global_denominator():
    # (1 + 2 + 3 + 3 + 3 + 4) = 16 over 6 tokens; with the window's 12 tokens: 16 / 12
    assert aggregate(LOSS, MASK, "token-mean").item() == pytest.approx(16 / 6)
    assert aggregate(LOSS, MASK, "token-mean", num_tokens=12).item() == pytest.approx(16 / 12)
    # two micro-batches with the global denominator sum to the full-batch value
    mb1 = aggregate(LOSS[:1], MASK[:1], num_tokens=6)
    mb2 = aggregate(LOSS[1:], MASK[1:], num_tokens=6)
    assert (mb1 + mb2).item() == pytest.approx(16 / 6)


def test_seq_mean_token_mean():
    # row means 1.5, 3, 4 -> (1.5 + 3 + 4) / 3
    assert aggregate(LOSS, MASK, "seq-mean-token-mean").item() == pytest.approx(8.5 / 3)
    assert aggregate(LOSS, MASK, "seq-mean-token-mean", num_units=4).item() == pytest.approx(8.5 / 4)
    # rows 0 and 1 are two segments of rollout r0: (1+2+3+3+3)/5 = 2.4, r2: 4 -> (2.4 + 4) / 2
    value = aggregate(LOSS, MASK, "seq-mean-token-mean", unit_ids=["r0", "r0", "r2"])
    assert value.item() == pytest.approx(3.2)


def test_prompt_mean_token_mean_and_split_window():
    # prompt p: rows 0, 1 -> 12 / 5 = 2.4 ; prompt q: 4 / 1 = 4 ; mean over prompts 3.2
    full = aggregate(LOSS, MASK, "prompt-mean-token-mean", unit_ids=GROUPS)
    assert full.item() == pytest.approx(3.2)
    # window split into micro-batches [row 0] and [rows 1, 2]: window counts {p: 5, q: 1}, 2 prompts
    counts = unit_token_counts(MASK[:1], GROUPS[:1])
    for unit, n in unit_token_counts(MASK[1:], GROUPS[1:]).items():
        counts[unit] = counts.get(unit, 0) + n
    assert counts == {"p": 5, "q": 1}
    mb1 = aggregate(LOSS[:1], MASK[:1], "prompt-mean-token-mean", unit_ids=GROUPS[:1], unit_tokens=counts)
    mb2 = aggregate(LOSS[1:], MASK[1:], "prompt-mean-token-mean", unit_ids=GROUPS[1:], unit_tokens=counts)
    # mb1: 3 / 5 / 2 = 0.3 ; mb2: 9 / 5 / 2 + 4 / 1 / 2 = 2.9
    assert mb1.item() == pytest.approx(0.3)
    assert mb2.item() == pytest.approx(2.9)


def test_aggregate_empty_mask_is_zero_and_keeps_graph():
    loss = torch.ones(2, 2, requires_grad=True)
    for mode, kw in [
        ("token-mean", {}),
        ("seq-mean-token-mean", {}),
        ("prompt-mean-token-mean", {"unit_ids": ["p", "q"]}),
    ]:
        value = aggregate(loss, torch.zeros(2, 2, dtype=torch.bool), mode, **kw)
        assert value.item() == 0.0 and value.requires_grad


def test_aggregate_errors():
    with pytest.raises(ValueError, match="unknown loss_agg_mode 'seq-mean-token-sum'"):
        aggregate(LOSS, MASK, "seq-mean-token-sum")
    with pytest.raises(ValueError, match="token-mean takes num_tokens only"):
        aggregate(LOSS, MASK, "token-mean", unit_ids=GROUPS)
    with pytest.raises(ValueError, match="prompt-mean-token-mean needs unit_ids"):
        aggregate(LOSS, MASK, "prompt-mean-token-mean")
    with pytest.raises(ValueError, match="no count for unit 'q'"):
        aggregate(LOSS, MASK, "prompt-mean-token-mean", unit_ids=GROUPS, unit_tokens={"p": 5})
    with pytest.raises(ValueError, match="takes unit_ids/unit_tokens/num_units, not num_tokens"):
        aggregate(LOSS, MASK, "seq-mean-token-mean", num_tokens=3)


# --- KL -----------------------------------------------------------------------------------------


def test_kl_estimators_by_hand():
    logp = torch.tensor([0.0, math.log(2.0), -1.0])
    ref = torch.zeros(3)
    # delta = 0, ln2, -1
    torch.testing.assert_close(approx_kl(logp, ref, "k1"), torch.tensor([0.0, math.log(2.0), -1.0]))
    # delta^2 / 2
    torch.testing.assert_close(approx_kl(logp, ref, "k2"), torch.tensor([0.0, math.log(2.0) ** 2 / 2, 0.5]))
    # exp(-delta) - 1 + delta: 0 ; 0.5 - 1 + ln2 ; e - 1 - 1
    expected_k3 = torch.tensor([0.0, 0.5 - 1 + math.log(2.0), math.e - 2])
    torch.testing.assert_close(approx_kl(logp, ref, "k3"), expected_k3)


def test_kl_sanitises_nan_inf_and_clamps():
    logp = torch.tensor([float("nan"), float("inf"), float("-inf")])
    ref = torch.zeros(3)
    # delta -> 0, 30, -30
    torch.testing.assert_close(approx_kl(logp, ref, "k1"), torch.tensor([0.0, 30.0, -30.0]))
    # k2: 0, 450 -> 10, 450 -> 10 ; k3: 0, e^-30 + 29 -> 10, e^30 - 31 -> 10
    torch.testing.assert_close(approx_kl(logp, ref, "k2"), torch.tensor([0.0, 10.0, 10.0]))
    torch.testing.assert_close(approx_kl(logp, ref, "k3"), torch.tensor([0.0, 10.0, 10.0]))
    big = torch.tensor([-200.0], requires_grad=True)  # exp(200) would overflow fp32
    approx_kl(big, torch.zeros(1), "k3").sum().backward()
    assert torch.isfinite(big.grad).all()
    with pytest.raises(ValueError, match="unknown KL estimator 'k4'"):
        approx_kl(logp, ref, "k4")


def test_kl_loss_is_global_token_mean():
    logp = torch.tensor([[math.log(2.0), -1.0, 5.0]])
    mask = torch.tensor([[T, T, F]])
    # k3 on valid tokens: 0.5 - 1 + ln2 and e - 2 ; the masked 5.0 is ignored
    total = (0.5 - 1 + math.log(2.0)) + (math.e - 2)
    assert kl_loss(logp, torch.zeros(1, 3), mask).item() == pytest.approx(total / 2)
    value = kl_loss(logp, torch.zeros(1, 3), mask, estimator="k1", num_tokens=4)
    assert value.item() == pytest.approx((math.log(2.0) - 1) / 4)
