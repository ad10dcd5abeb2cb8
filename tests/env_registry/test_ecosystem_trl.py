"""Our env IDs trained by TRL's own ``GRPOTrainer`` (env_registry/ecosystems/trl.py): the released TRL from PyPI,
two GRPO steps on the CPU with the tiny from-scratch model, graded by our envs.

The untrained model's sampling is steered with TRL's own ``generation_kwargs`` (transformers' ``suppress_tokens`` /
``sequence_bias``) so its completions are ones the env can tell apart: digits for sorting, move words for the lake.
"""

from __future__ import annotations

import asyncio
import copy
import json

import pandas as pd
import pytest

import env_registry
from env_registry.ecosystems.trl import EnvReward, grpo_kwargs
from env_registry.errors import Error, NameNotFound
from molt_envs.envs.sort import partial_credit

SORT, LAKE = "molt/sort-v1", "gym/frozen-lake-v1"


@pytest.fixture(autouse=True)
def _quiet_trl(monkeypatch):
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is marked experimental


def grpo_config(out, **kwargs):
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(out),
        max_steps=2,
        per_device_train_batch_size=4,
        num_generations=2,
        use_cpu=True,
        use_vllm=False,
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        log_completions=True,  # out/completions/completions_0000N.parquet: prompt, completion, reward, env_info
        num_completions_to_print=1,
        disable_tqdm=True,
        seed=0,
        **kwargs,
    )


def reward_steps(trainer, env_id):
    return [h for h in trainer.state.log_history if f"rewards/{env_id}/mean" in h]


def test_sort_two_grpo_steps_log_the_env_s_own_partial_credit(tiny_model, tiny_tokenizer, tmp_path):
    from trl import GRPOTrainer

    tok = tiny_tokenizer
    keep = {tok.convert_tokens_to_ids(d) for d in "0123456789"} | {tok.eos_token_id}
    inputs = grpo_kwargs(SORT, tok, limit=8)
    assert set(inputs) == {"train_dataset", "reward_funcs"}  # single-turn: TRL generates, the env grades
    args = grpo_config(
        tmp_path,
        max_completion_length=6,
        generation_kwargs={"suppress_tokens": [i for i in range(len(tok)) if i not in keep]},
    )
    trainer = GRPOTrainer(model=copy.deepcopy(tiny_model), args=args, processing_class=tok, **inputs)
    trainer.train()

    steps = reward_steps(trainer, SORT)
    assert [h["step"] for h in steps] == [1, 2]
    rewards = []
    for h in steps:
        table = pd.read_parquet(tmp_path / "completions" / f"completions_{h['step']:05d}.parquet")
        assert len(table) == 4
        for prompt, completion, reward, info in zip(
            table["prompt"], table["completion"], table[SORT], table["env_info"], strict=True
        ):
            digits = prompt[-1]["content"].removeprefix("sort:").removesuffix("=")
            answer = completion[-1]["content"].strip()
            assert reward == pytest.approx(partial_credit(answer, "".join(sorted(digits)))), (prompt, answer)
            assert json.loads(info) == {"exact": float(answer == "".join(sorted(digits)))}
        assert h[f"rewards/{SORT}/mean"] == pytest.approx(table[SORT].mean())
        assert h["env/failures"] == 0 and "env/score" in h and "env/exact" in h
        rewards += list(table[SORT])
    assert any(0 < r < 1 for r in rewards), rewards  # partial credit: the group's rewards differ


async def test_env_reward_grades_hand_made_completions_as_the_env_does():
    logged = {}
    reward = EnvReward(SORT)
    assert reward.__name__ == SORT  # TRL's metric: rewards/molt/sort-v1/mean
    got = await reward(
        [[{"role": "user", "content": "sort:511758="}]] * 3,
        [[{"role": "assistant", "content": c}] for c in ("115578", "115587<|im_end|>", "nope")],
        label_json=['"115578"'] * 3,
        log_metric=logged.__setitem__,
        log_extra=logged.__setitem__,
    )
    assert got == [1.0, pytest.approx(4 / 6), 0.0]
    assert logged["env/score"] == pytest.approx(1 / 3) and logged["env/failures"] == 0
    assert [json.loads(i) for i in logged["env_info"]] == [{"exact": 1.0}, {"exact": 0.0}, {"exact": 0.0}]


def test_frozen_lake_plays_multi_turn_episodes_through_trl_s_rollout_func(tiny_model, tiny_tokenizer, tmp_path):
    from trl import GRPOTrainer

    tok = tiny_tokenizer
    inputs = grpo_kwargs(LAKE, limit=8, max_length=320)  # the prompt is ~150 tokens, a turn ~55: a few turns
    assert set(inputs) == {"train_dataset", "reward_funcs", "rollout_func"}
    rollout, batches = inputs["rollout_func"], []

    def recorded(prompts, trainer):  # what TRL gets back, with each episode's label (its seed)
        labels = [json.loads(p[0]["label_json"]) for p in prompts]
        out = rollout(prompts, trainer)
        batches.append((labels, out))
        return out

    # a move word, then the end of the turn: every turn is a valid move, so an episode lasts until a hole or the goal
    bias = {}
    for move in ("left", "down", "right", "up"):
        ids = tok.encode(" " + move, add_special_tokens=False)
        bias.update({tuple(ids[: k + 1]): 10.0 if k == 0 else 30.0 for k in range(len(ids))})
        bias[(*ids, tok.eos_token_id)] = 30.0
    args = grpo_config(tmp_path, max_completion_length=4, generation_kwargs={"sequence_bias": bias})
    trainer = GRPOTrainer(
        model=copy.deepcopy(tiny_model), args=args, processing_class=tok, **{**inputs, "rollout_func": recorded}
    )
    trainer.train()

    steps = reward_steps(trainer, LAKE)
    assert [h["step"] for h in steps] == [1, 2] and len(batches) == 2
    turns = []
    for h, (labels, out) in zip(steps, batches, strict=True):
        results = out["env_result"]
        assert h["env/failures"] == 0, results
        assert h[f"rewards/{LAKE}/mean"] == pytest.approx(sum(r["reward"] for r in results) / len(results))
        assert h["env/turns"] == pytest.approx(sum(r["turns"] for r in results) / len(results))
        for label, ids, mask, result in zip(labels, out["completion_ids"], out["env_mask"], results, strict=True):
            actions, observations = spans(tok, ids, mask)
            assert len(actions) == result["turns"]
            # between two moves, the env's board: masked out of the loss (the last one may be cut by max_length)
            assert all("Your move" in o for o in observations[: len(actions) - 1]), observations
            # the same moves in a fresh env seeded alike: the same reward, ending (a hole, the goal) at the same turn
            assert asyncio.run(replay(label, actions)) == (pytest.approx(result["reward"]), result["turns"])
            turns.append(result["turns"])
    assert max(turns) > 1, turns  # the env's turns really were played


def spans(tok, ids, mask):
    """The decoded runs of model tokens (env_mask 1) and of env tokens (0), in order."""
    runs = {0: [], 1: []}
    start = 0
    for k in range(1, len(ids) + 1):
        if k == len(ids) or mask[k] != mask[start]:
            runs[mask[start]].append(tok.decode(ids[start:k], skip_special_tokens=False))
            start = k
    return runs[1], runs[0]


async def replay(label, actions):
    """The summed reward of ``actions`` played in a fresh env seeded by ``label``, and the turns it took."""
    env = env_registry.make(LAKE)
    await env.reset({"observation": [], "label": label, "images": []})
    total, turn = 0.0, 0
    for turn, action in enumerate(actions, 1):
        state = {"observation_text": "", "action_text": action, "label": label, "turn": turn - 1, "images": []}
        result = await env.step({**state, "sampling_params": None, "judge": None})
        total += result.reward
        if result.terminated:
            break
    await env.close()
    return total, turn


async def test_ids_trl_cannot_train_are_refused_with_what_to_use_instead():
    with pytest.raises(NameNotFound, match="molt/nope"):
        grpo_kwargs("molt/nope-v1")
    with pytest.raises(Error, match=r"'molt/chat-gsm8k-v1' is a chat_agent.*molt-train rl --env molt/chat-gsm8k-v1"):
        grpo_kwargs("molt/chat-gsm8k-v1")
    with pytest.raises(Error, match=r"'molt/tictactoe-v4' is a game.*molt-train rl --env molt/tictactoe-v4"):
        grpo_kwargs("molt/tictactoe-v4")
    with pytest.raises(Error, match=r"'molt/shapes-v1' is a vision env.*molt-train rl"):
        grpo_kwargs("molt/shapes-v1")
    # an env whose reset rewrites the prompt cannot be graded as a plain reward function: it says to use a rollout
    with pytest.raises(Error, match=r"reset changes the prompt.*grpo_kwargs\('molt/python-tool-v1', rollout=True\)"):
        await EnvReward("molt/python-tool-v1").grade([{"role": "user", "content": "What is 2 * 3?"}], "6", "6")
