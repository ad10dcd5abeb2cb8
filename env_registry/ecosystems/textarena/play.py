"""TextArena games played move by move: one-player puzzles as ``Env``s, games of several players as ``Game``s with
seats, the random player, and the seed rows of the splits (the rules: this package's docstring)."""

from __future__ import annotations

import contextlib
import random
import re
from collections.abc import Iterator
from typing import Any

from molt_envs.bridges import clean_action, seed_from
from molt_envs.contract import Env, Result, StepState
from molt_envs.seats import RANDOM, Game

# -- playing ----------------------------------------------------------------------------------------------------------


def unwrapped(env: Any) -> Any:
    """The TextArena env inside its wrappers (its ``get_observation`` gives the raw new messages)."""
    import textarena as ta

    while isinstance(env, ta.Wrapper):
        env = env.env
    return env


class Table:
    """One TextArena game: made, reset by a seed, played move by move; the module-level ``random`` state TextArena
    seeds and draws from is this game's own (swapped in around each call)."""

    def __init__(self, textarena_id: str, env_kwargs: dict[str, Any], num_players: int) -> None:
        import textarena as ta

        self.num_players = num_players
        self._random = random.Random().getstate()
        with self._own_random():
            self.env = ta.make(textarena_id, **env_kwargs)
        self.inner = unwrapped(self.env)
        self.rewards: dict[int, float] | None = None
        self.attempts = [0] * num_players  # invalid moves TextArena let a player retry
        self.used = False

    @contextlib.contextmanager
    def _own_random(self) -> Iterator[None]:
        outer = random.getstate()
        random.setstate(self._random)
        try:
            yield
        finally:
            self._random = random.getstate()
            random.setstate(outer)

    def reset(self, seed: int | None) -> None:
        self.used = True
        with self._own_random():
            self.env.reset(num_players=self.num_players, seed=seed)

    def current(self) -> int:
        return int(self.inner.state.current_player_id)

    def observe(self) -> tuple[int, str]:
        """The player to move and the messages it got since its last turn, one ``[SENDER] text`` line each (its own
        moves, which TextArena echoes back, left out)."""
        with self._own_random():
            player, messages = self.inner.get_observation()
        roles = getattr(self.inner.state, "role_mapping", {})
        lines = []
        for sender, text, *_ in messages:
            if sender == player:  # its own move, echoed: the chat holds it already
                continue
            who = "GAME" if sender == -1 else roles.get(sender, f"Player {sender}")
            lines.append(f"[{who}] {text}")
        return int(player), "\n".join(lines)

    def step(self, action: str) -> bool:
        """Play the current player's move; True when the game is over (``rewards`` is then set)."""
        player = self.current()
        with self._own_random():
            done, _ = self.env.step(action)
        if getattr(self.inner.state, "made_invalid_move", False) or getattr(self.inner.state, "error_count", 0):
            self.attempts[player] += 1
        if done:
            with self._own_random():
                closed = self.env.close()
            rewards = closed[0] if isinstance(closed, tuple) else closed
            self.rewards = {int(k): float(v) for k, v in (rewards or {}).items()}
        return bool(done)

    def info(self, player: int) -> dict[str, float]:
        """Scalar counters of a player: TextArena's ``invalid_move`` (the game ended on one), retried invalid moves,
        its turns; and win/draw/loss by the rewards of a game over."""
        mine = getattr(self.inner.state, "game_info", {}).get(player, {})
        counters = {
            "invalid_move": float(bool(mine.get("invalid_move", False))),
            "invalid_attempts": float(self.attempts[player]),
            "turn_count": float(mine.get("turn_count", 0) or 0),
        }
        if self.rewards is not None and self.num_players > 1:
            total, values = self.rewards.get(player, 0.0), list(self.rewards.values())
            best = max(values) if values else 0.0
            counters.update(
                win=float(total == best and any(v < best for v in values)),
                draw=float(all(v == total for v in values)),
                loss=float(total < best),
            )
        return counters


def message_of(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


class TextArenaEnv(Env):
    """A one-player TextArena game as a multi-turn ``Env`` (module docstring).

    Args:
        textarena_id: the ID in TextArena's registry (``"GuessTheNumber-v0"``).
        env_kwargs: arguments of the game's constructor, over its registered ones.
    """

    def __init__(self, textarena_id: str, env_kwargs: dict[str, Any] | None = None) -> None:
        self.table = Table(textarena_id, dict(env_kwargs or {}), 1)  # a bad argument fails here, at make

    async def reset(self, state: dict[str, Any]) -> dict[str, Any]:
        self.table.reset(seed_from(state.get("label")))
        return {**state, "observation": message_of(self.table.observe()[1])}

    async def step(self, state: StepState) -> Result:
        if self.table.step(clean_action(state["action_text"])):
            return Result(reward=self.table.rewards.get(0, 0.0), terminated=True, info=self.table.info(0))
        return Result(
            reward=0.0, observation=message_of(self.table.observe()[1]), terminated=False, info=self.table.info(0)
        )


class TextArenaGame(Game):
    """A TextArena game of several players as a ``molt_envs.seats.Game``: seat ``player_i`` is TextArena's player
    ``i``; a seat's reward is TextArena's at the end of the game.

    Args:
        textarena_id: the ID in TextArena's registry (``"TicTacToe-v0"``).
        env_kwargs: arguments of the game's constructor, over its registered ones.
        num_players: how many play (one of the counts the game accepts).
        mode, opponent, seat_policies: who plays which seat (``molt_envs.seats.Game``); ``"random"`` is
            ``random_move``, and a scripted ``"pkg.mod:fn"`` player is called as ``fn(new messages as text, seat,
            TextArena env, rng)`` and returns its move as text.
    """

    def __init__(
        self,
        textarena_id: str,
        env_kwargs: dict[str, Any] | None = None,
        num_players: int = 2,
        mode: str = "self_play",
        opponent: str = RANDOM,
        seat_policies: dict[str, str] | None = None,
    ) -> None:
        self.table = Table(textarena_id, dict(env_kwargs or {}), num_players)
        self.textarena_id, self.env_kwargs = textarena_id, dict(env_kwargs or {})
        seats = [f"player_{i}" for i in range(num_players)]
        super().__init__(seats, mode=mode, opponent=opponent, seat_policies=seat_policies)

    def reset(self, seed: int | None) -> None:
        if self.table.used:  # a game reset again gets a fresh TextArena env
            self.table = Table(self.textarena_id, self.env_kwargs, len(self.seats))
        self.table.reset(seed)
        self.over = False

    def to_move(self) -> str | None:
        return None if self.over else self.seats[self.table.current()]

    def observe(self, seat: str, first: bool) -> list[dict[str, Any]]:
        return message_of(self.table.observe()[1])

    def play_text(self, seat: str, text: str) -> bool:
        self.over = self.table.step(clean_action(text))
        return not self.over

    def play_policy(self, seat: str, policy: Any, rng: random.Random) -> bool:
        move = policy(self.table.observe()[1], seat, self.table.env, rng)
        self.over = self.table.step(str(move))
        return not self.over

    def returns(self) -> dict[str, float]:
        rewards = self.table.rewards or {}
        return {seat: rewards.get(i, 0.0) for i, seat in enumerate(self.seats)}

    def info(self, seat: str) -> dict[str, float]:
        return self.table.info(self.seats.index(seat))

    def scripted(self, policy: str) -> Any:
        return random_move if policy == RANDOM else super().scripted(policy)


_LISTED = re.compile(r"(available|valid|legal|possible)\s+(moves|actions)", re.IGNORECASE)
_MOVE = re.compile(r"\[[^\[\]\n]{1,40}\]")
_ROLE = re.compile(r"\[(GAME|Player \d+)\]")
_ECHO = re.compile(r"^\[Player \d+\] ")  # a player's move, as TextArena echoes it to the others


def random_move(observation: str, agent: str, env: Any, rng: random.Random) -> str:
    """The ``"random"`` player of a TextArena game: a uniformly random one of the ``[moves]`` the game lists to the
    seat (the last line naming available/valid/legal moves), else of the ``[...]`` in the game's new messages to it
    (examples of the move format, board coordinates); with none, an empty move, which the game's rules treat as
    invalid. A legal random player only where the game lists its legal moves (tic-tac-toe does), a heuristic
    elsewhere."""
    lines = [line for line in observation.splitlines() if not _ECHO.match(line)]
    listed = [line for line in lines if _LISTED.search(line)]
    for text in (" ".join(listed[-1:]), "\n".join(lines)):
        moves = [m for m in _MOVE.findall(text) if not _ROLE.fullmatch(m)]
        if moves:
            return rng.choice(moves)
    return ""


def seed_rows(
    split: str, size: int, seed: int, players: int = 1, vs_random: bool = False, **env_kwargs: Any
) -> Iterator[dict[str, Any]]:
    """Rows whose label makes row ``i`` reset the game with seed ``seed + i``; ``vs_random``: the model plays one seat
    (seat ``i % players``) against ``random_move`` players."""
    for i in range(size):
        label: dict[str, Any] = {"seed": seed + i}
        if vs_random:
            label.update(mode="vs", opponent=RANDOM, model_seat=i % players)
        yield {"prompt": f"TextArena game, seed {seed + i}", "label": label}
