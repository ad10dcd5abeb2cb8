"""Every registered ID as a genuine OpenEnv environment: ``molt-env serve-env ID [ID...] --protocol openenv``.

Built with OpenEnv's own server library (``openenv.core.env_server.create_app``), so OpenEnv's clients, TRL's OpenEnv
integration, verifiers' OpenEnv taskset and NeMo Gym's OpenEnv wrapper drive it unchanged: ``/ws`` sessions
(``reset``, ``step``, ``state``, ``close``), ``/health``, ``/metadata``, ``/schema``, and the stateless HTTP
``/reset`` and ``/step``. With several IDs each is mounted at ``/<ID>`` (``openenv:http://host:port/molt/sort-v1``);
one ID is served at the root.

- ``reset(seed=i, split="train")`` starts the episode of row ``i`` of the split (modulo its length); the observation
  carries the prompt as chat ``messages`` and as ``text``, the env's ``tools`` (OpenAI function schemas) and, for a
  game, the ``seat`` to move.
- ``step({"message": "..."})`` is the model's reply, as ``Env.step`` reads it; a tool env also takes
  ``{"message": "", "tool_calls": [{"name": "python", "arguments": {...}}]}`` (written back as the Hermes/Qwen
  ``<tool_call>`` blocks the env parses). The next observation carries the env's ``feedback`` messages, ``reward``
  (this step's), ``done`` and the env's ``info``.
- A game has one session for all its seats, like OpenEnv's own multi-player envs: the observation names the
  ``seat`` to move, a step plays that seat (an action naming another ``seat`` is a validation error), ``rewards``
  holds every seat's return so far.
- ``--max-sessions N``: N sessions at once, each a fresh env instance (beyond that OpenEnv answers
  ``CAPACITY_REACHED``); a session idle for ``--session-timeout`` seconds is closed and its env released.

The ``molt-env/1`` protocol (``molt_envs.remote``) stays what ``molt-train`` uses between its own processes: it carries
token-first data (exact ids, log-probs) that OpenEnv's observations have no place for.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from itertools import islice
from typing import Any

from fastapi import FastAPI
from openenv.core.env_server import create_app
from openenv.core.env_server.types import Action, ConcurrencyConfig, EnvironmentMetadata, Observation, State
from pydantic import Field

from env_registry.datasets import iter_split
from env_registry.manifest import EnvSpec
from env_registry.registry import registry
from molt_envs.contract import Result, SamplingParams
from molt_envs.seats import Game

ROWS_KEPT = 100_000  # rows of a split a server keeps in memory (reset(seed=i) picks row i modulo the count)
HOLDING: set[Any] = set()  # the sessions (OpenEnv Environments) of this process that hold an env instance now


class ToolCallRequest(Action):
    """One call of one of the env's tools."""

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class MoltAction(Action):
    """The model's reply: its text, and for tool envs the tool calls it makes."""

    message: str = ""
    tool_calls: list[ToolCallRequest] = Field(default_factory=list)
    seat: str | None = Field(default=None, description="a game's seat this move is for (default: the seat to move)")


class MoltObservation(Observation):
    """What the model sees next. ``done``, ``reward`` (this step's) come from OpenEnv's ``Observation``."""

    messages: list[dict[str, Any]] = Field(default_factory=list, description="the prompt, as chat messages")
    text: str = Field(default="", description="the prompt (reset) or the env's feedback (step), as text")
    feedback: list[dict[str, Any]] = Field(default_factory=list, description="the env's answer to the last step")
    tools: list[dict[str, Any]] = Field(default_factory=list, description="OpenAI function schemas of the env's tools")
    seat: str | None = Field(default=None, description="a game's seat to move")
    rewards: dict[str, float] = Field(default_factory=dict, description="a game's return of every seat so far")
    info: dict[str, Any] = Field(default_factory=dict)


class MoltState(State):
    env_id: str = ""
    split: str = "train"
    row: int | None = None
    turn: int = 0
    total_reward: float = 0.0


def _text(messages: list[dict[str, Any]] | str) -> str:
    if isinstance(messages, str):
        return messages
    return "\n".join(f"{m.get('role')}: {m.get('content') or ''}" for m in messages)


def _messages(observation: list[dict[str, Any]] | str | None) -> list[dict[str, Any]]:
    if not observation:
        return []
    return [{"role": "user", "content": observation}] if isinstance(observation, str) else list(observation)


def _action_text(action: MoltAction) -> str:
    blocks = [
        f"<tool_call>\n{json.dumps({'name': c.name, 'arguments': c.arguments})}\n</tool_call>"
        for c in action.tool_calls
    ]
    return "\n".join([action.message, *blocks]) if blocks else action.message


class Rows:
    """A spec's dataset splits, read once per server and shared by its sessions."""

    def __init__(self, spec: EnvSpec) -> None:
        self.spec, self._splits = spec, {}

    def row(self, split: str, index: int) -> dict[str, Any]:
        if split not in self.spec.datasets:
            raise ValueError(f"split {split!r} is not one of {self.spec.id}'s splits {sorted(self.spec.datasets)}")
        if split not in self._splits:
            self._splits[split] = list(islice(iter_split(self.spec, split), ROWS_KEPT))
            if not self._splits[split]:
                raise ValueError(f"split {split!r} of {self.spec.id} has no rows")
        rows = self._splits[split]
        return rows[index % len(rows)]


def environment_class(spec: EnvSpec, make: Callable[[], Any], rows: Rows, idle_timeout_s: float | None) -> type:
    """An OpenEnv ``Environment`` class whose instances each play episodes of a fresh ``make()`` env, released when
    the episode ends, the session closes, or it idles past ``idle_timeout_s``."""
    from openenv.core.env_server.interfaces import Environment

    class MoltEnvironment(Environment):
        SUPPORTS_CONCURRENT_SESSIONS = True  # every session makes its own env instance

        def __init__(self) -> None:
            super().__init__()
            self._state = MoltState(env_id=spec.id)
            self.env: Any = None
            self.game: Game | None = None
            self.messages: list[dict[str, Any]] = []
            self.label: Any = None
            self.idle: asyncio.TimerHandle | None = None
            self.expired = False

        # OpenEnv's abstract sync API: this env is async only (its server awaits the async methods)
        def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> MoltObservation:
            raise NotImplementedError("use reset_async")

        def step(self, action: Any, timeout_s: float | None = None, **kwargs: Any) -> MoltObservation:
            raise NotImplementedError("use step_async")

        @property
        def state(self) -> MoltState:
            return self._state

        def get_metadata(self) -> EnvironmentMetadata:
            return EnvironmentMetadata(
                name=spec.id,
                description=spec.description or spec.id,
                version=spec.package_version or spec.upstream.get("version"),
                author=spec.package,
            )

        async def reset_async(
            self, seed: int | None = None, episode_id: str | None = None, split: str = "train", **kwargs: Any
        ) -> MoltObservation:
            await self._close_env()
            index = seed or 0
            row = rows.row(split, index)
            self._state = MoltState(env_id=spec.id, episode_id=episode_id, split=split, row=index)
            made = make()
            self.env, self.game, self.expired = made, made if isinstance(made, Game) else None, False
            HOLDING.add(self)
            self._touch()
            self.label = row["label"]
            start = {"observation": row["prompt"], "label": row["label"], "images": []}
            if self.game is not None:
                return self._game_start(index)
            if hasattr(self.env, "reset"):
                start = await self.env.reset(start)
            self.messages = _messages(start["observation"])
            return MoltObservation(
                messages=self.messages, text=_text(start["observation"]), tools=start.get("tools") or []
            )

        def _game_start(self, seed: int) -> MoltObservation:
            self.game.reset(seed)
            seat = self.game.to_move()
            self.messages = self.game.observe(seat, first=True)
            return MoltObservation(
                messages=self.messages, text=_text(self.messages), seat=seat, rewards=self.game.returns()
            )

        async def step_async(
            self, action: MoltAction, timeout_s: float | None = None, **kwargs: Any
        ) -> MoltObservation:
            if self.env is None:
                why = f"the session idled past {idle_timeout_s:g} s and its env was released" if self.expired else ""
                raise RuntimeError(f"{why or 'no episode is running'}: send a reset first")
            self._touch()
            if self.game is not None:
                return self._game_step(action)
            text = _action_text(action)
            result = await self.env.step(
                {
                    "observation_text": _text(self.messages),
                    "action_text": text,
                    "label": self.label,
                    "sampling_params": SamplingParams(),
                    "turn": self._state.turn,
                    "images": [],
                }
            )
            if not isinstance(result, Result):
                raise TypeError(f"{spec.id}: Env.step returned {type(result).__name__}, not a Result")
            feedback = _messages(result.observation)
            self.messages += [{"role": "assistant", "content": text}, *feedback]
            self._state.turn += 1
            self._state.step_count += 1
            self._state.total_reward += result.reward
            done = (
                result.terminated
                or result.truncated
                or (spec.max_turns is not None and self._state.turn >= spec.max_turns)
            )
            if done:
                await self._close_env()
            info = {k: v for k, v in result.info.items() if isinstance(v, (int, float, str, bool))}
            return MoltObservation(
                done=done, reward=result.reward, feedback=feedback, text=_text(feedback) if feedback else "", info=info
            )

        def _game_step(self, action: MoltAction) -> MoltObservation:
            seat = self.game.to_move()
            if seat is None:
                raise RuntimeError("the game is over: send a reset")
            if action.seat is not None and action.seat != seat:
                raise ValueError(f"seat {action.seat!r} cannot move: it is {seat!r}'s turn")
            before = self.game.returns()[seat]
            self.game.play_text(seat, _action_text(action))
            self._state.step_count += 1
            after = self.game.returns()
            nxt = self.game.to_move()
            messages = self.game.observe(nxt, first=self._state.step_count < len(self.game.seats)) if nxt else []
            return MoltObservation(
                done=nxt is None,
                reward=after[seat] - before,
                messages=messages,
                text=_text(messages),
                seat=nxt,
                rewards=after,
                info={k: v for k, v in self.game.info(seat).items() if isinstance(v, (int, float))},
            )

        def _touch(self) -> None:
            """(Re)arm the idle timer: a session idle past ``idle_timeout_s`` releases its env instance."""
            if self.idle is not None:
                self.idle.cancel()
            if idle_timeout_s:
                loop = asyncio.get_running_loop()
                self.idle = loop.call_later(idle_timeout_s, lambda: loop.create_task(self._expire()))

        async def _expire(self) -> None:
            if self.env is not None:
                self.expired = True
                await self._close_env()

        def _release(self) -> Any:
            """Let go of the env instance (no longer held, no idle timer); returns what ``close()`` it needs."""
            env, self.env = self.env, None
            HOLDING.discard(self)
            if self.idle is not None:
                self.idle.cancel()
            return env.close() if env is not None and hasattr(env, "close") else None

        async def _close_env(self) -> None:
            closing = self._release()
            if hasattr(closing, "__await__"):
                await closing

        def close(self) -> None:  # a session's end: OpenEnv calls it when the socket closes or its reaper runs
            closing = self._release()
            if hasattr(closing, "__await__"):  # an async close, from OpenEnv's executor thread: run it there
                asyncio.run(closing)

    MoltEnvironment.__name__ = MoltEnvironment.__qualname__ = f"Molt[{spec.id}]"
    return MoltEnvironment


def openenv_app(env_ids: list[str], max_sessions: int = 64, session_timeout_s: float | None = 600.0) -> FastAPI:
    """One FastAPI app serving each ID as an OpenEnv environment (mounted at ``/<ID>``; a single ID also at ``/``).

    Raises:
        Error: an ID does not resolve here, or its entry point cannot be loaded (checked before serving).
    """
    apps = {}
    for env_id in env_ids:
        spec, make = registry.factory(env_id)
        cls = environment_class(spec, make, Rows(spec), session_timeout_s)
        config = ConcurrencyConfig(max_concurrent_envs=max_sessions, session_timeout=session_timeout_s)
        apps[spec.id] = create_app(
            cls, MoltAction, MoltObservation, env_name=spec.id, concurrency_config=config, state_cls=MoltState
        )
    if len(apps) == 1:
        return next(iter(apps.values()))
    root = FastAPI(title="molt-env serve-env --protocol openenv")
    for env_id, app in apps.items():
        root.mount(f"/{env_id}", app)

    @root.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "healthy", "envs": list(apps)}

    return root
