"""``merge_parts``: one rollout batch from the parts of several rollout workers (``--rollout.num_workers``)."""

from __future__ import annotations

from molt_train.rl_batch import merge_parts


def part(trajs: list[str], envs: list[str], dropped: dict[str, int], per_env: dict, **extra) -> dict:
    return {
        "step": 3,
        "trajectories": trajs,
        "trajectory_envs": envs,
        "dropped": dropped,
        "num_rollouts": len(trajs) + sum(dropped.values()),
        "per_env": per_env,
        "start": extra.pop("start", 10.0),
        "end": extra.pop("end", 11.0),
        "generated_tokens": 5 * len(trajs),
        **extra,
    }


def test_parts_merge_in_worker_order_with_counts_summed():
    a = part(
        ["t0", "t1"],
        ["x", "y"],
        {"timeout": 1},
        {"x": {"num_rollouts": 2, "dropped": {"timeout": 1}}, "y": {"num_rollouts": 1, "dropped": {}}},
        data_state={"positions": {"x": 4}},
        judge={"calls": 2},
        counters={"sandbox/retries": 1, "session/replays": 0},
        start=9.0,
    )
    lost = part(
        [], [], {"rollout_worker_lost": 2}, {"y": {"num_rollouts": 2, "dropped": {"rollout_worker_lost": 2}}}, end=14.0
    )
    b = part(
        ["t2"],
        ["x"],
        {},
        {"x": {"num_rollouts": 1, "dropped": {}}},
        data_state={"positions": {"x": 4}},
        judge={"calls": 1},
        counters={"sandbox/retries": 2, "session/replays": 3},
    )
    batch = merge_parts([a, lost, b])
    assert batch["trajectories"] == ["t0", "t1", "t2"] and batch["trajectory_envs"] == ["x", "y", "x"]
    assert batch["dropped"] == {"timeout": 1, "rollout_worker_lost": 2}
    assert batch["num_rollouts"] == 3 + 2 + 1
    assert batch["per_env"] == {
        "x": {"num_rollouts": 3, "dropped": {"timeout": 1}},
        "y": {"num_rollouts": 3, "dropped": {"rollout_worker_lost": 2}},
    }
    assert (batch["start"], batch["end"]) == (9.0, 14.0)
    assert batch["generated_tokens"] == 15 and batch["judge"] == {"calls": 3}
    assert batch["counters"] == {"sandbox/retries": 3, "session/replays": 3}  # the lost part had none
    assert batch["data_state"] == {"positions": {"x": 4}}


def test_a_batch_whose_every_part_was_lost_has_no_data_state():
    lost = part([], [], {"rollout_worker_lost": 4}, {})
    batch = merge_parts([lost])
    assert "data_state" not in batch and "judge" not in batch
    assert batch["dropped"] == {"rollout_worker_lost": 4} and batch["trajectories"] == []
