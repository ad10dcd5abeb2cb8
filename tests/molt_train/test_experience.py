"""Trajectories -> tensors on the next-token axis, drop reasons, micro-batch plans, SFT assistant masks."""

from __future__ import annotations

import torch

from molt_envs import Trajectory
from molt_train.data import encode_sft
from molt_train.experience import as_trajectories, drop_reason, make_experience, micro_batch, plan_micro_batches


def multi_turn() -> Trajectory:
    t = Trajectory(reward=1.0, group_id="g", rollout_id="r")
    t.append_observation([10, 11, 12])  # prompt
    t.append_action([20, 21], [-0.5, -0.25])
    t.append_observation([30])  # tool output
    t.append_action([40], [-0.125])
    return t


def test_action_mask_and_rollout_logprobs_sit_on_the_next_token_axis():
    short = Trajectory(reward=0.0, group_id="g", rollout_id="s")
    short.append_observation([1, 2])
    short.append_action([3], [-1.0])
    exp = make_experience([multi_turn(), short], max_len=64, pad_id=0)
    assert exp.input_ids.tolist() == [[10, 11, 12, 20, 21, 30, 40], [1, 2, 3, 0, 0, 0, 0]]
    # position t predicts token t+1: tokens 20, 21 (idx 3, 4) and 40 (idx 6) are actions
    assert exp.action_mask.tolist()[0] == [False, False, True, True, False, True]
    assert exp.rollout_logp[0].tolist() == [0.0, 0.0, -0.5, -0.25, 0.0, -0.125]
    assert exp.action_mask.tolist()[1] == [False, True, False, False, False, False]
    assert exp.lengths.tolist() == [7, 3]
    assert exp.attention_mask[1].tolist() == [1, 1, 1, 0, 0, 0, 0]


def test_max_len_cuts_rows_and_their_masks():
    exp = make_experience([multi_turn()], max_len=5, pad_id=0)
    assert exp.input_ids.shape == (1, 5)
    assert exp.action_mask.tolist() == [[False, False, True, True]]


def test_drop_reasons():
    failed = multi_turn()
    failed.failure = "step: RuntimeError: boom"
    assert drop_reason(failed, 64) == "failure_step"
    prompt_only = Trajectory()
    prompt_only.append_observation([1, 2])
    assert drop_reason(prompt_only, 64) == "no_action_tokens"
    assert drop_reason(Trajectory(), 64) == "no_tokens"
    assert drop_reason(multi_turn(), 2) == "no_action_tokens"  # every action lies beyond max_len
    assert drop_reason(multi_turn(), 64) is None


def test_runner_results_may_be_segment_lists():
    a, b = multi_turn(), multi_turn()
    assert as_trajectories(a) == [a]
    assert as_trajectories([a, b]) == [a, b]


def test_micro_batch_plan_respects_the_token_budget_and_gives_every_worker_the_same_count():
    lengths = [50, 10, 10, 10, 40, 30, 5]
    plan = plan_micro_batches(lengths, num_workers=2, max_rows=4, max_tokens=60)
    assert len(plan[0]) == len(plan[1])
    seen = sorted(i for worker in plan for micro in worker for i in micro)
    assert seen == list(range(len(lengths)))
    for worker in plan:
        for micro in worker:
            if micro:
                assert len(micro) * max(lengths[i] for i in micro) <= 60 or len(micro) == 1
                assert len(micro) <= 4


def test_empty_micro_batch_is_a_zero_loss_pad():
    exp = make_experience([multi_turn()], max_len=64, pad_id=0)
    pad = micro_batch(exp, [], pad_id=0)
    assert not pad["action_mask"].any()
    real = micro_batch(exp, [0], pad_id=0)
    assert torch.equal(real["input_ids"], exp.input_ids)


def test_sft_mask_covers_the_assistant_reply_through_its_end_token(tiny_tokenizer):
    ids, mask, mm = encode_sft(tiny_tokenizer, [{"role": "user", "content": "12+30="}], "42", max_len=128)
    assert mm is None
    reply = [i for i, m in zip(ids, mask, strict=True) if m]
    assert tiny_tokenizer.decode(reply) == "42<|im_end|>"
    prompt = tiny_tokenizer.apply_chat_template(
        [{"role": "user", "content": "12+30="}], add_generation_prompt=True, tokenize=False
    )
    assert tiny_tokenizer.decode(ids[: mask.index(True)]) == prompt


def test_lr_schedule_warms_up_then_decays_to_the_floor():
    from molt_train.config import ActorConfig
    from molt_train.policy_worker import lr_factor

    cosine = lr_factor(ActorConfig(lr_warmup_ratio=0.2, lr_scheduler="cosine", min_lr_ratio=0.1), total_steps=10)
    assert [round(cosine(s), 3) for s in (0, 1, 2, 6, 10, 50)] == [0.5, 1.0, 1.0, 0.55, 0.1, 0.1]
    constant = lr_factor(ActorConfig(), total_steps=10)
    assert constant(0) == constant(9) == 1.0


def test_prepare_shapes_rewards_filters_groups_and_estimates_advantages():
    from molt_train.config import parse
    from molt_train.rl_trainer import RLTrainer

    cfg = parse(
        "rl",
        [
            "--env",
            "molt/arith-v1",
            "--actor.model_name_or_path",
            "m",
            "--ckpt.output_dir",
            "o",
            "--algo.advantage.estimator",
            "grpo",
            "--rollout.n_samples_per_prompt",
            "2",
            "--algo.dynamic_filtering_enable",
            "--reward.stop_properly_penalty_coef",
            "-1",
        ],
    )
    trainer = object.__new__(RLTrainer)  # prepare() is pure tensor work when no extra log-probs are needed
    trainer.cfg, trainer.steps_per_batch, trainer.reference, trainer.critic = cfg, 1, None, None
    trajs = []
    for group, rewards, truncated in (("solved", (1.0, 1.0), (False, False)), ("mixed", (1.0, 0.0), (False, True))):
        for k, (reward, cut) in enumerate(zip(rewards, truncated, strict=True)):
            t = Trajectory(reward=reward, score=reward, truncated=cut, group_id=group, rollout_id=f"{group}{k}")
            t.append_observation([1, 2])
            t.append_action([3, 4], [-0.1, -0.2])
            trajs.append(t)
    exp, metrics = trainer.prepare(make_experience(trajs, 64, 0))
    assert exp.group_ids == ["mixed", "mixed"]  # the all-correct group is filtered out
    assert exp.rewards.tolist() == [1.0, -1.0]  # the truncated rollout's reward is replaced by the coefficient
    assert metrics["stop_properly_penalty"] == -0.25 and metrics["dynamic_filtering_pass_rate"] == 0.5
    assert exp.advantages[0, 2] > 0 > exp.advantages[1, 2]


def test_the_seats_of_a_game_are_grouped_per_seat_and_segments_stay_in_their_prompts_group():
    from molt_train.experience import estimator_group

    x, o = Trajectory(seat="player_1", reward=1.0), Trajectory(seat="player_2", reward=-1.0)
    segment = Trajectory(rollout_id="r0", reward=0.5)
    assert [estimator_group(t, "7:3") for t in (x, o, segment)] == ["7:3/player_1", "7:3/player_2", "7:3"]
    assert x.rollout_id != o.rollout_id


def test_a_sandbox_failure_is_its_own_drop_reason():
    """What the runners record when the sandbox itself failed (tests/molt_envs/test_tool_infra_error.py) is counted
    as ``rollout/dropped/failure_sandbox``, apart from the env's own failures."""
    from molt_train.experience import drop_reason

    t = Trajectory(reward=0.0, failure="sandbox: ToolInfraError: the local sandbox failed: channel closed")
    t.append_observation([1, 2])
    t.append_action([3], [-0.5])
    assert drop_reason(t, 64) == "failure_sandbox"
    t.failure = "step: ValueError: bad label"
    assert drop_reason(t, 64) == "failure_step"
