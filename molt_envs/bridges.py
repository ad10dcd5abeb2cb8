"""Bridges that let the LLM loop drive existing Gymnasium and PettingZoo environments.

Both adapters are configured with JSON-only kwargs (callables are named ``"module:attr"``), so they register like
any other env::

    env_registry.register("gym/guess-v0", "molt_envs.bridges:GymnasiumEnv",
                          kwargs={"gym_id": "mypkg:GuessNumber-v0", "action_parser": "mypkg.text:parse"})

``GymnasiumEnv`` is an ``Env``: observations reach the model through ``observation_formatter(observation, env)``
(default ``str``) as user messages, which the runner renders with the model's own chat template; the model's text
reaches the env through ``action_parser(text)`` (default: the stripped text). An action the parser rejects (it raises
``ValueError``) ends the episode with ``invalid_action`` counted in ``info`` and ``invalid_reward``.

``PettingZooGame`` is a ``molt_envs.seats.Game``: every seat of an AEC (or parallel) env takes its turns, each
played by the policy its seat maps to (the model, a random player, a scripted callable, a frozen checkpoint).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from typing import Any

from molt_envs.contract import Env, Result, StepState
from molt_envs.scripted import load_callable, seed_from
from molt_envs.scripted import random_legal_action as random_legal_action  # public here too (a scripted policy)
from molt_envs.seats import Game

_SPECIAL = re.compile(r"<\|[^|]*\|>")


def clean_action(text: str) -> str:
    """The model's text without special tokens (``<|im_end|>``), stripped."""
    return _SPECIAL.sub("", text).strip()


def _format_plain(observation: Any, env: Any) -> str:
    return str(observation)


class GymnasiumEnv(Env):
    """One Gymnasium episode per molt episode; the model's text is the action each turn.

    Args:
        gym_id: a Gymnasium ID (``"module:Name-v0"`` imports the module first).
        make_kwargs: keyword arguments of ``gymnasium.make``.
        seed: the reset seed; None takes it from the dataset row's label (an int), else unseeded.
        action_parser: ``"pkg.mod:fn"``, ``fn(text) -> action``, raising ``ValueError`` for an invalid action.
        observation_formatter: ``"pkg.mod:fn"``, ``fn(observation, env) -> str`` (``env`` is the unwrapped env).
        instructions: a system message before the first observation (the rules and the action grammar).
        invalid_reward: the reward of the turn whose action the parser rejects (which ends the episode).
    """

    def __init__(
        self,
        gym_id: str,
        make_kwargs: dict[str, Any] | None = None,
        seed: int | None = None,
        action_parser: str | None = None,
        observation_formatter: str | None = None,
        instructions: str | None = None,
        invalid_reward: float = 0.0,
    ) -> None:
        import gymnasium

        self.parse_action = load_callable(action_parser, clean_action, "action_parser")
        self.format_observation = load_callable(observation_formatter, _format_plain, "observation_formatter")
        self.env = gymnasium.make(gym_id, **(make_kwargs or {}))
        self.seed, self.instructions, self.invalid_reward = seed, instructions, float(invalid_reward)
        self.total_reward = 0.0

    def _messages(self, observation: Any) -> list[dict[str, Any]]:
        return [{"role": "user", "content": self.format_observation(observation, self.env.unwrapped)}]

    async def reset(self, state: dict[str, Any]) -> dict[str, Any]:
        seed = self.seed if self.seed is not None else seed_from(state.get("label"))
        observation, _ = self.env.reset(seed=seed)
        system = [{"role": "system", "content": self.instructions}] if self.instructions else []
        return {**state, "observation": system + self._messages(observation)}

    async def step(self, state: StepState) -> Result:
        try:
            action = self.parse_action(state["action_text"])
        except ValueError:
            self.total_reward += self.invalid_reward
            return Result(
                reward=self.invalid_reward,
                terminated=True,
                info={"invalid_action": 1.0, "total_reward": self.total_reward},
            )
        observation, reward, terminated, truncated, _ = self.env.step(action)
        self.total_reward += float(reward)
        done = bool(terminated or truncated)
        return Result(
            reward=float(reward),
            terminated=bool(terminated),
            truncated=bool(truncated),
            observation=[] if done else self._messages(observation),
            info={"invalid_action": 0.0, "total_reward": self.total_reward},
        )

    async def close(self) -> None:
        self.env.close()


class PettingZooGame(Game):
    """Every seat of a PettingZoo env, each seat's turns played by the policy its seat maps to.

    Args:
        pettingzoo_id: an ID of PettingZoo's registry (e.g. ``"classic/tictactoe-v3"``), made as an AEC env.
        env_factory: instead, ``"pkg.mod:fn"`` returning an AEC env or a parallel env (converted with
            ``parallel_to_aec``). Either way every agent's action space must be ``Discrete``.
        env_kwargs: keyword arguments of the env.
        action_parser: ``fn(text) -> int``, raising ``ValueError`` when the text names no action.
        observation_formatter: ``fn(observation, agent, env) -> str``; what the seat is shown on its turn.
        instructions: ``fn(agent, env) -> str``, the seat's system message (rules, its mark, the action grammar).
        illegal_reward: what a seat gets for an action that does not parse or is not legal (an action mask says
            which are); the game ends there and the other seats share ``-illegal_reward`` (zero-sum stays so).
        forfeit_credit: False: the other seats get 0 for a forfeit instead (a win, loss or draw stays zero-sum;
            a broken rule is the offender's loss alone), so a shared self-play policy is not paid by one seat for
            the other's mistake. An experiment's option (molt_envs/README.md: it did not stop tic-tac-toe
            self-play from collapsing); no catalog env sets it.
        mode, opponent, seat_policies: who plays which seat (``molt_envs.seats.Game``).

    Raises:
        ValueError: at construction, for an action space that is not discrete or a path that does not import.
    """

    def __init__(
        self,
        pettingzoo_id: str | None = None,
        env_factory: str | None = None,
        env_kwargs: dict[str, Any] | None = None,
        action_parser: str | None = None,
        observation_formatter: str | None = None,
        instructions: str | None = None,
        illegal_reward: float = -1.0,
        forfeit_credit: bool = True,
        mode: str = "self_play",
        opponent: str = "random",
        seat_policies: dict[str, str] | None = None,
    ) -> None:
        from gymnasium import spaces
        from pettingzoo.utils.conversions import parallel_to_aec
        from pettingzoo.utils.env import ParallelEnv

        if (pettingzoo_id is None) == (env_factory is None):
            raise ValueError(
                "give exactly one of pettingzoo_id (a PettingZoo registry ID) or env_factory ('pkg.mod:fn')"
            )
        if pettingzoo_id is not None:
            import pettingzoo

            env = pettingzoo.make("aec", pettingzoo_id, **(env_kwargs or {}))
        else:
            env = load_callable(env_factory, None, "env_factory")(**(env_kwargs or {}))
        self.env = parallel_to_aec(env) if isinstance(env, ParallelEnv) else env
        source = pettingzoo_id or env_factory
        for agent in self.env.possible_agents:
            space = self.env.action_space(agent)
            if not isinstance(space, spaces.Discrete):
                raise ValueError(
                    f"{source!r}: agent {agent!r} has action space {space}, which is not Discrete; the "
                    "PettingZoo bridge parses the model's text into one of n actions, so it needs a Discrete "
                    "space (wrap the env to discretize its actions)"
                )
        self.parse_action = load_callable(action_parser, _parse_int, "action_parser")
        self.format_observation = load_callable(observation_formatter, _format_agent, "observation_formatter")
        self.instructions = load_callable(instructions, None, "instructions") if instructions else None
        self.illegal_reward = float(illegal_reward)
        self.forfeit_credit = bool(forfeit_credit)
        super().__init__(list(self.env.possible_agents), mode=mode, opponent=opponent, seat_policies=seat_policies)

    def reset(self, seed: int | None) -> None:
        self.env.reset(seed=seed)
        self.totals = {seat: 0.0 for seat in self.seats}
        self.illegal = {seat: 0.0 for seat in self.seats}
        self.over = False

    def to_move(self) -> str | None:
        env = self.env
        if self.over or not env.agents or all(env.terminations[a] or env.truncations[a] for a in env.agents):
            return None
        return env.agent_selection

    def observe(self, seat: str, first: bool) -> list[dict[str, Any]]:
        observation = self.env.observe(seat)
        messages = [{"role": "user", "content": self.format_observation(observation, seat, self.env)}]
        if first and self.instructions is not None:
            messages.insert(0, {"role": "system", "content": self.instructions(seat, self.env)})
        return messages

    def play_text(self, seat: str, text: str) -> bool:
        try:
            action = self.parse_action(text)
        except ValueError:
            return self._forfeit(seat)
        return self._play(seat, action)

    def play_policy(self, seat: str, policy: Callable[..., Any], rng: random.Random) -> bool:
        return self._play(seat, policy(self.env.observe(seat), seat, self.env, rng))

    def _play(self, seat: str, action: Any) -> bool:
        if not self._legal(seat, action):
            return self._forfeit(seat)
        self.env.step(action)
        for agent, reward in self.env.rewards.items():
            self.totals[agent] += float(reward)
        return True

    def _legal(self, seat: str, action: Any) -> bool:
        if not self.env.action_space(seat).contains(action):
            return False
        observation = self.env.observe(seat)
        mask = observation.get("action_mask") if isinstance(observation, dict) else None
        return mask is None or bool(mask[int(action)])

    def _forfeit(self, seat: str) -> bool:
        """The seat loses: ``illegal_reward`` for it, its opposite shared by the others (unless
        ``forfeit_credit`` is off); the game is over."""
        others = [s for s in self.seats if s != seat] if self.forfeit_credit else []
        self.totals[seat] += self.illegal_reward
        for other in others:
            self.totals[other] -= self.illegal_reward / len(others)
        self.illegal[seat] = 1.0
        self.over = True
        return False

    def returns(self) -> dict[str, float]:
        return dict(self.totals)

    def info(self, seat: str) -> dict[str, float]:
        total = self.totals[seat]
        best = max(self.totals.values())
        return {
            "illegal_move": self.illegal[seat],
            "opponent_illegal_move": float(any(v for s, v in self.illegal.items() if s != seat)),
            "win": float(total > 0 and total == best),
            "draw": float(all(v == total for v in self.totals.values())),
            "loss": float(total < best),
        }

    def close(self) -> None:
        self.env.close()


_INTEGER = re.compile(r"-?\d+")


def _parse_int(text: str) -> int:
    """The last integer of the text: the model may think first."""
    found = _INTEGER.findall(clean_action(text))
    if not found:
        raise ValueError(f"no action number in {text[-80:]!r}")
    return int(found[-1])


def _format_agent(observation: Any, agent: str, env: Any) -> str:
    return f"{agent}: {observation}"
