"""ChatAgentRunner: the GSM8K chat agents on stock SDKs through the real server, stamping, failures, compaction."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from chat_support import RecordingEngine, ScriptedEngine, encode, render
from openai import AsyncOpenAI

from molt_envs import ChatAgent, ChatAgentRunner, Result, SamplingParams
from molt_envs.chat_runner import close_session_servers, shared_session_server
from molt_envs.envs.chat_gsm8k import ChatGSM8KAgent, ChatGSM8KAnthropicAgent

GSM8K_TEST = Path(__file__).resolve().parents[2] / "molt_envs" / "envs" / "data" / "gsm8k" / "test.jsonl"


@pytest.fixture(autouse=True)
async def stop_servers():
    yield
    await close_session_servers()


@pytest.fixture(scope="module")
def rows():
    with GSM8K_TEST.open() as f:
        raw = [json.loads(next(f)) for _ in range(8)]
    return [
        {
            "prompt": [{"role": "user", "content": r["question"] + "\nPut the answer in \\boxed{}."}],
            "label": r["answer"],
            "answer": r["answer"].rpartition("####")[2].strip(),
        }
        for r in raw
    ]


def run(runner, row, tokenizer, engine, params=None, max_length=1024):
    return runner.execute(
        row["prompt"], row["label"], params or SamplingParams(max_tokens=64), max_length, tokenizer, engine
    )


@pytest.mark.parametrize("agent", [ChatGSM8KAgent, ChatGSM8KAnthropicAgent])
async def test_gsm8k_chat_agents_are_graded_and_stamped(agent, rows, tiny_tokenizer):
    row = rows[0]
    engine = ScriptedEngine(tiny_tokenizer, [f"So the answer is \\boxed{{{row['answer']}}}."])
    runner = ChatAgentRunner(agent, env_id="molt/chat-gsm8k-v1", spec_hash="abc123")
    [segment] = await run(runner, row, tiny_tokenizer, engine)
    assert segment.failure is None
    assert segment.reward == 1.0 and segment.score == 1.0
    assert segment.info == {"math_exact": 1.0, "missing_answer": 0.0}
    assert (segment.env_id, segment.spec_hash, segment.label) == ("molt/chat-gsm8k-v1", "abc123", row["label"])
    assert segment.token_ids[: segment.prompt_len] == encode(tiny_tokenizer, render(tiny_tokenizer, row["prompt"]))
    assert segment.token_ids[segment.prompt_len :] == engine.calls[0][2].token_ids
    server = await shared_session_server(engine, tiny_tokenizer)
    assert server.sessions == {}  # the session was discarded


async def test_real_model_rollouts_in_parallel_share_one_server(rows, tiny_engine, tiny_tokenizer):
    engine = RecordingEngine(tiny_engine)
    runner = ChatAgentRunner(ChatGSM8KAgent)
    params = SamplingParams(max_tokens=24, temperature=1.0, seed=1)
    results = await asyncio.gather(*[run(runner, row, tiny_tokenizer, engine, params) for row in rows])
    assert len(engine.calls) == len(rows)
    server = await shared_session_server(engine, tiny_tokenizer)
    assert server is await shared_session_server(engine, tiny_tokenizer) and server.sessions == {}
    generated = {tuple(prompt): gen for prompt, _, gen in engine.calls}
    for [segment] in results:
        gen = generated[tuple(segment.token_ids[: segment.prompt_len])]
        assert segment.failure is None and segment.reward == 0.0  # a random model does not solve GSM8K
        assert segment.token_ids[segment.prompt_len :] == gen.token_ids
        assert segment.log_probs[segment.prompt_len :] == gen.log_probs
        assert segment.finish_reasons == [gen.finish_reason]
    assert len({s.rollout_id for [s] in results}) == len(rows)


class CompactingAgent(ChatAgent):
    """Two turns, then replaces the history with a summary and asks once more."""

    async def run(self, ctx):
        async with AsyncOpenAI(base_url=ctx.base_url, api_key=ctx.api_key) as client:
            messages = list(ctx.messages)
            for follow_up in ("Check it.", None):
                reply = await client.chat.completions.create(model=ctx.model_name, messages=messages)
                messages.append({"role": "assistant", "content": reply.choices[0].message.content})
                if follow_up:
                    messages.append({"role": "user", "content": follow_up})
            summary = [{"role": "user", "content": "Earlier we tried twice. Final answer?"}]
            await client.chat.completions.create(model=ctx.model_name, messages=summary)
        return Result(reward=0.25, truncated=True, info={"turns": 3})


async def test_compaction_yields_segments_sharing_rollout_id_and_reward(rows, tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, ["one", "two", "three"])
    first, second = await run(ChatAgentRunner(CompactingAgent, env_id="x/y-v1"), rows[0], tiny_tokenizer, engine)
    assert first.rollout_id == second.rollout_id
    assert [first.reward, second.reward] == [0.25, 0.25] and first.truncated and second.truncated
    assert [len(first.action_ranges), len(second.action_ranges)] == [2, 1]
    assert first.info == second.info == {"turns": 3} and first.env_id == second.env_id == "x/y-v1"


class Raises(ChatAgent):
    async def run(self, ctx):
        async with AsyncOpenAI(base_url=ctx.base_url, api_key=ctx.api_key) as client:
            await client.chat.completions.create(model=ctx.model_name, messages=ctx.messages)
        raise RuntimeError("grader exploded")


class Silent(ChatAgent):
    async def run(self, ctx):
        return Result(reward=1.0)


class WrongReturn(ChatAgent):
    async def run(self, ctx):
        return 1.0


@pytest.mark.parametrize(
    ("factory", "failure"),
    [
        (Raises, "run: RuntimeError: grader exploded"),
        (Silent, "the agent finished without a model call"),
        (WrongReturn, "ChatAgent.run must return a molt_envs.Result"),
        (lambda: object(), "make: TypeError: agent factory returned object"),
    ],
)
async def test_failures_are_recorded_never_raised(factory, failure, rows, tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, ["hi"])
    segments = await run(ChatAgentRunner(factory, env_id="x/y-v1"), rows[0], tiny_tokenizer, engine)
    assert segments and all(failure in s.failure for s in segments)
    assert all(s.env_id == "x/y-v1" and s.label == rows[0]["label"] for s in segments)
    assert (await shared_session_server(engine, tiny_tokenizer)).sessions == {}


async def test_a_prompt_over_the_budget_is_a_recorded_failure(rows, tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, ["x"])
    [segment] = await run(ChatAgentRunner(ChatGSM8KAgent), rows[0], tiny_tokenizer, engine, max_length=16)
    assert "1 call(s) found no room under max_length=16" in segment.failure and engine.calls == []


async def test_a_max_length_beyond_the_models_positions_is_clamped_not_an_engine_error(
    rows, tiny_engine, tiny_tokenizer
):
    params = SamplingParams(max_tokens=4096, temperature=1.0, seed=0)  # far beyond the tiny model's 1024 positions
    [segment] = await run(
        ChatAgentRunner(ChatGSM8KAgent), rows[0], tiny_tokenizer, tiny_engine, params, max_length=100_000
    )
    assert segment.failure is None and len(segment.token_ids) <= tiny_engine.max_positions


async def test_the_context_points_the_sdks_at_the_session(rows, tiny_tokenizer):
    seen = []

    class Peek(ChatAgent):
        async def run(self, ctx):
            seen.append(ctx)
            return Result()

    params = SamplingParams(max_tokens=7, temperature=0.3)
    await ChatAgentRunner(Peek).execute(
        "What is 2+2?", "4", params, 512, tiny_tokenizer, ScriptedEngine(tiny_tokenizer, ["x"])
    )
    [ctx] = seen
    assert ctx.messages == [{"role": "user", "content": "What is 2+2?"}] and ctx.prompt == "What is 2+2?"
    assert ctx.base_url == f"{ctx.session_url}/v1" and ctx.session_url.endswith(f"/s/{ctx.session_id}")
    assert ctx.session_url.startswith("http://127.0.0.1:")
    assert (ctx.model_name, ctx.sampling_params, ctx.max_length) == ("policy", params, 512)
    assert len(ctx.api_key) >= 32  # the session's own key, which its unix socket checks
