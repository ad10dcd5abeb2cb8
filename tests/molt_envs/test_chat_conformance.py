"""``check_env`` runs a ChatAgent for real: its SDK, the session server and capture, against a replay engine."""

from __future__ import annotations

import subprocess
import sys

import pytest
from openai import AsyncOpenAI

from molt_envs import ChatAgent, Result
from molt_envs.conformance import check_env
from molt_envs.envs.chat_gsm8k import ChatGSM8KAgent, ChatGSM8KAnthropicAgent
from molt_envs.replay_model import ByteChatTokenizer
from molt_envs.sessions.session import ChatTemplate

ROWS = [
    {
        "prompt": [{"role": "user", "content": "Tom has 3 apples and buys 4. How many?"}],
        "label": "3 + 4 = 7\n#### 7",
        "reference": "He has 3 + 4 = 7 apples.\n#### 7",
    }
]


def test_byte_tokenizer_round_trips_and_supports_token_exact_continuation():
    tok = ByteChatTokenizer()
    text = "<|im_start|>user\nnaïve ∑ <tool_call>{}</tool_call><|im_end|>\n"
    assert tok.decode(tok.encode(text)) == text
    assert tok.encode("<|im_end|>") == [tok.eos_token_id]
    assert ChatTemplate(tok).turn_end == "<|im_end|>\n"


def test_gsm8k_chat_agents_pass():
    for agent in (ChatGSM8KAgent, ChatGSM8KAnthropicAgent):
        report = check_env(agent, ROWS, subject="chat", kind="chat_agent", reward_range=(0.0, 1.0), deterministic=True)
        assert report.passed, report.render()
        assert "row 0: reference completion (through the session server)" in report.render()


class Crashes(ChatAgent):
    async def run(self, ctx):
        async with AsyncOpenAI(base_url=ctx.base_url, api_key=ctx.api_key) as client:
            reply = await client.chat.completions.create(model=ctx.model_name, messages=ctx.messages)
        return Result(reward=float(reply.choices[0].message.content))  # garbage is not a float


class AlwaysTwo(ChatAgent):
    async def run(self, ctx):
        async with AsyncOpenAI(base_url=ctx.base_url, api_key=ctx.api_key) as client:
            await client.chat.completions.create(model=ctx.model_name, messages=ctx.messages)
        return Result(reward=2.0)


def test_a_crashing_agent_fails_with_its_reason():
    report = check_env(Crashes, ROWS, subject="crash", kind="chat_agent", reward_range=(0.0, 1.0))
    assert not report.passed
    assert "episode failed: run: ValueError: could not convert string to float" in report.render()


def test_rewards_outside_the_range_fail():
    report = check_env(AlwaysTwo, ROWS, subject="two", kind="chat_agent", reward_range=(0.0, 1.0))
    assert not report.passed and "reward 2.0 outside the declared reward_range [0.0, 1.0]" in report.render()


@pytest.mark.parametrize("env_id", ["molt/chat-gsm8k-v1", "molt/chat-gsm8k-anthropic-v1", "molt/chat-python-tool-v1"])
def test_registered_chat_agents_pass_molt_env_check(env_id):
    out = subprocess.run(
        [sys.executable, "-m", "env_registry.cli", "check", env_id], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 failed" in out.stdout and "reference completion (through the session server)" in out.stdout
