"""The OpenAI Agents SDK (``openai-agents``) drives the policy with both of its model classes, tool loop included,
and the session captures the whole run as one token-exact segment."""

from __future__ import annotations

import agents  # openai-agents, a dev dependency
import pytest
from chat_support import ScriptedEngine

CALL = '<tool_call>\n{"name": "multiply", "arguments": {"a": 6, "b": 7}}\n</tool_call>'


@pytest.mark.parametrize("model_class", ["OpenAIResponsesModel", "OpenAIChatCompletionsModel"])
async def test_an_agent_with_a_tool_runs_on_the_session(serve, tiny_tokenizer, model_class):
    agents.set_tracing_disabled(True)  # no trace export: nothing leaves the machine
    engine = ScriptedEngine(tiny_tokenizer, [CALL, "The product is 42."])
    server = await serve(engine, tiny_tokenizer)
    session = server.open_session()
    calls = []

    @agents.function_tool
    def multiply(a: int, b: int) -> str:
        """Multiply two integers."""
        calls.append((a, b))
        return str(a * b)

    model = getattr(agents, model_class)(model="policy", openai_client=serve.openai(server, session))
    agent = agents.Agent(name="calc", instructions="Use the tool.", tools=[multiply], model=model)
    result = await agents.Runner.run(agent, "What is 6*7?")
    assert result.final_output == "The product is 42." and calls == [(6, 7)]
    [segment] = session.segments  # the second call extended the first: the run is one continuation
    assert len(segment.action_ranges) == 2
    assert engine.calls[1][0] == segment.token_ids[: segment.action_ranges[1][0]]
    assert "<tool_response>\n42\n</tool_response>" in tiny_tokenizer.decode(engine.calls[1][0])
