"""Fixtures of the molt_envs tests; ``chat_support`` (helpers of the session-server tests) is importable by name."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # --import-mode=importlib puts no test directory on sys.path


@pytest.fixture
async def serve():
    """``await serve(engine, tokenizer, **kwargs)`` starts a SessionServer on loopback; ``serve.openai(server,
    session)`` / ``serve.anthropic(server, session)`` make stock SDK clients on a session. All close at teardown."""
    from anthropic import AsyncAnthropic
    from openai import AsyncOpenAI

    from molt_envs.session_server import SessionServer

    servers, clients = [], []

    async def start(engine, tokenizer, **kwargs) -> SessionServer:
        server = SessionServer(engine, tokenizer, **kwargs)
        await server.start()
        servers.append(server)
        return server

    def openai(server, session, **kwargs) -> AsyncOpenAI:
        clients.append(AsyncOpenAI(base_url=server.urls(session.session_id)[0], api_key="EMPTY", **kwargs))
        return clients[-1]

    def anthropic(server, session, **kwargs) -> AsyncAnthropic:
        clients.append(AsyncAnthropic(base_url=server.urls(session.session_id)[1], api_key="EMPTY", **kwargs))
        return clients[-1]

    start.openai, start.anthropic = openai, anthropic
    yield start
    for client in clients:
        await client.close()
    for server in servers:
        await server.stop()
