"""``ChatAgentRunner``: runs a ``ChatAgent`` against the session server and returns its token-exact segments.

Per rollout: open a session on the server fronting the given engine and tokenizer (started lazily, once per event
loop, on loopback port 0), hand the agent a ``ChatContext`` whose URLs point at that session, run a fresh agent, and
return every segment the session captured, each stamped with the agent's reward, score and info, the env ID and spec
hash, and one shared ``rollout_id``. A failure is recorded in ``Trajectory.failure`` and never raised; the session
is discarded whatever happens.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import Any

from molt_envs.contract import ChatAgent, ChatContext, Result, SamplingParams
from molt_envs.runners import Runner, failure_reason
from molt_envs.trajectory import Trajectory

MODEL_NAME = "policy"

# One server per (event loop, engine, tokenizer): the runner may be driven from several loops (threads, tests).
_SERVERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[int, int], Any]] = weakref.WeakKeyDictionary()
_BOOT_LOCKS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = weakref.WeakKeyDictionary()


async def shared_session_server(engine: Any, tokenizer: Any) -> Any:
    """The running loop's server in front of ``engine`` + ``tokenizer``, started on first use."""
    from molt_envs.sessions.server import SessionServer  # fastapi/uvicorn only when a ChatAgent runs

    loop = asyncio.get_running_loop()
    lock = _BOOT_LOCKS.setdefault(loop, asyncio.Lock())
    async with lock:
        servers = _SERVERS.setdefault(loop, {})
        server = servers.get((id(engine), id(tokenizer)))
        if server is None:
            server = SessionServer(engine, tokenizer, model_name=MODEL_NAME)
            await server.start()
            servers[(id(engine), id(tokenizer))] = server
        return server


def session_replays() -> int:
    """Retries answered by replay on the running loop's session servers so far (``SessionServer.replays``)."""
    return sum(server.replays for server in _SERVERS.get(asyncio.get_running_loop(), {}).values())


async def close_session_servers() -> None:
    """Stop the running loop's session servers (call before the loop closes, e.g. at the end of a test)."""
    for server in _SERVERS.pop(asyncio.get_running_loop(), {}).values():
        await server.stop()


class ChatAgentRunner(Runner):
    """Runs a ``ChatAgent`` against the session server; ``execute`` returns every segment the session captured.

    Args:
        agent_factory: called once per rollout; must return a ``ChatAgent``.
        env_id, spec_hash: stamped on every segment.
    """

    def __init__(
        self, agent_factory: Callable[[], ChatAgent], *, env_id: str | None = None, spec_hash: str | None = None
    ) -> None:
        self.agent_factory = agent_factory
        self.env_id = env_id
        self.spec_hash = spec_hash

    async def execute(
        self, prompt, label, sampling_params, max_length, tokenizer, engine, images=None, tools=None
    ) -> list[Trajectory]:
        params = SamplingParams.coerce(sampling_params)
        stage, server, session, result = "start server", None, None, None
        try:
            server = await shared_session_server(engine, tokenizer)
            session = server.open_session(params=params, max_length=max_length, prompt=prompt, label=label)
            stage = "make"
            agent = self.agent_factory()
            if not isinstance(agent, ChatAgent):
                raise TypeError(f"agent factory returned {type(agent).__name__}, which is not a molt_envs.ChatAgent")
            stage = "run"
            base_url, session_url = server.urls(session.session_id)
            messages = _messages(prompt)
            ctx = ChatContext(
                messages=messages,
                tools=tools,
                prompt=_last_user_text(messages),
                label=label,
                images=list(images) if images else None,
                base_url=base_url,
                session_url=session_url,
                model_name=MODEL_NAME,
                api_key=session.api_key,
                session_id=session.session_id,
                sampling_params=params,
                max_length=max_length,
                session_socket=await server.unix_socket(),
                judge=self.judge,
            )
            outcome = await agent.run(ctx)
            if not isinstance(outcome, Result):
                raise TypeError(f"ChatAgent.run must return a molt_envs.Result, got {type(outcome).__name__}")
            result = outcome
            failure = None if session.segments else _nothing_generated(session, max_length)
        except Exception as exc:  # failure isolation: recorded, never raised
            # an exception may name its own stage (a harness's crash or timeout, a wire failure): counted under it
            failure = failure_reason(getattr(exc, "stage", stage), exc)
        finally:
            if server is not None and session is not None:
                server.close_session(session.session_id)
        return self._stamp(session, result, failure, prompt, label, images)

    def _stamp(
        self,
        session: Any,
        result: Result | None,
        failure: str | None,
        prompt: Any,
        label: Any,
        images: list[Any] | None,
    ) -> list[Trajectory]:
        segments = list(session.segments) if session is not None else []
        if not segments:
            segments = [self._new_trajectory(prompt, label, images)]
            if session is not None:
                segments[0].rollout_id = session.rollout_id
        for segment in segments:  # a captured segment's images are those its context holds (the agent sent them)
            segment.env_id, segment.spec_hash = self.env_id, self.spec_hash
            segment.failure = failure
            if result is not None:
                segment.reward, segment.score, segment.info = result.reward, result.score, dict(result.info)
                segment.truncated |= result.truncated
        return segments


def _nothing_generated(session: Any, max_length: int) -> str:
    if session.refused:
        return (
            f"run: nothing was generated: {session.refused} call(s) found no room under max_length={max_length} "
            "(the prompt is too long)"
        )
    return "run: the agent finished without a model call; nothing to train"


def _messages(prompt: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, list):
        return [dict(m) for m in prompt]
    raise TypeError(f"prompt must be a str or a list of chat messages, got {type(prompt).__name__}")


def _last_user_text(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                return "".join(p.get("text", "") for p in content if isinstance(p, dict))
            return str(content or "")
    return ""
