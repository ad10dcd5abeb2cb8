"""LLM-as-judge rewards: the judge endpoint outside any rollout session, the failure reason and counts of a failed
call, the policy judging itself through its own engine (never captured), and ``molt/judge-summary-v1`` trained end
to end with a tiny frozen judge through ``molt-train rl``."""

from __future__ import annotations

import json

import pytest

from molt_envs import JudgeClient, JudgeError, SamplingParams, StepEnvRunner
from molt_envs.envs.judge_summary import JudgeSummaryEnv, parse_score
from molt_train.config import JudgeConfig, parse
from molt_train.experience import drop_reason

DIGITS = list("0123456789")


@pytest.fixture(scope="module")
def tiny_policy(tiny_tokenizer, tmp_path_factory):
    from molt_train.models.tiny import build_tiny_model, save_tiny

    model = build_tiny_model(tiny_tokenizer, hidden_size=32, num_layers=1, seed=0)
    return save_tiny(model, tiny_tokenizer, tmp_path_factory.mktemp("tiny-policy"))


@pytest.fixture(scope="module")
def tiny_judge(tiny_tokenizer, tmp_path_factory):
    """A from-scratch judge that answers in the rubric's format: its output head scores only the ten digit tokens
    (the others get logit 0), so greedy decoding writes digits, which digits depending on what it read."""
    import torch

    from molt_train.models.tiny import build_tiny_model, save_tiny

    model = build_tiny_model(tiny_tokenizer, hidden_size=32, num_layers=1, seed=1)
    model.config.tie_word_embeddings = False
    head = model.lm_head.weight.detach().clone()
    digits = torch.tensor(tiny_tokenizer.convert_tokens_to_ids(DIGITS))
    keep = torch.zeros(head.shape[0], dtype=torch.bool)
    keep[digits] = True
    head[~keep] = 0.0
    head[keep] *= 20.0
    model.lm_head.weight = torch.nn.Parameter(head)
    return save_tiny(model, tiny_tokenizer, tmp_path_factory.mktemp("tiny-judge"))


def test_the_rubric_score_is_the_first_digit():
    assert parse_score("Score: 7/9") == 7 and parse_score("<|im_start|>4") == 4 and parse_score("great!") is None


async def test_judge_calls_are_served_outside_every_session(tiny_engine, tiny_tokenizer):
    from molt_envs.sessions.server import SessionServer

    server = SessionServer(tiny_engine, tiny_tokenizer)
    root = await server.start()
    try:
        rollout = server.open_session(params=SamplingParams(max_tokens=4), max_length=256)
        judge = JudgeClient(base_url=f"{root}/judge/v1", max_tokens=5)
        reply = await judge.complete([{"role": "user", "content": "Rate: 2+2=4"}])
        assert reply and judge.stats.calls == 1 and judge.stats.completion_tokens > 0 and judge.stats.failures == 0
        assert list(server.sessions) == [rollout.session_id] and rollout.segments == []  # nothing was captured
        with pytest.raises(JudgeError, match="did not answer within"):
            await JudgeClient(base_url=f"{root}/judge/v1", timeout_s=1e-9).complete([{"role": "user", "content": "x"}])
        broken = JudgeClient(base_url="http://127.0.0.1:9/judge/v1")  # nothing listens on the discard port
        with pytest.raises(JudgeError, match="failed: APIConnectionError"):
            await broken.complete([{"role": "user", "content": "x"}])
        assert (broken.stats.calls, broken.stats.failures, broken.stats.timeouts) == (1, 1, 0)
    finally:
        await server.stop()


async def test_an_episode_without_a_working_judge_is_dropped_as_failure_judge(tiny_engine, tiny_tokenizer):
    runner = StepEnvRunner(JudgeSummaryEnv)
    traj = await runner.execute(
        "Summarize: a b c.", "a b c.", SamplingParams(max_tokens=3), 128, tiny_tokenizer, tiny_engine
    )
    assert traj.failure.startswith("judge: JudgeError: molt/judge-summary-v1 is graded by an LLM judge")
    assert "--judge.model_name_or_path" in traj.failure and drop_reason(traj, 128) == "failure_judge"


async def test_the_policy_judges_itself_and_its_judge_calls_are_not_captured(tiny_policy):
    import env_registry
    from molt_train.rollout import RolloutWorker

    worker = RolloutWorker(
        str(tiny_policy), env_id="molt/judge-summary-v1", agent_path=None, max_len=512, timeout_s=120, max_batch_size=64
    )
    await worker.start_judge(JudgeConfig(policy=True, max_new_tokens=4))
    try:
        rows = env_registry.load_split(env_registry.spec("molt/judge-summary-v1"), "train", 2)
        worker.set_prompts([{"prompt": r["prompt"], "label": r["label"]} for r in rows], batch_size=2, seed=0)
        batch = await worker.generate_step(0, {"temperature": 1.0, "max_tokens": 6}, n_samples=2, seed=0)
    finally:
        await worker.shutdown()
    judge = batch["judge"]
    assert judge["calls"] == batch["num_rollouts"] == 4 and judge["completion_tokens"] > 0
    # a random policy rarely answers with a digit: those episodes are counted drops, the others trainable
    kept = {t.rollout_id for t in batch["trajectories"]}
    assert len(kept) + batch["dropped"].get("failure_judge", 0) == 4
    assert judge["failures"] == 0  # every call answered; a reply without a digit is the env's failure_judge
    for t in batch["trajectories"]:  # prompt + the policy's summary only: the judge's call is nowhere in it
        assert len(t.token_ids) == t.prompt_len + t.num_action_tokens and 0 <= t.reward <= 1
    # the same engine generated the summaries and the judge's replies
    actions = sum(t.num_action_tokens for t in batch["trajectories"])
    assert worker.engine.stats["generated_tokens"] >= actions + judge["completion_tokens"]


def test_two_rl_steps_on_judge_summary_with_a_frozen_judge(ray_local, tiny_policy, tiny_judge, tmp_path):
    from molt_train import rl_cli

    argv = ["--env", "molt/judge-summary-v1", "--actor.model_name_or_path", str(tiny_policy)]
    argv += ["--judge.model_name_or_path", str(tiny_judge), "--judge.max_new_tokens", "3"]
    argv += ["--ckpt.output_dir", str(tmp_path), "--train.num_steps", "2", "--rollout.batch_size", "3"]
    argv += ["--rollout.n_samples_per_prompt", "2", "--algo.advantage.estimator", "grpo", "--rollout.max_new_tokens"]
    argv += ["8", "--data.max_len", "512", "--eval.max_samples", "2", "--actor.adam.lr", "1e-3", "--no-logger.progress"]
    assert rl_cli.main(argv) == 0
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert r["judge/calls"] == r["rollout/num_rollouts"] == 6 and r["judge/failures"] == 0
        assert r["rollout/kept_rollouts"] == 6 and r["train/tokens"] > 0 and 0 <= r["rollout/reward_mean"] <= 1
        assert r["judge/completion_tokens"] == 3 * 6  # the judge's digits, never trained on
    assert "eval/accuracy" in records[-1]  # eval episodes are judged too


def test_two_judges_are_refused(capsys):
    base = ["--env", "molt/judge-summary-v1", "--actor.model_name_or_path", "m", "--ckpt.output_dir", "o"]
    with pytest.raises(SystemExit):
        parse("rl", base + ["--judge.policy", "--judge.model_name_or_path", "j"])
    assert "are two judges; keep one" in capsys.readouterr().err
