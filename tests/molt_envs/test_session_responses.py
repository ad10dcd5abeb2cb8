"""The OpenAI Responses wire end to end with the stock ``openai`` SDK: text, tools, previous_response_id, full-history
resends, streaming, store, retries and bad input; captured token-exactly like chat completions."""

from __future__ import annotations

import copy
import json

import httpx
import openai
import pytest
from chat_support import CALC_TOOL, ScriptedEngine, encode, render

CALL = '<tool_call>\n{"name": "calc", "arguments": {"expr": "6*7"}}\n</tool_call>'
TOOL = {"type": "function", **CALC_TOOL["function"]}  # the Responses API's flat function tool


async def session_client(serve, tok, script, **kwargs):
    engine = ScriptedEngine(tok, script)
    server = await serve(engine, tok, **kwargs)
    session = server.open_session()
    return engine, server, session, serve.openai(server, session)


async def test_text_reply_with_instructions_is_captured_token_exactly(serve, tiny_tokenizer):
    tok = tiny_tokenizer
    engine, _, session, client = await session_client(serve, tok, ["Hello there."])
    response = await client.responses.create(model="gpt-5", instructions="Be brief.", input="Say hi.")
    assert response.output_text == "Hello there." and response.status == "completed"
    assert response.id.startswith("resp_") and response.model == "policy"  # any name is served by the one model
    [segment] = session.segments
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi."}]
    assert segment.token_ids[: segment.prompt_len] == encode(tok, render(tok, chat)) == engine.calls[0][0]
    assert response.usage.input_tokens == segment.prompt_len
    assert response.usage.output_tokens == segment.num_action_tokens


async def test_a_tool_round_trip_by_previous_response_id_extends_one_segment(serve, tiny_tokenizer):
    tok = tiny_tokenizer
    engine, _, session, client = await session_client(serve, tok, ["Computing.\n" + CALL, "It is 42."])
    first = await client.responses.create(model="policy", instructions="Be brief.", input="6*7?", tools=[TOOL])
    message, call = first.output
    assert message.type == "message" and message.content[0].text == "Computing."
    assert call.type == "function_call" and call.name == "calc" and json.loads(call.arguments) == {"expr": "6*7"}
    second = await client.responses.create(
        model="policy",
        instructions="Be brief.",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "42"}],
        tools=[TOOL],
    )
    assert second.output_text == "It is 42." and second.previous_response_id == first.id
    [segment] = session.segments  # a continuation, not a re-render
    chat = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "6*7?"},
        {
            "role": "assistant",
            "content": "Computing.",
            "tool_calls": [{"type": "function", "function": {"name": "calc", "arguments": call.arguments}}],
        },
        {"role": "tool", "tool_call_id": call.call_id, "content": "42"},
    ]
    first_prompt, _, first_gen = engine.calls[0]
    delta = engine.calls[1][0][len(first_prompt) + len(first_gen.token_ids) :]  # the generated ids stay as they were
    after_reply = render(tok, chat, [CALC_TOOL])[len(render(tok, chat[:3], [CALC_TOOL], generation_prompt=False)) :]
    assert tok.decode(delta) == "\n" + after_reply and "<tool_response>\n42\n</tool_response>" in after_reply
    assert engine.calls[1][0] == segment.token_ids[: segment.action_ranges[1][0]]
    assert segment.token_ids[slice(*segment.action_ranges[0])] == first_gen.token_ids


async def test_resending_the_whole_history_as_items_is_the_same_continuation(serve, tiny_tokenizer):
    """What Codex does (store: false, no previous_response_id): the output items come back as input items."""
    tok = tiny_tokenizer
    engine, server, session, client = await session_client(serve, tok, ["Computing.\n" + CALL, "It is 42."])
    items = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be brief."}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "6*7?"}]},
    ]
    first = await client.responses.create(model="policy", input=items, tools=[TOOL], store=False)
    items += [item.model_dump(exclude_none=True) for item in first.output]
    items.append({"type": "function_call_output", "call_id": first.output[1].call_id, "output": "42"})
    await client.responses.create(model="policy", input=items, tools=[TOOL], store=False)
    [segment] = session.segments
    assert len(segment.action_ranges) == 2 and engine.calls[1][0] == segment.token_ids[: segment.action_ranges[1][0]]
    with pytest.raises(openai.NotFoundError, match="not stored"):  # store: false keeps nothing to read back
        await client.responses.retrieve(first.id)
    with pytest.raises(openai.BadRequestError, match="previous_response_id"):
        await client.responses.create(model="policy", previous_response_id=first.id, input="and?")


async def test_stored_responses_are_read_back_and_retries_replay(serve, tiny_tokenizer):
    _, _, session, client = await session_client(serve, tiny_tokenizer, ["one", "two"])
    first = await client.responses.create(model="policy", input="Count.", metadata={"k": "v"})
    again = await client.responses.create(model="policy", input="Count.", metadata={"k": "v"})  # an SDK retry
    assert again.id == first.id and again.output_text == "one"
    assert len(session.segments[0].action_ranges) == 1  # the retry recorded nothing
    stored = await client.responses.retrieve(first.id)
    assert stored.output_text == "one" and stored.metadata == {"k": "v"}


async def test_streaming_events_parse_with_the_sdk_helper(serve, tiny_tokenizer):
    _, _, session, client = await session_client(serve, tiny_tokenizer, ["Let me see.\n" + CALL])
    stream = await client.responses.create(model="policy", input="6*7?", tools=[TOOL], stream=True)
    kinds = [event.type async for event in stream]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert "response.output_text.delta" in kinds and "response.function_call_arguments.done" in kinds
    assert kinds.count("response.output_item.added") == kinds.count("response.output_item.done") == 2
    async with client.responses.stream(model="policy", input="6*7?", tools=[TOOL]) as helper:  # a retry: replayed
        final = await helper.get_final_response()
    assert final.output_text == "Let me see." and final.output[1].name == "calc"
    assert len(session.segments[0].action_ranges) == 1


async def test_max_output_tokens_cuts_the_reply_as_incomplete(serve, tiny_tokenizer):
    _, _, session, client = await session_client(serve, tiny_tokenizer, ["one two three four five six"])
    response = await client.responses.create(model="policy", input="Count.", max_output_tokens=2, temperature=0.5)
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert session.segments[0].num_action_tokens == 2 and session.segments[0].truncated


async def test_namespace_tools_are_flattened_and_calls_name_their_namespace(serve, tiny_tokenizer):
    call = CALL.replace('"calc"', '"math.calc"')
    _, _, session, client = await session_client(serve, tiny_tokenizer, [call])
    namespace = {"type": "namespace", "name": "math", "description": "arithmetic", "tools": [TOOL]}
    response = await client.responses.create(
        model="policy", input="6*7?", tools=[namespace, {"type": "web_search"}]
    )  # the hosted tool is not shown to the model
    [item] = response.output
    assert (item.name, item.namespace) == ("calc", "math")
    prompt = tiny_tokenizer.decode(session.segments[0].token_ids)
    assert '"name": "math.calc"' in prompt and "web_search" not in prompt


REASONING = {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Multiply."}]}
HISTORY = [
    {"role": "user", "content": "6*7?"},
    REASONING,
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "42"}]},
    {"role": "user", "content": "And 6*8?"},
]


async def test_reasoning_items_are_dropped_where_the_template_has_no_place_for_them(serve, tiny_tokenizer):
    tok = tiny_tokenizer
    engine, _, _, client = await session_client(serve, tok, ["48"])
    await client.responses.create(model="policy", input=HISTORY)
    chat = [{"role": "user", "content": "6*7?"}, {"role": "assistant", "content": "42"}, HISTORY[3]]
    assert engine.calls[0][0] == encode(tok, render(tok, chat))


async def test_reasoning_items_become_reasoning_content_where_the_template_renders_it(serve, tiny_tokenizer):
    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = tok.chat_template.replace(
        "<|im_start|>assistant\n{{ message.content or '' }}",
        "<|im_start|>assistant\n{% if message.reasoning_content %}<think>{{ message.reasoning_content }}</think>"
        "{% endif %}{{ message.content or '' }}",
    )
    engine, _, _, client = await session_client(serve, tok, ["48"])
    await client.responses.create(model="policy", input=HISTORY)
    assert "<think>Multiply.</think>42" in tok.decode(engine.calls[0][0])


BAD_BODIES = [
    ({"input": []}, "input must be a string or a non-empty list"),
    ({"input": [5]}, "input[0] must be an input item object"),
    ({"input": [{"type": "message", "role": "robot", "content": "x"}]}, "input[0].role must be one of"),
    ({"input": [{"type": "computer_call", "id": "c"}]}, 'input[0].type is "computer_call"'),
    ({"input": [{"type": "function_call_output", "call_id": "call_x", "output": "1"}]}, "input[0].call_id"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": {}}]}, "input[0] (function_call) needs"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input_image"),
    ({"input": "x", "previous_response_id": "resp_nope"}, "previous_response_id 'resp_nope'"),
    ({"input": "x", "tools": [{"type": "function"}]}, "tools[0] must be"),
    ({"input": "x", "tools": [{"type": "teleport"}]}, "tools[0] has type 'teleport'"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens must be a positive integer"),
    ({"input": "x", "background": True}, "background is not supported"),
    ({"input": "x", "instructions": 7}, "instructions must be a string"),
]


@pytest.mark.parametrize(("body", "message"), BAD_BODIES)
async def test_bad_bodies_are_400s_that_name_the_field(serve, tiny_tokenizer, body, message):
    server = await serve(ScriptedEngine(tiny_tokenizer, ["ok"]), tiny_tokenizer)
    session = server.open_session()
    async with httpx.AsyncClient(base_url=server.url) as http:
        response = await http.post(f"/s/{session.session_id}/v1/responses", json={"model": "policy", **body})
    assert response.status_code == 400, response.text
    assert message in response.json()["error"]["message"]
    assert session.segments == []


async def test_a_response_of_another_session_is_not_found(serve, tiny_tokenizer):
    server = await serve(ScriptedEngine(tiny_tokenizer, ["ok"]), tiny_tokenizer)
    mine, theirs = server.open_session(), server.open_session()
    first = await serve.openai(server, theirs).responses.create(model="policy", input="hi")
    client = serve.openai(server, mine)
    with pytest.raises(openai.BadRequestError, match="not a stored response of this session"):
        await client.responses.create(model="policy", previous_response_id=first.id, input="more")
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(first.id)
    assert mine.segments == []


async def test_models_are_listed_and_retrieved_on_both_wires(serve, tiny_tokenizer):
    server = await serve(ScriptedEngine(tiny_tokenizer, ["ok"]), tiny_tokenizer, model_name="tiny")
    session = server.open_session()
    assert [m.id async for m in serve.openai(server, session).models.list()] == ["tiny"]
    assert (await serve.openai(server, session).models.retrieve("gpt-5")).id == "tiny"
    anthropic = serve.anthropic(server, session)
    assert [(m.id, m.type) async for m in anthropic.models.list()] == [("tiny", "model")]
    assert (await anthropic.models.retrieve("claude-sonnet-5")).display_name == "tiny"
