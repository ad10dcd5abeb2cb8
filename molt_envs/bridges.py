"""Bridges that let the LLM loop drive existing Gymnasium and PettingZoo environments.

Both adapters are ordinary ``Env`` classes configured with JSON-only kwargs (callables are named ``"module:attr"``),
so they register like any other env::

    env_registry.register("gym/guess-v0", "molt_envs.bridges:GymnasiumEnv",
                          kwargs={"gym_id": "mypkg:GuessNumber-v0", "action_parser": "mypkg.text:parse"})

Observations reach the model through ``observation_formatter`` (default ``str``); the model's text reaches the env
through ``action_parser`` (default: the stripped text). Every turn after the first is appended in the model's chat
format via ``turn_template`` (ChatML by default), because ``Result.observation`` is raw text the runner tokenizes.
An action the parser rejects (it raises ``ValueError``) ends the episode with ``invalid_action`` in ``info``.
"""

from __future__ import annotations

import importlib
import random
import re
from collections.abc import Callable
from typing import Any

from molt_envs.contract import Env, Result, StepState

CHATML_TURN = "\n<|im_start|>user\n{observation}<|im_end|>\n<|im_start|>assistant\n"
_SPECIAL = re.compile(r"<\|[^|]*\|>")


def load_callable(name: str | None, default: Callable[..., Any] | None) -> Callable[..., Any]:
    """Resolve ``"package.module:attr"`` (or return ``default`` for None)."""
    if name is None and default is not None:
        return default
    module, _, attr = (name or "").partition(":")
    if not module or not attr:
        raise ValueError(f"{name!r} must look like 'package.module:function'")
    return getattr(importlib.import_module(module), attr)


def _clean_action(text: str) -> str:
    return _SPECIAL.sub("", text).strip()


class _TextBridge(Env):
    def __init__(self, action_parser: str | None, observation_formatter: str | None, turn_template: str) -> None:
        self.parse_action = load_callable(action_parser, _clean_action)
        self.format_observation = load_callable(observation_formatter, str)
        self.turn_template = turn_template
        self.total_reward = 0.0

    def _invalid(self) -> Result:
        return Result(reward=0.0, terminated=True, info={"invalid_action": 1.0, "total_reward": self.total_reward})

    def _turn(self, observation: Any) -> str:
        return self.turn_template.format(observation=self.format_observation(observation))


class GymnasiumEnv(_TextBridge):
    """One Gymnasium episode per molt episode; the model's text is the action each turn."""

    def __init__(
        self,
        gym_id: str,
        make_kwargs: dict[str, Any] | None = None,
        seed: int | None = None,
        action_parser: str | None = None,
        observation_formatter: str | None = None,
        turn_template: str = CHATML_TURN,
    ) -> None:
        import gymnasium

        super().__init__(action_parser, observation_formatter, turn_template)
        self.env = gymnasium.make(gym_id, **(make_kwargs or {}))
        self.seed = seed

    async def reset(self, state: dict[str, Any]) -> dict[str, Any]:
        seed = self.seed if self.seed is not None else _seed_from(state.get("label"))
        observation, _ = self.env.reset(seed=seed)
        return {**state, "observation": [{"role": "user", "content": self.format_observation(observation)}]}

    async def step(self, state: StepState) -> Result:
        try:
            action = self.parse_action(state["action_text"])
        except ValueError:
            return self._invalid()
        observation, reward, terminated, truncated, _ = self.env.step(action)
        self.total_reward += float(reward)
        done = bool(terminated or truncated)
        return Result(
            reward=float(reward),
            terminated=bool(terminated),
            truncated=bool(truncated),
            observation="" if done else self._turn(observation),
            info={"invalid_action": 0.0, "total_reward": self.total_reward},
        )

    async def close(self) -> None:
        self.env.close()


class PettingZooEnv(_TextBridge):
    """The model plays one agent of a PettingZoo AEC env; the other agents act through ``opponent_policy``.

    ``env_factory`` names a function returning an AEC env (e.g. ``"pettingzoo.classic.tictactoe_v3:env"``).
    ``opponent_policy(env, agent, observation, rng) -> action`` defaults to a uniformly random legal action.
    The reward of a turn is what the model's agent earned since its previous turn.
    """

    def __init__(
        self,
        env_factory: str,
        agent: str,
        env_kwargs: dict[str, Any] | None = None,
        seed: int | None = None,
        opponent_policy: str | None = None,
        action_parser: str | None = None,
        observation_formatter: str | None = None,
        turn_template: str = CHATML_TURN,
    ) -> None:
        super().__init__(action_parser, observation_formatter, turn_template)
        self.env = load_callable(env_factory, None)(**(env_kwargs or {}))
        self.agent = agent
        self.seed = seed
        self.opponent = load_callable(opponent_policy, _random_legal_action)
        self.rng = random.Random(seed)

    async def reset(self, state: dict[str, Any]) -> dict[str, Any]:
        seed = self.seed if self.seed is not None else _seed_from(state.get("label"))
        self.env.reset(seed=seed)
        self.rng = random.Random(seed)
        if self.agent not in self.env.agents:
            raise ValueError(f"agent {self.agent!r} is not in this env; its agents are {self.env.agents}")
        observation, _, done = self._advance_to_me()
        if done:
            raise RuntimeError(f"the episode ended before agent {self.agent!r} got a turn")
        return {**state, "observation": [{"role": "user", "content": self.format_observation(observation)}]}

    def _advance_to_me(self) -> tuple[Any, float, bool]:
        """Let the other agents act until it is our turn again; return (observation, our reward since our last
        action, whether our agent is done)."""
        while self.env.agents:
            agent = self.env.agent_selection
            observation, cumulative, terminated, truncated, _ = self.env.last()
            if agent == self.agent:
                return observation, float(cumulative), bool(terminated or truncated)
            self.env.step(None if terminated or truncated else self.opponent(self.env, agent, observation, self.rng))
        return None, 0.0, True

    async def step(self, state: StepState) -> Result:
        try:
            action = self.parse_action(state["action_text"])
        except ValueError:
            return self._invalid()
        self.env.step(action)
        observation, earned, done = self._advance_to_me()
        self.total_reward += earned
        return Result(
            reward=earned,
            terminated=done,
            observation="" if done else self._turn(observation),
            info={"invalid_action": 0.0, "total_reward": self.total_reward},
        )

    async def close(self) -> None:
        self.env.close()


def _random_legal_action(env: Any, agent: str, observation: Any, rng: random.Random) -> Any:
    if isinstance(observation, dict) and "action_mask" in observation:
        legal = [i for i, ok in enumerate(observation["action_mask"]) if ok]
        return rng.choice(legal)
    space = env.action_space(agent)
    space.seed(rng.randrange(2**31))
    return space.sample()


def _seed_from(label: Any) -> int | None:
    try:
        return int(label)
    except (TypeError, ValueError):
        return None
