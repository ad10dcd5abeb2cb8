"""Every single-node change to a valid request body, on all three wires: a 2xx or a 4xx with a message, never a 5xx."""

from __future__ import annotations

import copy
import json

import httpx
import pytest
from chat_support import ANTHROPIC_CALC_TOOL, CALC_TOOL, ScriptedEngine

OPENAI_BODY = {
    "model": "policy",
    "max_tokens": 8,
    "temperature": 0.5,
    "tools": [CALC_TOOL],
    "stream": False,
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "6*7?"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "calc", "arguments": '{"expr": "6*7"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "42"},
    ],
}
ANTHROPIC_BODY = {
    "model": "policy",
    "max_tokens": 8,
    "system": [{"type": "text", "text": "Be brief."}],
    "tools": [ANTHROPIC_CALC_TOOL],
    "messages": [
        {"role": "user", "content": "6*7?"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Computing."},
                {"type": "tool_use", "id": "toolu_1", "name": "calc", "input": {"expr": "6*7"}},
            ],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "42"}]},
    ],
}
RESPONSES_BODY = {
    "model": "policy",
    "max_output_tokens": 8,
    "instructions": "Be brief.",
    "tools": [{"type": "function", **CALC_TOOL["function"]}],
    "store": False,
    "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "6*7?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Use calc."}]},
        {"type": "function_call", "call_id": "call_1", "name": "calc", "arguments": '{"expr": "6*7"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "42"},
    ],
}
ODD_VALUES = [
    None,
    True,
    0,
    -1,
    2.5,
    1e308,
    "",
    "x",
    "\x00",
    [],
    [1],
    {},
    {"type": "text"},
    [{"type": "image"}],
    {"role": "user"},
    [[]],
    "function",
    {"type": "function", "function": None},
]


def paths(node, prefix=()):
    """Every path to a node of the JSON body."""
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
    for key, child in children:
        yield (*prefix, key)
        yield from paths(child, (*prefix, key))


def variants(body: dict):
    """Each node replaced by each odd value, and each dict entry deleted: one change per body."""
    for path in paths(body):
        for value in [*ODD_VALUES, "<delete>"]:
            changed = copy.deepcopy(body)
            parent = changed
            for key in path[:-1]:
                parent = parent[key]
            if value != "<delete>":
                parent[path[-1]] = copy.deepcopy(value)
            elif isinstance(parent, dict):
                del parent[path[-1]]
            yield changed


@pytest.mark.parametrize(
    ("path", "body"),
    [("/v1/chat/completions", OPENAI_BODY), ("/v1/messages", ANTHROPIC_BODY), ("/v1/responses", RESPONSES_BODY)],
)
async def test_every_single_change_to_a_body_gets_an_answer_never_a_5xx(serve, tiny_tokenizer, path, body):
    server = await serve(ScriptedEngine(tiny_tokenizer, ["ok"]), tiny_tokenizer)
    statuses = set()
    async with httpx.AsyncClient(base_url=server.url) as http:
        assert (await http.post(f"/s/{server.open_session().session_id}{path}", json=body)).status_code == 200
        for changed in variants(body):
            session = server.open_session()
            response = await http.post(f"/s/{session.session_id}{path}", json=changed)
            server.close_session(session.session_id)
            statuses.add(response.status_code)
            assert response.status_code < 500, (json.dumps(changed), response.text)
            if response.status_code >= 400:
                error = response.json()["error"]
                assert error["message"]  # an error body with a message, in the wire's shape
    assert 200 in statuses and 400 in statuses
