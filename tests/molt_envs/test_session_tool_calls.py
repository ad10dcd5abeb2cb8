"""Structured tool calls: the parser, and both wires end to end (stock SDKs, real server, scripted model text)."""

from __future__ import annotations

import json

import pytest
from chat_support import ANTHROPIC_CALC_TOOL, CALC_TOOL, ScriptedEngine, render

from molt_envs.tool_calls import parse_tool_calls

CALL = '<tool_call>\n{"name": "calc", "arguments": {"expr": "6*7"}}\n</tool_call>'


def test_plain_text_has_no_calls():
    assert parse_tool_calls("The answer is 4.") == ("The answer is 4.", [])


def test_calls_are_parsed_with_the_text_around_them():
    content, calls = parse_tool_calls("Let me compute.\n" + CALL + CALL.replace("6*7", "1+1"))
    assert content == "Let me compute."
    assert [(c.name, c.arguments) for c in calls] == [("calc", {"expr": "6*7"}), ("calc", {"expr": "1+1"})]
    assert calls[0].id != calls[1].id
    assert json.loads(calls[0].arguments_json) == {"expr": "6*7"}


def test_arguments_given_as_a_json_string_are_decoded():
    _, [call] = parse_tool_calls('<tool_call>{"name": "calc", "arguments": "{\\"expr\\": \\"2\\"}"}</tool_call>')
    assert call.arguments == {"expr": "2"}


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>{not json}</tool_call>",
        '<tool_call>{"arguments": {}}</tool_call>',  # no name
        '<tool_call>{"name": "calc", "arguments": [1, 2]}</tool_call>',  # arguments not an object
        '<tool_call>{"name": "calc", "arguments": {}}',  # unclosed
        CALL + "<tool_call>{broken",  # one good call does not rescue a broken one
        '<tool_call>["calc"]</tool_call>',
        '<tool_call>{"name": "calc", "arguments": {"x": NaN}}</tool_call>',  # no JSON reply can carry these:
        '<tool_call>{"name": "calc", "arguments": {"x": 1e999}}</tool_call>',
        '<tool_call>{"name": "calc", "arguments": {"x": "\\ud800"}}</tool_call>',  # an unpaired surrogate
    ],
)
def test_malformed_calls_come_back_as_plain_text(text):
    assert parse_tool_calls(text) == (text, [])


async def openai_reply(serve, tok, script, **kwargs):
    engine = ScriptedEngine(tok, script)
    server = await serve(engine, tok)
    session = server.open_session()
    client = serve.openai(server, session)
    reply = await client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "6*7?"}], **kwargs
    )
    return reply.choices[0], session


async def test_openai_wire_returns_structured_tool_calls(serve, tiny_tokenizer):
    choice, session = await openai_reply(serve, tiny_tokenizer, ["Computing.\n" + CALL], tools=[CALC_TOOL])
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Computing."
    [call] = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function"
    assert call.function.name == "calc" and json.loads(call.function.arguments) == {"expr": "6*7"}
    # the tools went into the prompt through the chat template
    assert tiny_tokenizer.decode(session.segments[0].token_ids).startswith(
        render(tiny_tokenizer, [{"role": "user", "content": "6*7?"}], [CALC_TOOL])
    )


@pytest.mark.parametrize("kwargs", [{}, {"tools": [CALC_TOOL], "tool_choice": "none"}])
async def test_without_tools_the_call_text_stays_content(serve, tiny_tokenizer, kwargs):
    choice, _ = await openai_reply(serve, tiny_tokenizer, [CALL], **kwargs)
    assert choice.message.tool_calls is None and choice.message.content == CALL and choice.finish_reason == "stop"


async def test_malformed_call_text_is_plain_content_not_an_error(serve, tiny_tokenizer):
    broken = '<tool_call>\n{"name": "calc", "arguments": {"expr": \n</tool_call>'
    choice, _ = await openai_reply(serve, tiny_tokenizer, [broken], tools=[CALC_TOOL])
    assert choice.message.tool_calls is None and choice.message.content == broken and choice.finish_reason == "stop"


async def test_anthropic_wire_returns_tool_use_and_takes_tool_results_back(serve, tiny_tokenizer):
    tok = tiny_tokenizer
    two_calls = CALL + "\n" + CALL.replace("6*7", "6+7")  # as the template writes two calls
    engine = ScriptedEngine(tok, [two_calls, "42 and 13."])
    server = await serve(engine, tok)
    session = server.open_session()
    client = serve.anthropic(server, session)
    messages = [{"role": "user", "content": "6*7 and 6+7?"}]
    first = await client.messages.create(
        model="policy", max_tokens=256, messages=messages, tools=[ANTHROPIC_CALC_TOOL], system="Use tools."
    )
    assert first.stop_reason == "tool_use"
    assert [(b.type, b.name, b.input) for b in first.content] == [
        ("tool_use", "calc", {"expr": "6*7"}),
        ("tool_use", "calc", {"expr": "6+7"}),
    ]
    assert all(b.id.startswith("toolu_") for b in first.content)
    messages += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": first.content[0].id, "content": "42"},
                {
                    "type": "tool_result",
                    "tool_use_id": first.content[1].id,
                    "content": [{"type": "text", "text": "13"}],
                },
            ],
        },
    ]
    second = await client.messages.create(
        model="policy", max_tokens=256, messages=messages, tools=[ANTHROPIC_CALC_TOOL], system="Use tools."
    )
    assert second.stop_reason == "end_turn" and [b.text for b in second.content] == ["42 and 13."]
    [segment] = session.segments  # the tool results extended the same segment
    expected = render(
        tok,
        [
            {"role": "system", "content": "Use tools."},
            {"role": "user", "content": "6*7 and 6+7?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"type": "function", "function": {"name": "calc", "arguments": {"expr": "6*7"}}},
                    {"type": "function", "function": {"name": "calc", "arguments": {"expr": "6+7"}}},
                ],
            },
            {"role": "tool", "content": "42"},
            {"role": "tool", "content": "13"},
            {"role": "assistant", "content": "42 and 13."},
        ],
        [CALC_TOOL],
        generation_prompt=False,
    )
    assert tok.decode(segment.token_ids) + "\n" == expected


async def test_anthropic_malformed_call_is_a_text_block(serve, tiny_tokenizer):
    engine = ScriptedEngine(tiny_tokenizer, ["<tool_call>{oops</tool_call>"])
    server = await serve(engine, tiny_tokenizer)
    session = server.open_session()
    client = serve.anthropic(server, session)
    message = await client.messages.create(
        model="policy", max_tokens=32, tools=[ANTHROPIC_CALC_TOOL], messages=[{"role": "user", "content": "hi"}]
    )
    assert message.stop_reason == "end_turn"
    assert [(b.type, b.text) for b in message.content] == [("text", "<tool_call>{oops</tool_call>")]
