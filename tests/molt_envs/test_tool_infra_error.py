"""A sandbox that fails itself (``infra_error``) is never shown to the model as tool output: the episode ends as a
failure recorded under the stage ``sandbox`` (the trainer counts it as the drop reason ``failure_sandbox``).

The env, its tools, the runners and the session server are real; the sandbox is a stand-in that answers every call
with the ``sandboxes.Result`` a twice-dead worker produces (``tests/sandboxes`` makes a real one fail that way).
"""

from __future__ import annotations

import pytest
from chat_support import ScriptedEngine

import env_registry
import sandboxes
from molt_envs import ChatAgentRunner, SamplingParams
from molt_envs.chat_runner import close_session_servers
from molt_envs.envs.chat_python_tool import ChatPythonToolAgent
from molt_envs.tools import ToolInfraError, format_result

CALL = '<tool_call>\n{"name": "python_executor", "arguments": {"code": "print(123 * 456 - 7)"}}\n</tool_call>'
FAILED = sandboxes.Result.infra("local worker failed: channel closed", provider="local", attempts=2)


class FailingSandbox:
    """Every execution reports the sandbox's own failure."""

    def __init__(self, *args, **kwargs) -> None:
        self.calls = 0

    async def start(self) -> None:
        pass

    async def run_python(self, code: str) -> sandboxes.Result:
        self.calls += 1
        return FAILED

    async def exec(self, argv: list[str]) -> sandboxes.Result:
        self.calls += 1
        return FAILED

    async def close(self) -> None:
        pass


@pytest.fixture
def failing_sandbox(monkeypatch):
    monkeypatch.setattr("molt_envs.tools.sandboxes.open", FailingSandbox)


def test_an_infra_error_is_raised_not_formatted_for_the_model():
    with pytest.raises(ToolInfraError, match="the local sandbox failed: local worker failed"):
        format_result(FAILED, 100)
    assert isinstance(ToolInfraError("x"), sandboxes.SandboxError)


async def test_step_env_episode_ends_as_a_sandbox_failure(failing_sandbox, tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, [CALL, "\\boxed{56081}"])
    runner = env_registry.runner_for("molt/python-tool-v1")
    traj = await runner.execute(
        "What is 123 * 456 - 7?", "56081", SamplingParams(max_tokens=64), 1024, tiny_tokenizer, engine
    )
    assert traj.failure.startswith("sandbox: ToolInfraError: the local sandbox failed"), traj.failure
    assert len(engine.calls) == 1  # the model never got a second turn, so never saw the failure as an observation
    assert "infra_error" not in tiny_tokenizer.decode(traj.token_ids)


async def test_chat_agent_episode_ends_as_a_sandbox_failure(failing_sandbox, tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, [CALL, "So it is \\boxed{56081}."])
    runner = ChatAgentRunner(ChatPythonToolAgent, env_id="molt/chat-python-tool-v1")
    try:
        segments = await runner.execute(
            "What is 123 * 456 - 7?", "56081", SamplingParams(max_tokens=256), 2048, tiny_tokenizer, engine
        )
    finally:
        await close_session_servers()
    assert all(s.failure.startswith("sandbox: ToolInfraError") for s in segments), [s.failure for s in segments]
    assert len(engine.calls) == 1 and segments[0].reward == 0.0
