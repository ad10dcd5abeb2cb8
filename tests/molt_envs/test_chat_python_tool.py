"""`molt/chat-python-tool-v1`: structured tool calls from the server, run in a real sandbox, results sent back."""

from __future__ import annotations

import pytest
from chat_support import ScriptedEngine

import sandboxes
from molt_envs import ChatAgentRunner, SamplingParams
from molt_envs.chat_runner import close_session_servers
from molt_envs.envs.chat_python_tool import ChatPythonToolAgent

needs_sandbox = pytest.mark.skipif(
    sandboxes.probe().auto is None, reason="no sandbox provider works on this host (see sandboxes.probe())"
)

TWO_CALLS = (
    '<tool_call>\n{"name": "python_executor", "arguments": {"code": "print(123 * 456 - 7)"}}\n</tool_call>'
    '<tool_call>\n{"name": "python_executor", "arguments": {"code": "print(2 ** 10)"}}\n</tool_call>'
)


@needs_sandbox
async def test_parallel_tool_calls_run_in_the_sandbox_and_the_answer_is_graded(tiny_tokenizer):
    def model(turn, prompt_ids):
        if turn == 0:
            return TWO_CALLS
        seen = tiny_tokenizer.decode(prompt_ids)  # both real sandbox outputs reached the model's context
        assert "<tool_response>\n56081\n</tool_response>" in seen and "<tool_response>\n1024\n</tool_response>" in seen
        return "So it is \\boxed{56081}."

    engine = ScriptedEngine(tiny_tokenizer, model)
    runner = ChatAgentRunner(ChatPythonToolAgent, env_id="molt/chat-python-tool-v1")
    try:
        [segment] = await runner.execute(
            "What is 123 * 456 - 7?", "56081", SamplingParams(max_tokens=256), 2048, tiny_tokenizer, engine
        )
    finally:
        await close_session_servers()
    assert segment.failure is None
    assert segment.reward == 1.0 and segment.info == {"correct": 1.0, "tool_calls": 2.0, "turns": 2.0}
    (_, first_end), (second_start, _) = segment.action_ranges
    feedback = tiny_tokenizer.decode(segment.token_ids[first_end:second_start])
    assert "56081" in feedback and "1024" in feedback
    assert all(lp == 0.0 for lp in segment.log_probs[first_end:second_start])
    assert engine.calls[1][0] == segment.token_ids[:second_start]
