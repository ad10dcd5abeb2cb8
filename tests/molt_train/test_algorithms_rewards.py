"""Reward shaping (clip, overlong buffer, stop-properly) and dynamic filtering, by hand."""

import pytest
import torch

from molt_train.algorithms import dynamic_filtering, shape_rewards
from molt_train.config import RewardConfig

# rollout r0 has two segments (rows 0, 1); r1 and r2 one each
ROLLOUTS = ["r0", "r0", "r1", "r2"]


def test_overlong_penalty_uses_the_peak_segment():
    # max_len 10, buffer 4 -> penalty starts above 6 tokens, reaches -factor at 10
    shaping = RewardConfig(overlong_buffer_len=4, overlong_penalty_factor=1.0)
    lengths = torch.tensor([5, 8, 6, 12])
    rewards = torch.ones(4)
    shaped, metrics = shape_rewards(rewards, ROLLOUTS, lengths, torch.zeros(4, dtype=torch.bool), shaping, 10)
    # r0: peak 8 (not the sum 13) -> excess 2 -> -2/4 = -0.5 on both segments
    # r1: 6 -> excess 0 ; r2: 12 -> excess 6, capped at 4 -> -1
    torch.testing.assert_close(shaped, torch.tensor([0.5, 0.5, 1.0, 0.0]))
    assert metrics["overlong_penalty"].item() == pytest.approx((-0.5 + 0 - 1) / 3)


def test_overlong_penalty_factor_scales():
    shaping = RewardConfig(overlong_buffer_len=4, overlong_penalty_factor=0.5)
    shaped, _ = shape_rewards(torch.ones(1), ["r"], torch.tensor([9]), torch.zeros(1, dtype=torch.bool), shaping, 10)
    # excess 3 -> -3/4 * 0.5 = -0.375
    torch.testing.assert_close(shaped, torch.tensor([0.625]))


def test_stop_properly_scales_or_replaces_truncated_rollouts():
    rewards = torch.tensor([2.0, 2.0, 2.0, -1.0])
    truncated = torch.tensor([False, True, False, True])  # r0 truncated in its 2nd segment, r2 truncated
    lengths = torch.zeros(4)
    shaped, metrics = shape_rewards(
        rewards, ROLLOUTS, lengths, truncated, RewardConfig(stop_properly_penalty_coef=0.5), 10
    )
    # coef 0.5 in [0, 1] scales: r0 2 -> 1 (both segments), r1 untouched, r2 -1 -> -0.5
    torch.testing.assert_close(shaped, torch.tensor([1.0, 1.0, 2.0, -0.5]))
    assert metrics["stop_properly_penalty"].item() == pytest.approx((-1.0 + 0.0 + 0.5) / 3)
    shaped, metrics = shape_rewards(
        rewards, ROLLOUTS, lengths, truncated, RewardConfig(stop_properly_penalty_coef=-1.0), 10
    )
    # coef < 0 replaces: r0 -> -1, r2 -> -1 ; changes -3, 0, 0
    torch.testing.assert_close(shaped, torch.tensor([-1.0, -1.0, 2.0, -1.0]))
    assert metrics["stop_properly_penalty"].item() == pytest.approx(-1.0)


def test_clip_range_runs_after_penalties():
    shaping = RewardConfig(clip_range=(-1.0, 1.0), overlong_buffer_len=2)
    rewards = torch.tensor([15.0, -20.0, 0.5])
    lengths = torch.tensor([4, 1, 1])
    # 15 - 1 (excess 2 of 2) = 14 -> 1 ; -20 -> -1 ; 0.5 untouched
    shaped, _ = shape_rewards(rewards, ["a", "b", "c"], lengths, torch.zeros(3, dtype=torch.bool), shaping, 4)
    torch.testing.assert_close(shaped, torch.tensor([1.0, -1.0, 0.5]))
    shaped, metrics = shape_rewards(
        rewards, ["a", "b", "c"], lengths, torch.zeros(3, dtype=torch.bool), RewardConfig(), 4
    )
    torch.testing.assert_close(shaped, torch.tensor([10.0, -10.0, 0.5]))  # default [-10, 10]
    assert metrics == {}


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--reward.overlong_buffer_len", "4", "--reward.stop_properly_penalty_coef", "0.5"], "mutually exclusive"),
        (["--reward.overlong_buffer_len", "1024"], "must be shorter than --data.max_len 1024"),
        (["--reward.stop_properly_penalty_coef", "1.5"], "--reward.stop_properly_penalty_coef must be in"),
        (["--reward.clip_range", "1", "-1"], "--reward.clip_range"),
    ],
)
def test_reward_shaping_config_errors(flags, message, capsys):
    from molt_train.config import parse

    with pytest.raises(SystemExit):
        parse("rl", ["--env", "molt/arith-v1", "--actor.model_name_or_path", "m", "--ckpt.output_dir", "o", *flags])
    assert message in capsys.readouterr().err


# rows: group, rollout, score
ROWS = [
    ("g1", "r1", 1.0),
    ("g1", "r1", 1.0),
    ("g1", "r2", 0.0),  # r1 has 2 segments; mean 0.5 -> keep
    ("g2", "r3", 1.0),
    ("g2", "r3", 1.0),  # 1 rollout (2 segments) -> incomplete
    ("g3", "r5", 1.0),
    ("g3", "r6", 1.0),  # all pass, mean 1 -> drop
    ("g4", "r7", 0.0),
    ("g4", "r8", 0.0),  # all fail, mean 0 -> drop
    ("g5", "r9", None),
    ("g5", "r10", 1.0),  # unscored -> keep
]


def filter_rows(rows=ROWS, **kw):
    groups, rollouts, scores = zip(*rows, strict=True)
    return dynamic_filtering(groups, rollouts, scores, n_samples_per_prompt=2, **kw)


def test_dynamic_filtering_by_hand():
    kept, metrics = filter_rows()
    assert kept == [0, 1, 2, 9, 10]
    assert metrics["dynamic_filtering_pass_rate"] == pytest.approx(2 / 5)
    assert metrics["dynamic_filtering_incomplete_groups"] == 1
    # scored representatives: r1 1, r2 0, r3 1, r5 1, r6 1, r7 0, r8 0, r10 1 -> 5 / 8
    assert metrics["rollout/pre_filter_mean_score"] == pytest.approx(5 / 8)
    assert metrics["rollout/group_all_pass_rate"] == pytest.approx(1 / 5)
    assert metrics["rollout/group_all_fail_rate"] == pytest.approx(1 / 5)


def test_dynamic_filtering_band_is_strict():
    # g1's mean is exactly 0.5: not kept by (0, 0.5); kept by (0, 0.6)
    kept, _ = filter_rows(ROWS[:3], score_range=(0.0, 0.5))
    assert kept == []
    kept, _ = filter_rows(ROWS[:3], score_range=(0.0, 0.6))
    assert kept == [0, 1, 2]


def test_dynamic_filtering_errors():
    with pytest.raises(ValueError, match="n_samples_per_prompt > 1, got 1"):
        dynamic_filtering(["g"], ["r"], [1.0], n_samples_per_prompt=1)
    with pytest.raises(ValueError, match="low < high"):
        filter_rows(score_range=(1.0, 0.0))
