"""Bad requests get a 4xx whose message names the problem, on both wires and the session routes; never a 5xx."""

from __future__ import annotations

import asyncio
import copy
import json

import anthropic
import httpx
import openai
import pytest
from chat_support import ScriptedEngine

OPENAI_CASES = [
    ({"messages": []}, "messages must be a non-empty list"),
    ({"messages": "hi"}, "messages must be a non-empty list"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role must be one of"),
    ({"messages": ["hi"]}, "messages[0] must be an object"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content must be a string"),
    (
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        "accepts only text parts",
    ),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, "temperature must be a number"),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": -1}, "temperature must be a finite number >= 0"),
    ({"messages": [{"role": "user", "content": "x"}], "top_p": 5}, "top_p must be in (0, 1]"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens must be a positive integer"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": True}, "max_tokens must be a positive integer"),
    ({"messages": [{"role": "user", "content": "x"}], "n": 0}, "n must be an integer in 1..128"),
    ({"messages": [{"role": "user", "content": "x"}], "n": 129}, "n must be an integer in 1..128"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, "tools[0] must be"),
    ({"messages": [{"role": "user", "content": "x"}], "stream": "yes"}, "stream must be a boolean"),
    (
        {"messages": [{"role": "assistant", "content": "", "tool_calls": [{"id": "1"}]}]},
        "messages[0].tool_calls[0] must be",
    ),
    ({"messages": [{"role": "assistant", "content": "", "tool_calls": True}]}, "messages[0].tool_calls must be a list"),
    ({"messages": [{"role": "user", "content": "x"}], "seed": -5}, "seed must be an integer in [0, 2**63)"),
]

ANTHROPIC_CASES = [
    ({"max_tokens": 8, "messages": []}, "messages must be a non-empty list"),
    ({"max_tokens": 8, "messages": [{"role": "tool", "content": "x"}]}, "role 'user', 'assistant' or 'system'"),
    ({"max_tokens": "many", "messages": [{"role": "user", "content": "x"}]}, "max_tokens must be a positive integer"),
    (
        {"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
        "has type 'image'",
    ),
    (
        {"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "tool_use", "name": "f"}]}]},
        "has type 'tool_use'",
    ),
    (
        {"max_tokens": 8, "messages": [{"role": "user", "content": "x"}], "tools": [{"description": "no name"}]},
        "tools[0] must be",
    ),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": "x"}], "system": 5}, "system must be a string"),
]


@pytest.fixture
async def http(serve, tiny_tokenizer):
    server = await serve(ScriptedEngine(tiny_tokenizer, ["ok"]), tiny_tokenizer, max_body_bytes=4096)
    session = server.open_session()
    async with httpx.AsyncClient(base_url=server.url) as client:
        yield client, server, session


@pytest.mark.parametrize(("body", "message"), OPENAI_CASES)
async def test_openai_wire_rejects_bad_bodies_with_a_message(http, body, message):
    client, _, session = http
    response = await client.post(f"/s/{session.session_id}/v1/chat/completions", json=body)
    assert response.status_code == 400, response.text
    assert message in response.json()["error"]["message"]
    assert session.segments == []


@pytest.mark.parametrize(("body", "message"), ANTHROPIC_CASES)
async def test_anthropic_wire_rejects_bad_bodies_with_a_message(http, body, message):
    client, _, session = http
    response = await client.post(f"/s/{session.session_id}/v1/messages", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["type"] == "error" and message in response.json()["error"]["message"]


@pytest.mark.parametrize("path", ["/s/nope/v1/chat/completions", "/s/nope/v1/messages"])
async def test_unknown_session_is_404(http, path):
    client, _, _ = http
    response = await client.post(path, json={"max_tokens": 8, "messages": [{"role": "user", "content": "x"}]})
    assert response.status_code == 404 and "unknown session 'nope'" in response.text


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b""])
async def test_bodies_that_are_not_a_json_object_are_400(http, raw):
    client, _, session = http
    response = await client.post(
        f"/s/{session.session_id}/v1/chat/completions", content=raw, headers={"content-type": "application/json"}
    )
    assert response.status_code == 400 and "request body" in response.json()["error"]["message"]


async def test_oversized_bodies_are_413_declared_or_streamed(http):
    client, _, session = http
    big = {"messages": [{"role": "user", "content": "x" * 10_000}]}
    response = await client.post(f"/s/{session.session_id}/v1/chat/completions", json=big)
    assert response.status_code == 413 and "limit is 4096" in response.text

    async def chunks():  # no content-length: the limit trips while reading
        yield json.dumps(big).encode()

    response = await client.post(f"/s/{session.session_id}/v1/messages", content=chunks())
    assert response.status_code == 413 and "4096-byte limit" in response.text


async def test_session_routes_reject_bad_input(http):
    client, _, _ = http
    assert (await client.post("/sessions", json={"max_length": -3})).status_code == 400
    response = await client.post("/sessions", json={"sampling_params": {"top_p": 9}})
    assert response.status_code == 400 and "top_p" in response.text
    response = await client.post("/sessions", json={"sampling_params": {"warmth": 1}})
    assert response.status_code == 400 and "unknown field(s) warmth" in response.text
    for bad in (
        {"seed": "x"},
        {"stop_token_ids": 5},
        {"stop_token_ids": [-1]},
        {"min_tokens": -2},
        {"temperature": "hot"},
        {"max_tokens": 0},
    ):
        response = await client.post("/sessions", json={"sampling_params": bad})
        assert response.status_code == 400 and next(iter(bad)) in response.json()["error"]["message"], bad
    assert (await client.post("/sessions", json={"sampling_params": []})).status_code == 400
    assert (await client.post("/sessions", content=b"[1]")).status_code == 400
    opened = await client.post("/sessions", json={"sampling_params": {"temperature": 0, "stop_token_ids": [3]}})
    assert opened.status_code == 200
    assert (await client.get("/sessions/nope/trajectory")).status_code == 404
    assert (await client.delete("/sessions/nope")).status_code == 404


async def test_the_sdks_see_typed_client_errors(serve, tiny_tokenizer):
    server = await serve(ScriptedEngine(tiny_tokenizer, ["ok"]), tiny_tokenizer)
    session = server.open_session()
    with pytest.raises(openai.BadRequestError, match="temperature must be a finite number"):
        await serve.openai(server, session).chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "x"}], temperature=-2
        )
    server.close_session(session.session_id)
    with pytest.raises(anthropic.NotFoundError, match="unknown session"):
        await serve.anthropic(server, session).messages.create(
            model="policy", max_tokens=8, messages=[{"role": "user", "content": "x"}]
        )


async def test_idle_sessions_expire_after_the_ttl(serve, tiny_tokenizer):
    server = await serve(ScriptedEngine(tiny_tokenizer, ["ok"]), tiny_tokenizer, session_ttl_s=1.0)
    idle, busy = server.open_session(), server.open_session()
    await asyncio.sleep(0.8)
    await serve.openai(server, busy).chat.completions.create(model="p", messages=[{"role": "user", "content": "x"}])
    await asyncio.sleep(0.35)
    server.open_session()
    assert idle.session_id not in server.sessions and busy.session_id in server.sessions


async def test_deep_nesting_and_unpaired_surrogates_are_400(http):
    client, _, session = http
    deep = b"[" * 3000
    for path in (f"/s/{session.session_id}/v1/chat/completions", "/sessions"):
        response = await client.post(path, content=deep, headers={"content-type": "application/json"})
        assert response.status_code == 400 and "nests deeper" in response.text, response.text
    raw = b'{"messages": [{"role": "user", "content": "a\\ud800b"}]}'
    response = await client.post(
        f"/s/{session.session_id}/v1/chat/completions", content=raw, headers={"content-type": "application/json"}
    )
    assert response.status_code == 400 and "unpaired surrogate" in response.text, response.text
    assert session.segments == []


async def test_a_call_in_flight_when_its_session_closes_records_nothing(serve, tiny_tokenizer):
    """The runner hands the trajectory over when the agent returns; a call still generating must not grow it."""

    class Slow(ScriptedEngine):
        async def generate(self, prompt_ids, params, images=None):
            await asyncio.sleep(0.5)
            return await super().generate(prompt_ids, params, images)

    server = await serve(Slow(tiny_tokenizer, ["ok"]), tiny_tokenizer)
    session = server.open_session()
    call = asyncio.create_task(
        serve.openai(server, session)
        .with_options(max_retries=0)
        .chat.completions.create(model="p", messages=[{"role": "user", "content": "x"}])
    )
    await asyncio.sleep(0.2)
    server.close_session(session.session_id)
    with pytest.raises(openai.NotFoundError, match="closed while this call generated"):
        await call
    assert session.segments == []


async def test_a_chat_template_refusal_is_the_clients_error(serve, tiny_tokenizer):
    tokenizer = copy.deepcopy(tiny_tokenizer)
    tokenizer.chat_template = (
        "{% if messages[-1]['role'] == 'system' %}{{ raise_exception('no system message "
        "at the end') }}{% endif %}" + tiny_tokenizer.chat_template
    )
    server = await serve(ScriptedEngine(tokenizer, ["ok"]), tokenizer)
    session = server.open_session()
    with pytest.raises(openai.BadRequestError, match="the chat template refused the conversation: no system"):
        await serve.openai(server, session).chat.completions.create(
            model="p", messages=[{"role": "user", "content": "x"}, {"role": "system", "content": "y"}]
        )
