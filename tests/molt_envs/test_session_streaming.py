"""Streaming on both wires, parsed by the stock SDKs' own stream readers."""

from __future__ import annotations

import json

from chat_support import ANTHROPIC_CALC_TOOL, CALC_TOOL, ScriptedEngine

from molt_envs import SamplingParams

CALL = '<tool_call>\n{"name": "calc", "arguments": {"expr": "6*7"}}\n</tool_call>'


async def test_openai_stream_carries_content_tool_calls_finish_and_usage(serve, tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, ["Let me see.\n" + CALL])
    server = await serve(engine, tiny_tokenizer)
    session = server.open_session()
    stream = await serve.openai(server, session).chat.completions.create(
        model="policy",
        messages=[{"role": "user", "content": "6*7?"}],
        tools=[CALC_TOOL],
        stream=True,
        stream_options={"include_usage": True},
    )
    content, calls, finish, usage = "", {}, None, None
    async for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for call in choice.delta.tool_calls or []:
                slot = calls.setdefault(call.index, {"id": call.id, "name": "", "arguments": ""})
                slot["name"] += call.function.name or ""
                slot["arguments"] += call.function.arguments or ""
            finish = choice.finish_reason or finish
    assert content == "Let me see." and finish == "tool_calls"
    [call] = calls.values()
    assert (
        call["id"].startswith("call_") and call["name"] == "calc" and json.loads(call["arguments"]) == {"expr": "6*7"}
    )
    [segment] = session.segments
    assert usage.completion_tokens == segment.num_action_tokens and usage.prompt_tokens == segment.prompt_len


async def test_openai_stream_of_a_retried_request_replays_the_same_text(serve, tiny_engine, tiny_tokenizer):
    server = await serve(tiny_engine, tiny_tokenizer, params=SamplingParams(max_tokens=8))
    session = server.open_session()
    client = serve.openai(server, session)
    messages = [{"role": "user", "content": "Natalia sold clips."}]
    plain = await client.chat.completions.create(model="policy", messages=messages)
    stream = await client.chat.completions.create(model="policy", messages=messages, stream=True)
    streamed = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert streamed == plain.choices[0].message.content
    assert len(session.segments[0].action_ranges) == 1


async def test_anthropic_stream_text_and_tool_use(serve, tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, ["Hello there.", "Computing.\n" + CALL])
    server = await serve(engine, tiny_tokenizer)
    session = server.open_session()
    client = serve.anthropic(server, session)
    messages = [{"role": "user", "content": "hi"}]
    async with client.messages.stream(model="policy", max_tokens=256, messages=messages) as stream:
        text = "".join([t async for t in stream.text_stream])
        final = await stream.get_final_message()
    assert text == "Hello there." and final.stop_reason == "end_turn"
    assert final.usage.output_tokens == session.segments[0].num_action_tokens
    messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "6*7?"}]
    async with client.messages.stream(
        model="policy", max_tokens=256, messages=messages, tools=[ANTHROPIC_CALC_TOOL]
    ) as stream:
        final = await stream.get_final_message()
    assert final.stop_reason == "tool_use"
    assert [(b.type, getattr(b, "text", None) or getattr(b, "input", None)) for b in final.content] == [
        ("text", "Computing."),
        ("tool_use", {"expr": "6*7"}),
    ]
    # tools render into the system turn, so adding them rewrites the prefix: a second segment, same rollout
    first, second = session.segments
    assert first.rollout_id == second.rollout_id and len(second.action_ranges) == 1
