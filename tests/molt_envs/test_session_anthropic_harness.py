"""The Anthropic wire as Claude Code speaks it, through the stock ``anthropic`` SDK: system entries inside messages,
cache_control, metadata, thinking settings and blocks, beta headers, tool_result arrays, server tools, count_tokens."""

from __future__ import annotations

import anthropic
import pytest
from chat_support import ANTHROPIC_CALC_TOOL, CALC_TOOL, ScriptedEngine, encode, render

CALL = '<tool_call>\n{"name": "calc", "arguments": {"expr": "6*7"}}\n</tool_call>'
EPHEMERAL = {"type": "ephemeral"}
# the shape of Claude Code's first call (2.1.x): system blocks with cache_control, its environment notes as a
# system entry after the user's turn, metadata, thinking / context_management / output_config settings
CLAUDE_CODE_CALL = {
    "system": [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1;"},
        {"type": "text", "text": "You are a coding agent.", "cache_control": EPHEMERAL},
    ],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "6*7?", "cache_control": EPHEMERAL}]},
        {"role": "system", "content": [{"type": "text", "text": "# Environment\nPlatform: linux"}]},
    ],
    "metadata": {"user_id": '{"session_id": "abc"}'},
    "extra_body": {
        "thinking": {"type": "adaptive", "display": "omitted"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"},
    },
}
CHAT = [
    {"role": "system", "content": "x-anthropic-billing-header: cc_version=2.1;You are a coding agent."},
    {"role": "user", "content": "6*7?"},
    {"role": "system", "content": "# Environment\nPlatform: linux"},
]


async def started(serve, tok, script):
    engine = ScriptedEngine(tok, script)
    server = await serve(engine, tok)
    session = server.open_session()
    return engine, session, serve.anthropic(server, session)


async def test_a_claude_code_call_is_served_and_its_system_entries_stay_in_place(serve, tiny_tokenizer):
    tok = tiny_tokenizer
    engine, session, client = await started(serve, tok, ["Computing.\n" + CALL])
    tools = [{**ANTHROPIC_CALC_TOOL, "cache_control": EPHEMERAL}, {"type": "web_search_20250305", "name": "web"}]
    message = await client.beta.messages.create(
        model="claude-sonnet-5",
        max_tokens=4096,
        tools=tools,
        betas=["claude-code-20250219", "interleaved-thinking-2025-05-14"],
        **CLAUDE_CODE_CALL,
    )
    assert message.stop_reason == "tool_use" and message.content[1].name == "calc"
    assert engine.calls[0][0] == encode(tok, render(tok, CHAT, [CALC_TOOL]))  # the server tool is not shown
    assert session.segments[0].token_ids[: session.segments[0].prompt_len] == engine.calls[0][0]


async def test_tool_results_as_arrays_and_thinking_blocks_continue_the_segment(serve, tiny_tokenizer):
    tok = tiny_tokenizer
    engine, session, client = await started(serve, tok, ["Computing.\n" + CALL, "It is 42."])
    first = await client.messages.create(model="m", max_tokens=64, tools=[ANTHROPIC_CALC_TOOL], **CLAUDE_CODE_CALL)
    tool_use = first.content[1]
    history = CLAUDE_CODE_CALL["messages"] + [
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Use the tool.", "signature": "sig"},
                *[block.model_dump(exclude_none=True) for block in first.content],
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": tool_use.id,
                    "content": [{"type": "text", "text": "4"}, {"type": "text", "text": "2"}],
                    "cache_control": EPHEMERAL,
                }
            ],
        },
    ]
    second = await client.messages.create(
        model="m", max_tokens=64, tools=[ANTHROPIC_CALC_TOOL], **{**CLAUDE_CODE_CALL, "messages": history}
    )
    assert second.content[0].text == "It is 42."
    [segment] = session.segments  # the thinking block (no place in this template) did not break the continuation
    delta = engine.calls[1][0][len(engine.calls[0][0]) + len(engine.calls[0][2].token_ids) :]
    chat = [
        *CHAT,
        {
            "role": "assistant",
            "content": "Computing.",
            "tool_calls": [{"type": "function", "function": {"name": "calc", "arguments": '{"expr": "6*7"}'}}],
        },
        {"role": "tool", "tool_call_id": tool_use.id, "content": "42"},
    ]
    after_reply = render(tok, chat, [CALC_TOOL])[len(render(tok, chat[:4], [CALC_TOOL], generation_prompt=False)) :]
    assert tok.decode(delta) == "\n" + after_reply and "<tool_response>\n42\n</tool_response>" in after_reply
    assert len(segment.action_ranges) == 2


async def test_count_tokens_is_the_templates_real_count(serve, tiny_tokenizer):
    _, session, client = await started(serve, tiny_tokenizer, ["ok"])
    body = {k: v for k, v in CLAUDE_CODE_CALL.items() if k != "metadata"}
    counted = await client.messages.count_tokens(model="m", tools=[ANTHROPIC_CALC_TOOL], **body)
    assert counted.input_tokens == len(encode(tiny_tokenizer, render(tiny_tokenizer, CHAT, [CALC_TOOL])))
    assert session.segments == []  # counting generates nothing


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ([{"type": "tool_result", "tool_use_id": "toolu_never", "content": "1"}], "answers no tool_use"),
        (
            [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "image", "source": {}}]}],
            "has type 'image'",
        ),
        ([{"type": "document", "source": {}}], "has type 'document'"),
    ],
)
async def test_what_the_template_cannot_represent_is_a_400_naming_it(serve, tiny_tokenizer, content, message):
    _, session, client = await started(serve, tiny_tokenizer, ["ok"])
    messages = [
        {"role": "user", "content": "6*7?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "calc", "input": {}}]},
        {"role": "user", "content": content},
    ]
    with pytest.raises(anthropic.BadRequestError, match=message):
        await client.messages.create(model="m", max_tokens=8, messages=messages)
    assert session.segments == []
