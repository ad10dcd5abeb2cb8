"""GAE (``--algo.advantage.estimator gae``) and the clipped value loss, by hand."""

import pytest
import torch

from molt_train.algorithms import AdvantageInputs, get_estimator, value_loss

T, F = True, False


def gae_inputs(mask, values, reward=1.0, lam=0.5, **kw):
    mask = torch.tensor([mask])
    return AdvantageInputs(
        torch.tensor([reward]), mask, ["g"], ["r"], values=torch.tensor([values]), lam=lam, no_whiten=True, **kw
    )


def test_gae_by_hand():
    # three action tokens, R = 1 on the last, V = (0.5, 0.2, 0.4), gamma 1, lambda 0.5:
    # t=2: delta = 1 + 0 - 0.4 = 0.6                     A2 = 0.6
    # t=1: delta = 0 + 0.4 - 0.2 = 0.2                   A1 = 0.2 + 0.5 * 0.6 = 0.5
    # t=0: delta = 0 + 0.2 - 0.5 = -0.3                  A0 = -0.3 + 0.5 * 0.5 = -0.05
    adv, returns = get_estimator("gae")(gae_inputs([T, T, T], [0.5, 0.2, 0.4]))
    torch.testing.assert_close(adv, torch.tensor([[-0.05, 0.5, 0.6]]))
    torch.testing.assert_close(returns, torch.tensor([[0.45, 0.7, 1.0]]))  # A + V


def test_gae_is_transparent_across_observation_tokens_and_discounts_per_action():
    # an observation token (V there is garbage) between two actions: it neither bootstraps nor breaks the chain
    # gamma 0.9, lambda 1: t=2: A = 1 - 0.4 = 0.6; t=0: delta = 0.9 * 0.4 - 0.5 = -0.14, A = -0.14 + 0.9 * 0.6
    adv, returns = get_estimator("gae")(gae_inputs([T, F, T], [0.5, 99.0, 0.4], lam=1.0, gamma=0.9))
    torch.testing.assert_close(adv, torch.tensor([[-0.14 + 0.54, 0.0, 0.6]]))
    torch.testing.assert_close(returns, torch.tensor([[0.9, 0.0, 1.0]]))  # lambda 1: the discounted return


def test_gae_whitens_the_advantages_and_needs_values():
    inputs = gae_inputs([T, T, T], [0.5, 0.2, 0.4])
    adv, _ = get_estimator("gae")(AdvantageInputs(**{**inputs.__dict__, "no_whiten": False}))
    assert adv.mean().item() == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ValueError, match="critic's values"):
        get_estimator("gae")(AdvantageInputs(torch.ones(1), torch.ones(1, 2, dtype=torch.bool), ["g"], ["r"]))


def test_clipped_value_loss_by_hand():
    # R = 1, V_old = 0.5, clip 0.2:
    #   V = 0.9: plain (0.1)^2 = 0.01; clipped V_old + 0.2 = 0.7 -> (0.3)^2 = 0.09; max = 0.09 (clipped branch)
    #   V = 0.6: plain 0.16; clipped 0.6 -> 0.16; max 0.16
    values = torch.tensor([[0.9, 0.6]], requires_grad=True)
    loss, metrics = value_loss(values, torch.tensor([[0.5, 0.5]]), torch.ones(1, 2), torch.ones(1, 2).bool())
    assert loss.item() == pytest.approx(0.5 * (0.09 + 0.16) / 2)
    assert metrics["critic/clip_frac"].item() == pytest.approx(0.5)
    loss.backward()
    # the clipped branch has no gradient through V; the other: d/dV 0.5 * (V - R)^2 / 2 tokens = (0.6 - 1) / 2
    torch.testing.assert_close(values.grad, torch.tensor([[0.0, -0.2]]))
    plain, _ = value_loss(values, torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2).bool(), value_clip=None)
    assert plain.item() == pytest.approx(0.5 * (0.01 + 0.16) / 2)
