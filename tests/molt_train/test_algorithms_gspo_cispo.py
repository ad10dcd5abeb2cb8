"""The gspo and cispo policy losses, by hand (values and gradients)."""

import math

import pytest
import torch

from molt_train.algorithms import get_policy_loss

T, F = True, False


def test_gspo_uses_one_ratio_per_sequence_and_keeps_each_tokens_gradient():
    # log pi - log pi_old per token; row 2's second position is not an action (garbage there must not count)
    log_ratio = torch.tensor([[math.log(1.5), math.log(1.5)], [math.log(2.0), 0.0], [math.log(0.9), 7.0]])
    mask = torch.tensor([[T, T], [T, T], [T, F]])
    logp = torch.full((3, 2), -1.0, requires_grad=True)
    advantages = torch.tensor([[1.0, 1.0], [-1.0, -1.0], [1.0, 1.0]])
    loss, metrics = get_policy_loss("gspo")(
        logp, logp.detach() - log_ratio, advantages, mask, eps_low=0.2, eps_high=0.2
    )
    # row 0: s = exp(mean(ln1.5, ln1.5)) = 1.5, A=+1: min(1.5, 1.2) = 1.2 -> loss -1.2, clipped (no gradient)
    # row 1: s = exp(ln2 / 2) = sqrt2, A=-1: min(-sqrt2, -1.2) = -sqrt2 -> loss +sqrt2, d/dlogp_t = -A*s = sqrt2
    # row 2: s = exp(ln0.9) = 0.9 (the masked 7.0 is ignored), A=+1: inside [0.8, 1.2] -> loss -0.9, grad -0.9
    r2 = math.sqrt(2)
    torch.testing.assert_close(loss, torch.tensor([[-1.2, -1.2], [r2, r2], [-0.9, 0.0]]))
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, 0.0], [r2, r2], [-0.9, 0.0]]))
    assert metrics["clip_ratio"].item() == pytest.approx(2 / 5)  # row 0's two tokens of five action tokens


def test_gspo_refuses_dual_clip():
    with pytest.raises(ValueError, match="gspo has no dual clip"):
        get_policy_loss("gspo")(
            torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1).bool(), dual_clip=3.0
        )


def test_cispo_is_a_clipped_stop_gradient_is_weight_times_the_score():
    # ratios 1.5, 0.5, 1.5 with ceiling 1.2: weights sg(min(rho, 1.2)) = 1.2, 0.5, 1.2
    logp = torch.tensor([[math.log(0.3), math.log(0.2), math.log(0.6)]], requires_grad=True)
    old = logp.detach() - torch.tensor([[math.log(1.5), math.log(0.5), math.log(1.5)]])
    advantages = torch.tensor([[1.0, 1.0, -1.0]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    loss, metrics = get_policy_loss("cispo")(logp, old, advantages, mask, eps_low=0.2, eps_high=1.2)
    # loss_t = -w_t * A_t * log pi_t
    expected = [-1.2 * math.log(0.3), -0.5 * math.log(0.2), 1.2 * math.log(0.6)]
    torch.testing.assert_close(loss, torch.tensor([expected]))
    loss.sum().backward()
    # no token loses its gradient to the clip (unlike ppo): d/dlogp = -w * A
    torch.testing.assert_close(logp.grad, torch.tensor([[-1.2, -0.5, 1.2]]))
    assert metrics["clip_ratio"].item() == pytest.approx(2 / 3)


def test_cispo_refuses_a_ceiling_below_one():
    with pytest.raises(ValueError, match="absolute ceiling"):
        get_policy_loss("cispo")(
            torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1).bool(), eps_high=0.2
        )
