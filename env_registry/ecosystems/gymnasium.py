"""Gymnasium and this registry: every molt ID as a ``gymnasium.Env`` (``import env_registry.gym`` registers them all).

::

    import gymnasium, env_registry.gym
    env = gymnasium.make("molt/arith-v1")                  # or, with no import at all:
    env = gymnasium.make("env_registry.gym:molt/arith-v1")  # Gymnasium's "module:ID" form
    obs, info = env.reset(seed=0)                           # the same seed picks the same task
    obs, reward, terminated, truncated, info = env.step("3+4=7")

Registration is lazy: it reads the registry's entry-point metadata and imports no env module; ``make`` does. The
version rules are Gymnasium's (the same as ``env_registry.make``): an unversioned ID resolves to the latest version.
A package pin is a keyword: ``gymnasium.make("molt/arith-v1", package_version="0.1.0")``. IDs registered with
``env_registry.register`` after the import join on ``register_all()``.

``MoltGymEnv`` is a real ``gymnasium.Env``: observation and action spaces are ``spaces.Text`` (any characters); the
observation is the text of the env's messages (``info["messages"]`` has them as chat messages, for a chat
template); a step's reward is the env's; multi-turn envs go on until ``terminated`` or ``truncated`` (the spec's
``max_turns``). A game (``kind = "game"``) is played from one seat against its default opponent. ChatAgent IDs
are registered too, so that ``make`` can say why they are not Gymnasium envs.
"""

from __future__ import annotations

import asyncio
import copy
import string
import threading
from collections.abc import Coroutine
from typing import Any

import gymnasium
from gymnasium import spaces

from env_registry.datasets import load_split
from env_registry.errors import NotAGymnasiumEnv
from env_registry.registry import registry
from molt_envs.contract import Env, Result, SamplingParams
from molt_envs.seats import OneSeatEnv

ENTRY_POINT = "env_registry.ecosystems.gymnasium:MoltGymEnv"
MAX_OBSERVATION_CHARS = 1 << 20
MAX_ACTION_CHARS = 4096
_ROWS: dict[tuple[str, str, int | None], list[dict[str, Any]]] = {}  # (spec hash, split, num_tasks) -> rows


class AnyText(spaces.Text):
    """``spaces.Text`` of any characters (an LLM reads and writes all of Unicode), sampled from printable ASCII."""

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length


def register_all() -> list[str]:
    """Register every molt ID not yet in Gymnasium's registry; returns the IDs added."""
    added = []
    for env_id in registry:
        if env_id in gymnasium.registry:
            continue
        gymnasium.register(
            env_id,
            entry_point=ENTRY_POINT,
            kwargs={"env_id": env_id},
            nondeterministic=not registry[env_id].deterministic,
        )
        added.append(env_id)
    return added


class MoltGymEnv(gymnasium.Env):
    """One molt env as a Gymnasium env (module docstring).

    Args:
        env_id: the molt ID (what ``gymnasium.make`` registered it under).
        split: the dataset split ``reset`` draws tasks from.
        render_mode: None or ``"ansi"`` (the episode's transcript as text).
        package_version: pin the providing package's version, as ``ns/name-vN@version`` does.
        num_tasks: draw tasks from the split's first ``num_tasks`` rows only (default: every row).
        **env_kwargs: the env's own kwargs (e.g. ``difficulty=2``), overlaying the spec's.

    Raises:
        NotAGymnasiumEnv: for a ChatAgent ID.
        env_registry.Error: an unknown ID or a pin that does not match the installed package.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 1}

    def __init__(
        self,
        env_id: str,
        split: str = "train",
        render_mode: str | None = None,
        package_version: str | None = None,
        num_tasks: int | None = None,
        **env_kwargs: Any,
    ) -> None:
        spec = registry.spec(f"{env_id}@{package_version}" if package_version else env_id)
        if spec.kind == "chat_agent":
            raise NotAGymnasiumEnv(
                f"{spec.id!r} is a ChatAgent: it runs its own loop and calls the policy through an OpenAI/Anthropic "
                "client, so there is no step(action) for Gymnasium to drive. Run it with "
                f"env_registry.runner_for({spec.id!r}) (a ChatAgentRunner over a model engine), `molt-train rl "
                f"--env {spec.id}` or `molt-train eval --env {spec.id}`; for Gymnasium pick an env of kind 'env' "
                "or 'game' (`molt-env list`)"
            )
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode {render_mode!r} is not supported; use None or 'ansi'")
        self.render_mode, self.split = render_mode, split
        self.molt_spec, self._factory = registry.factory(spec.id, **env_kwargs)
        _run(self._new_env().close())  # bad kwargs (a parser that does not import, ...) fail here, at make
        key = (self.molt_spec.hash, split, num_tasks)
        if key not in _ROWS:
            _ROWS[key] = load_split(self.molt_spec, split, num_tasks)
        self._rows = _ROWS[key]
        if not self._rows:
            raise ValueError(f"split {split!r} of {spec.id!r} has no rows to draw tasks from")
        printable = string.printable
        self.observation_space = AnyText(MAX_OBSERVATION_CHARS, min_length=0, charset=printable)
        self.action_space = AnyText(MAX_ACTION_CHARS, min_length=0, charset=printable)
        self._env: Env | None = None
        self._transcript: list[str] = []

    def _new_env(self) -> Env:
        env = self._factory()
        return OneSeatEnv(env) if self.molt_spec.kind == "game" else env

    # -- episode --
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode on a task drawn by the seed (``options={"index": i}`` picks row ``i``)."""
        super().reset(seed=seed)
        self._end_episode()
        index = (options or {}).get("index")
        if index is None:
            index = int(self.np_random.integers(len(self._rows)))
        row = self._rows[index]
        self._env = self._new_env()
        self._label, self._turn, self._done = row["label"], 0, False
        start = _run(self._env.reset({"observation": row["prompt"], "label": row["label"], "images": []}))
        observation = start["observation"]
        text = _text(observation)
        self._context, self._transcript = text, [text]
        info = {"index": index, "messages": _messages(observation), "env_id": self.molt_spec.id}
        return text, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """One turn: ``action`` is the model's reply. After the episode ended it returns ``("", 0.0, True, ...)``."""
        if self._done or self._env is None:
            return "", 0.0, True, False, {}
        self._context += action
        self._transcript.append(action)
        result: Result = _run(
            self._env.step(
                {
                    "observation_text": self._context,
                    "action_text": action,
                    "label": self._label,
                    "sampling_params": SamplingParams(),
                    "turn": self._turn,
                    "images": [],
                }
            )
        )
        self._turn += 1
        terminated = bool(result.terminated)
        max_turns = self.molt_spec.max_turns
        truncated = bool(result.truncated) or (not terminated and max_turns is not None and self._turn >= max_turns)
        text = "" if terminated or truncated else _text(result.observation)
        self._context += text
        self._transcript.append(text)
        info = {**copy.deepcopy(result.info), "messages": _messages(result.observation)}
        if terminated or truncated:
            self._end_episode()
            self._done = True
        return text, float(result.reward), terminated, truncated, info

    def render(self) -> str | None:
        """``"ansi"``: the episode so far, observations and actions in turn."""
        if self.render_mode != "ansi":
            return None
        return "\n".join(self._transcript)

    def close(self) -> None:
        """Ends the episode in progress (an env's ``close`` releases its sandboxes); safe to call twice."""
        self._end_episode()

    def _end_episode(self) -> None:
        env, self._env = self._env, None
        if env is not None:
            _run(env.close())


def _text(observation: str | list[dict[str, Any]]) -> str:
    if isinstance(observation, str):
        return observation
    return "\n\n".join(str(m.get("content", "")) for m in observation)


def _messages(observation: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(observation, str):
        return [{"role": "user", "content": observation}] if observation else []
    return copy.deepcopy(observation)


_LOOP: asyncio.AbstractEventLoop | None = None
_LOOP_LOCK = threading.Lock()


def _run(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run an env coroutine to completion from synchronous Gymnasium code, on one event loop thread kept for the
    process (so sandboxes and tools keep their loop across steps, and callers inside a running loop work too)."""
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None:
            _LOOP = asyncio.new_event_loop()
            threading.Thread(target=_LOOP.run_forever, name="molt-gym-loop", daemon=True).start()
    return asyncio.run_coroutine_threadsafe(coro, _LOOP).result()
