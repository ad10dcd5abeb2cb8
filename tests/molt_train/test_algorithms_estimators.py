"""Advantage estimators against hand-computed values.

Layout used by most tests: 2 prompt groups x 2 rollouts, 3 positions each.
group "a": rollouts r0 (R=1), r1 (R=0); group "b": r2 (R=3), r3 (R=1).
Group means: a = 0.5, b = 2.
"""

import math

import pytest
import torch

from molt_train.algorithms import ESTIMATORS, AdvantageInputs, get_estimator, register_estimator

T, F = True, False
MASK = torch.tensor([[T, T, F], [T, T, T], [F, T, T], [T, F, F]])


def inputs(rewards, mask=MASK, groups=("a", "a", "b", "b"), rollouts=("r0", "r1", "r2", "r3"), **kw):
    return AdvantageInputs(
        rewards=torch.tensor(rewards),
        action_mask=mask,
        group_ids=list(groups),
        rollout_ids=list(rollouts),
        **kw,
    )


def run(name, inp):
    return get_estimator(name)(inp)


def test_dr_grpo_subtracts_group_mean_and_broadcasts_on_action_tokens():
    adv, ret = run("dr_grpo", inputs([1.0, 0.0, 3.0, 1.0]))
    # per rollout: 1-0.5, 0-0.5, 3-2, 1-2
    expected = torch.tensor(
        [
            [0.5, 0.5, 0.0],
            [-0.5, -0.5, -0.5],
            [0.0, 1.0, 1.0],
            [-1.0, 0.0, 0.0],
        ]
    )
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(ret, expected)


def test_grpo_two_per_group_gives_plus_minus_one_over_sqrt2():
    # group a: unbiased var = (0.25 + 0.25) / 1 = 0.5, std = sqrt(0.5); 0.5/sqrt(0.5) = 1/sqrt(2)
    # group b: unbiased var = (1 + 1) / 1 = 2, std = sqrt(2); 1/sqrt(2)
    adv, _ = run("grpo", inputs([1.0, 0.0, 3.0, 1.0]))
    s = 1 / math.sqrt(2)
    expected = torch.tensor([[s, s, 0], [-s, -s, -s], [0, s, s], [-s, 0, 0]])
    torch.testing.assert_close(adv, expected)


def test_grpo_group_of_three_and_singleton():
    mask = torch.ones(4, 1, dtype=torch.bool)
    # group g: R = 0, 1, 2; mean 1, unbiased var (1 + 0 + 1) / 2 = 1 -> A = -1, 0, 1
    # group s (singleton): std undefined -> A = 0
    adv, _ = run("grpo", inputs([0.0, 1.0, 2.0, 5.0], mask, groups="ggg" + "s"))
    torch.testing.assert_close(adv[:, 0], torch.tensor([-1.0, 0.0, 1.0, 0.0]))


def test_grpo_equal_rewards_give_zero_not_nan():
    adv, _ = run("grpo", inputs([1.0, 1.0, 0.0, 0.0]))
    torch.testing.assert_close(adv, torch.zeros(4, 3))


def test_rloo_leave_one_out_baseline_and_singleton():
    # a: 1 - 0 = 1, 0 - 1 = -1 ; b: 3 - 1 = 2, 1 - 3 = -2
    adv, _ = run("rloo", inputs([1.0, 0.0, 3.0, 1.0]))
    expected = torch.tensor([[1.0, 1, 0], [-1, -1, -1], [0, 2, 2], [-2, 0, 0]])
    torch.testing.assert_close(adv, expected)
    mask = torch.ones(4, 1, dtype=torch.bool)
    # g: R = 0, 1, 2 -> 0 - 1.5, 1 - 1, 2 - 0.5 ; singleton s keeps A = R = 5
    adv, _ = run("rloo", inputs([0.0, 1.0, 2.0, 5.0], mask, groups="gggs"))
    torch.testing.assert_close(adv[:, 0], torch.tensor([-1.5, 0.0, 1.5, 5.0]))


def test_reinforce_baseline_whitens_over_all_action_tokens():
    mask = torch.tensor([[T, T, F]] * 4)  # 2 action tokens per row
    adv, ret = run("reinforce_baseline", inputs([1.0, 0.0, 3.0, 1.0], mask))
    # centred per rollout: 0.5, -0.5, 1, -1 (each on 2 tokens)
    # token mean = 0, biased var = (0.25 + 0.25 + 1 + 1) / 4 = 0.625
    a, b = 0.5 / math.sqrt(0.625), 1 / math.sqrt(0.625)  # 0.63246, 1.26491
    expected = torch.tensor([[a, a, 0], [-a, -a, 0], [b, b, 0], [-b, -b, 0]])
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(ret[:, 0], torch.tensor([0.5, -0.5, 1.0, -1.0]))


def test_reinforce_baseline_no_whiten():
    adv, _ = run("reinforce_baseline", inputs([1.0, 0.0, 3.0, 1.0], no_whiten=True))
    torch.testing.assert_close(adv[:, 1], torch.tensor([0.5, -0.5, 1.0, 0.0]))


def test_group_estimators_count_a_segmented_rollout_once():
    # r0 is split into two segments (rows 0 and 1), both stamped R = 1; r1 has R = 0.
    # Per rollout the mean is (1 + 0) / 2 = 0.5 (per row it would be 2/3).
    mask = torch.ones(3, 2, dtype=torch.bool)
    inp = inputs([1.0, 1.0, 0.0], mask, groups="aaa", rollouts=("r0", "r0", "r1"))
    adv, _ = run("dr_grpo", inp)
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.5], [0.5, 0.5], [-0.5, -0.5]]))
    adv, _ = run("grpo", inp)  # two rollouts 1, 0 -> +-1/sqrt(2) on every segment
    s = 1 / math.sqrt(2)
    torch.testing.assert_close(adv, torch.tensor([[s, s], [s, s], [-s, -s]]))


def reinforce_inputs(**extra) -> AdvantageInputs:
    """Two rows with a per-token KL (kl_coef 0.5) and terminal rewards 1 and 0."""
    return AdvantageInputs(
        rewards=torch.tensor([1.0, 0.0]),
        action_mask=torch.tensor([[T, T, F], [F, T, T]]),
        group_ids=["a", "b"],
        rollout_ids=["x", "y"],
        kl=torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.2, 0.2]]),
        kl_coef=0.5,
        **extra,
    )


def test_reinforce_kl_reward_and_terminal_reward_no_whiten():
    inp = reinforce_inputs(no_whiten=True)
    adv, ret = run("reinforce", inp)
    # row 0: r = [-0.05, -0.1 + 1, 0] -> G = [0.85, 0.9, 0]
    # row 1: r = [0 (masked), -0.1, -0.1 + 0] -> G = [-0.2, -0.2, -0.1] -> masked [0, -0.2, -0.1]
    expected = torch.tensor([[0.85, 0.9, 0.0], [0.0, -0.2, -0.1]])
    torch.testing.assert_close(ret, expected)
    torch.testing.assert_close(adv, expected)


def test_reinforce_whitened():
    inp = reinforce_inputs()
    adv, _ = run("reinforce", inp)
    # returns on action tokens: 0.85, 0.9, -0.2, -0.1; mean = 1.45 / 4 = 0.3625
    # deviations 0.4875, 0.5375, -0.5625, -0.4625; biased var = 1.056875 / 4 = 0.26421875
    std = math.sqrt(0.26421875)
    expected = torch.tensor(
        [
            [0.4875 / std, 0.5375 / std, 0.0],
            [0.0, -0.5625 / std, -0.4625 / std],
        ]
    )
    torch.testing.assert_close(adv, expected)


def test_reinforce_gamma_discounts_across_observation_positions():
    # action, observation (masked), action; R = 1 lands on the last action token
    mask = torch.tensor([[T, F, T]])
    inp = AdvantageInputs(
        rewards=torch.tensor([1.0]),
        action_mask=mask,
        group_ids=["a"],
        rollout_ids=["x"],
        gamma=0.5,
        no_whiten=True,
    )
    _, ret = run("reinforce", inp)
    # G = [0.5^2 * 1, masked, 1]
    torch.testing.assert_close(ret, torch.tensor([[0.25, 0.0, 1.0]]))


def test_reinforce_row_without_action_tokens_is_zero():
    mask = torch.tensor([[F, F], [T, T]])
    inp = AdvantageInputs(
        rewards=torch.tensor([7.0, 1.0]),
        action_mask=mask,
        group_ids=["a", "b"],
        rollout_ids=["x", "y"],
        no_whiten=True,
    )
    adv, _ = run("reinforce", inp)
    torch.testing.assert_close(adv, torch.tensor([[0.0, 0.0], [1.0, 1.0]]))


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'.*grpo"):
        get_estimator("ppo")
    mask = torch.ones(2, 1, dtype=torch.bool)
    with pytest.raises(ValueError, match="rollout 'r0' has segments with rewards"):
        run("grpo", inputs([1.0, 0.0], mask, groups="aa", rollouts=("r0", "r0")))
    with pytest.raises(ValueError, match="rollout 'r0' appears in groups 'a' and 'b'"):
        run("grpo", inputs([1.0, 1.0], mask, groups="ab", rollouts=("r0", "r0")))
    with pytest.raises(ValueError, match="one group_id and one rollout_id per row"):
        inputs([1.0, 1.0], mask, groups="a", rollouts=("r0", "r1"))
    with pytest.raises(ValueError, match="gamma must be in"):
        inputs([1.0, 1.0], mask, groups="ab", rollouts=("r0", "r1"), gamma=0.0)


def test_register_estimator_decorator():
    @register_estimator("test_constant")
    def constant(inp):
        return inp.action_mask.float(), inp.action_mask.float()

    try:
        assert get_estimator("test_constant") is constant
        with pytest.raises(ValueError, match="'test_constant' is already registered"):
            register_estimator("test_constant")(constant)
    finally:
        del ESTIMATORS["test_constant"]


KL = torch.full((4, 3), 0.2)  # with kl_coef 0.5: a reward of -0.1 on every action token
KL_TO_GO = torch.tensor(  # sum over the row's action tokens at positions >= t of -0.1 (0 off the mask)
    [
        [-0.2, -0.1, 0.0],
        [-0.3, -0.2, -0.1],
        [0.0, -0.2, -0.1],
        [-0.1, 0.0, 0.0],
    ]
)


@pytest.mark.parametrize("name", ["grpo", "rloo", "dr_grpo", "reinforce_baseline"])
def test_kl_as_a_reward_acts_on_the_group_estimators(name):
    """KL as a reward is the per-token reward -beta*kl_t: its return-to-go is added to the group advantage
    (never silently dropped)."""
    rewards = [1.0, 0.0, 3.0, 1.0]
    plain, _ = run(name, inputs(rewards, no_whiten=True))
    adv, ret = run(name, inputs(rewards, kl=KL, kl_coef=0.5, no_whiten=True))
    torch.testing.assert_close(adv, plain + KL_TO_GO)
    torch.testing.assert_close(ret, plain + KL_TO_GO)


def test_dr_grpo_with_kl_by_hand():
    adv, _ = run("dr_grpo", inputs([1.0, 0.0, 3.0, 1.0], kl=KL, kl_coef=0.5))
    # group advantages 0.5, -0.5, 1, -1 plus the KL return-to-go
    expected = torch.tensor([[0.3, 0.4, 0.0], [-0.8, -0.7, -0.6], [0.0, 0.8, 0.9], [-1.1, 0.0, 0.0]])
    torch.testing.assert_close(adv, expected)


def test_the_group_baseline_ignores_the_kl_and_whitening_follows_it():
    """reinforce_baseline: centre the task rewards by group, add the KL return-to-go, then whiten."""
    rewards = [1.0, 0.0, 3.0, 1.0]
    adv, ret = run("reinforce_baseline", inputs(rewards, kl=KL, kl_coef=0.5))
    plain, _ = run("reinforce_baseline", inputs(rewards, no_whiten=True))
    torch.testing.assert_close(ret, plain + KL_TO_GO)
    mean = ret[MASK].mean()
    std = ret[MASK].var(unbiased=False).sqrt()
    torch.testing.assert_close(adv[MASK], (ret[MASK] - mean) / std)


def test_flash_reinforce_centres_on_the_batch_mean_without_std_or_whitening():
    # one rollout per prompt: four groups of one, rewards 1, 0, 3, 1 -> batch mean 5/4 = 1.25
    inp = inputs([1.0, 0.0, 3.0, 1.0], groups=("a", "b", "c", "d"))
    adv, ret = run("flash_reinforce", inp)
    expected = torch.tensor(
        [
            [-0.25, -0.25, 0.0],
            [-1.25, -1.25, -1.25],
            [0.0, 1.75, 1.75],
            [-0.25, 0.0, 0.0],
        ]
    )
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(ret, expected)
    # whitening is not part of it: no_whiten changes nothing
    torch.testing.assert_close(run("flash_reinforce", inputs([1.0, 0.0, 3.0, 1.0], no_whiten=True))[0], expected)


def test_flash_reinforce_counts_a_segmented_rollout_once_and_adds_the_kl_return_to_go():
    # r0 in two segments (R = 1 on both), r1 R = 0, r2 R = 0: mean over rollouts 1/3 (per row it would be 1/2)
    mask = torch.ones(4, 2, dtype=torch.bool)
    inp = inputs([1.0, 1.0, 0.0, 0.0], mask, groups=("a", "a", "b", "c"), rollouts=("r0", "r0", "r1", "r2"))
    adv, _ = run("flash_reinforce", inp)
    third = 1 / 3
    expected = torch.tensor([[2 * third] * 2, [2 * third] * 2, [-third] * 2, [-third] * 2])
    torch.testing.assert_close(adv, expected)
    adv, _ = run("flash_reinforce", inputs([1.0, 0.0, 3.0, 1.0], groups="abcd", kl=KL, kl_coef=0.5))
    # batch advantages -0.25, -1.25, 1.75, -0.25 plus the KL return-to-go
    torch.testing.assert_close(
        adv, torch.tensor([[-0.45, -0.35, 0.0], [-1.55, -1.45, -1.35], [0.0, 1.55, 1.65], [-0.35, 0.0, 0.0]])
    )
