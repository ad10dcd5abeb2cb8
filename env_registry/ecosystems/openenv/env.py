"""``OpenEnvEnv``: one OpenEnv session per episode, through OpenEnv's own ``GenericEnvClient`` (see the package's
docstring for the rules: actions, invalid actions, rewards, failures)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from env_registry.ecosystems.openenv.source import package_endpoint
from env_registry.ecosystems.openenv.wire import (
    CLOSE_TIMEOUT_S,
    DEFAULT_TIMEOUT_S,
    ActionRejected,
    OpenEnvServerError,
    _server_error,
    parse_action,
    render,
    render_tool_result,
)
from molt_envs.bridges import clean_action
from molt_envs.contract import Env, Result, StepState
from molt_envs.scripted import seed_from
from molt_envs.tool_calls import parse_tool_calls


class OpenEnvEnv(Env):
    """One OpenEnv session per episode, through OpenEnv's ``GenericEnvClient`` (see the module docstring).

    Args:
        base_url: the server (``openenv:http://...``); or ``package`` and ``app`` (and ``python``) of a served package.
        action_schema: the server's action JSON schema. mcp: act through its tools (``list_tools``/``call_tool``).
        instructions: the system message. timeout_s: one answer of the server.
        invalid_reward: the reward of an invalid action. max_invalid_actions: invalid actions that do not end it.
    """

    def __init__(
        self,
        base_url: str | None = None,
        package: str | None = None,
        app: str | None = None,
        python: str | None = None,
        action_schema: dict[str, Any] | None = None,
        mcp: bool = False,
        instructions: str = "",
        timeout_s: float = DEFAULT_TIMEOUT_S,
        invalid_reward: float = 0.0,
        max_invalid_actions: int = 0,
    ) -> None:
        if (base_url is None) == (package is None or app is None):
            raise ValueError("give the server's base_url, or the package and app to serve")
        self.base_url, self.package, self.app, self.python = base_url, package, app, python
        self.action_schema, self.mcp, self.instructions = action_schema or {}, bool(mcp), instructions
        self.timeout_s, self.invalid_reward = float(timeout_s), float(invalid_reward)
        self.max_invalid_actions = int(max_invalid_actions)
        self.client: Any = None
        self.endpoint: Any = None  # a served package's ManagedEndpoint
        self.generation = 0
        self.socket: Any = None  # the session's WebSocket, to notice the client silently opening another
        self.total = self.carry = 0.0
        self.invalid = self.steps = 0
        self.done = False

    async def reset(self, state: dict[str, Any]) -> dict[str, Any]:
        from openenv.core.generic_client import GenericEnvClient

        base_url = self.base_url
        if base_url is None:
            python = self.python or sys.executable
            self.endpoint = await asyncio.to_thread(package_endpoint, self.package, self.app, python)
            self.generation, base_url = self.endpoint.generation, self.endpoint.base_url
        seed = seed_from(state.get("label"))
        deadline, pause = time.monotonic() + self.timeout_s, 0.05
        while True:  # a server at capacity is asked again until timeout_s has passed
            self.client = GenericEnvClient(
                base_url=base_url, connect_timeout_s=min(10.0, self.timeout_s), message_timeout_s=self.timeout_s
            )
            try:
                start = await self._call(lambda: self.client.reset(**({} if seed is None else {"seed": seed})))
                break
            except OpenEnvServerError as exc:
                if exc.failure_stage != "remote_capacity" or time.monotonic() + pause > deadline:
                    raise
            await self.close()
            await asyncio.sleep(pause)
            pause = min(2 * pause, 1.0)
        self.socket = getattr(self.client, "_ws", None)
        self.carry, self.done = start["reward"], start["done"]
        messages = [
            {"role": "system", "content": self.instructions},
            {"role": "user", "content": render(start["observation"])},
        ]
        if not self.mcp:
            return {**state, "observation": messages}
        listed = await self._call(lambda: self.client.step({"type": "list_tools"}))
        tools = listed["observation"].get("tools")
        if not isinstance(tools, list):
            raise OpenEnvServerError(
                f"list_tools answered no tools list: {listed['observation']!r:.200}", "remote_protocol"
            )
        schemas = [
            {
                "type": "function",
                "function": {
                    "name": t.get("name"),
                    "description": t.get("description") or "",
                    "parameters": t.get("input_schema") or t.get("inputSchema") or {"type": "object"},
                },
            }
            for t in tools
            if isinstance(t, dict)
        ]
        return {**state, "observation": messages, "tools": schemas}

    async def step(self, state: StepState) -> Result:
        if self.done:  # the reset itself ended the episode
            return Result(reward=self._add(0.0), terminated=True, info=self._info(0.0), score=self.total)
        text = clean_action(state["action_text"])
        if self.mcp:
            return await self._tool_step(text)
        try:
            action = parse_action(text, self.action_schema)
            answer = await self._call(lambda: self.client.step(action))
        except (ValueError, ActionRejected) as exc:
            return self._invalid(str(exc))
        self.steps += 1
        return self._result(
            answer["reward"], answer["done"], [{"role": "user", "content": render(answer["observation"])}]
        )

    async def _tool_step(self, text: str) -> Result:
        _, calls = parse_tool_calls(text)
        if not calls:
            return self._invalid("the reply makes no tool call; call one of the tools")
        reward, done, messages = 0.0, False, []
        for call in calls:
            payload = {"type": "call_tool", "tool_name": call.name, "arguments": call.arguments}
            try:
                answer = await self._call(lambda payload=payload: self.client.step(payload))
            except ActionRejected as exc:
                return self._invalid(str(exc))
            self.steps += 1
            reward += answer["reward"]
            messages.append({"role": "tool", "content": render_tool_result(answer["observation"])})
            if answer["done"]:
                done = True
                break
        return self._result(reward, done, messages)

    def _add(self, reward: float) -> float:
        """This turn's reward: ``reward`` plus what the reset earned, added to the episode's total."""
        reward, self.carry = reward + self.carry, 0.0
        self.total += reward
        return reward

    def _info(self, invalid: float) -> dict[str, float]:
        return {
            "invalid_action": invalid,
            "invalid_actions": float(self.invalid),
            "env_steps": float(self.steps),
            "total_reward": self.total,
        }

    def _result(self, reward: float, done: bool, messages: list[dict[str, Any]]) -> Result:
        self.done = done
        return Result(
            reward=self._add(reward),
            observation=[] if done else messages,
            terminated=done,
            info=self._info(0.0),
            score=self.total,
        )

    def _invalid(self, why: str) -> Result:
        self.invalid += 1
        reward = self._add(self.invalid_reward)
        if self.invalid > self.max_invalid_actions:
            self.done = True
            return Result(reward=reward, terminated=True, info=self._info(1.0), score=self.total)
        note = f"Invalid action: {why}.\n\n{self.instructions}"
        return Result(
            reward=reward,
            observation=[{"role": "user", "content": note}],
            terminated=False,
            info=self._info(0.0),
            score=self.total,
        )

    async def _call(self, request: Callable[[], Awaitable[Any]]) -> dict[str, Any]:
        """One request of the session, its answer checked: ``{"observation": dict, "reward": float, "done": bool}``.

        Raises:
            OpenEnvServerError: the wire failed, the server answered an error or garbage (``ActionRejected``: it
                refused the action); a served package's server is checked (and restarted) after a wire failure.
        """
        from websockets.exceptions import WebSocketException

        async def answer() -> Any:
            return await request()

        try:
            result = await asyncio.wait_for(answer(), self.timeout_s + 5)
        except TimeoutError:
            raise await self._lost(f"no answer within {self.timeout_s:g} s", "remote_timeout") from None
        except ConnectionError as exc:
            stage = "remote_connect" if self.socket is None else "remote_lost"
            raise await self._lost(f"{type(exc).__name__}: {exc}", stage) from None
        except WebSocketException as exc:
            raise await self._lost(f"the session broke: {type(exc).__name__}: {exc}", "remote_lost") from None
        except RuntimeError as exc:  # GenericEnvClient's "Server error: MESSAGE (code: CODE)"
            raise _server_error(str(exc)) from None
        except (ValueError, TypeError, AttributeError) as exc:  # not JSON, or not OpenEnv's envelope
            raise OpenEnvServerError(
                f"an answer that is not OpenEnv's: {type(exc).__name__}: {exc}", "remote_protocol"
            ) from None
        if self.socket is not None and getattr(self.client, "_ws", None) is not self.socket:
            raise await self._lost(
                "the session's connection closed (the client reopened a fresh session)", "remote_lost"
            )
        observation, reward, done = result.observation, result.reward, result.done
        if (
            not isinstance(observation, dict)
            or not isinstance(done, bool)
            or not isinstance(reward, int | float | None)
        ):
            raise OpenEnvServerError(
                f"an answer that is not OpenEnv's observation: observation={observation!r:.120}, "
                f"reward={reward!r:.40}, done={done!r:.40}",
                "remote_protocol",
            )
        return {"observation": observation, "reward": float(reward or 0.0), "done": done}

    async def _lost(self, message: str, stage: str) -> OpenEnvServerError:
        if self.endpoint is not None:  # a served package: restart its server if it died (for later episodes)
            await self.endpoint.recover(self.generation)
        return OpenEnvServerError(f"{message} ({self.base_url or self.package})", stage)

    async def close(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            with contextlib.suppress(Exception):  # the session is gone either way; the server reaps it
                await asyncio.wait_for(_awaited(client.close()), CLOSE_TIMEOUT_S)


async def _awaited(value: Any) -> Any:
    return await value
