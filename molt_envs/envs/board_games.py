"""``molt/tictactoe-v1`` to ``-v4`` and ``molt/connect-four-v1``: PettingZoo's classic board games as
multi-seat text games (``molt_envs.bridges.PettingZooGame``), self-play by default.

The first seat plays ``X``, the second ``O``. Each turn a seat is shown the board; free tic-tac-toe squares show
their number (``-v2`` adds a ``Free:`` line listing them: the same game and rewards, another observation; ``-v3``
lists them in a shuffled order seeded by the position, so the last listed square is a uniformly random legal move
that a model can copy from a fixed place; ``-v4``, ``TicTacToeGame``, seeds that order by the game too), and
connect four shows the column numbers above the board. The model may think first: the last number of its reply is
the move. A reply without a number, or a move onto a taken square or a full column, forfeits the
game (-1 for the seat, +1 for the other): a counted ``illegal_move``, never a crash.

Splits (``game_split``): ``train`` is self-play episode seeds; ``test`` plays against a uniformly random player,
the model taking each seat in turn; ``sft`` is positions of random games with a random legal move as the
reference reply (what a model is fine-tuned on before RL; ``-v3``'s is the last square its ``Free:`` line lists).
The three draw from disjoint seed ranges.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

from molt_envs.bridges import PettingZooGame

MARKS = ("X", "O")


def _marks(agent: str, env: Any) -> tuple[str, str]:
    me = env.possible_agents.index(agent)
    return MARKS[me], MARKS[1 - me]


def tictactoe_board(observation: Any, agent: str, env: Any) -> str:
    """``molt/tictactoe-v1``'s board: three rows; a free square shows its number (0-8), a taken one its mark."""
    planes = observation["observation"]
    me, other = _marks(agent, env)
    rows = []
    for r in range(3):
        cells = [me if planes[r][c][0] else other if planes[r][c][1] else str(3 * r + c) for c in range(3)]
        rows.append(" ".join(cells))
    return "\n".join(rows)


def tictactoe_board_free(observation: Any, agent: str, env: Any) -> str:
    """``molt/tictactoe-v2``'s board: ``-v1``'s three rows, then a ``Free:`` line listing the free squares (the legal
    moves spelled out, as text-game suites do, so a small model can copy one)."""
    free = [str(i) for i, ok in enumerate(observation["action_mask"]) if ok]
    return tictactoe_board(observation, agent, env) + "\nFree: " + " ".join(free)


def shuffled_free(observation: Any, game_seed: int | None = None) -> list[int]:
    """The legal moves in a shuffled order seeded by the position (the observation's planes and mask), so one
    position always lists them the same way: ``molt/tictactoe-v3``'s ``Free:`` order. ``game_seed`` (``-v4``)
    seeds it by the game too: one position is listed in another order in another game."""
    free = [i for i, ok in enumerate(observation["action_mask"]) if ok]
    key = "".join(str(int(v)) for v in observation["observation"].reshape(-1)) + "/" + "".join(map(str, free))
    if game_seed is not None:
        key += f"/game {game_seed}"
    random.Random(key).shuffle(free)
    return free


def tictactoe_board_shuffled(observation: Any, agent: str, env: Any) -> str:
    """``molt/tictactoe-v3``'s board: ``-v2``'s, its ``Free:`` line in ``shuffled_free``'s order (the last listed
    square, a fixed distance before the reply, is a uniformly random legal move: what the ``sft`` split replies)."""
    free = " ".join(str(i) for i in shuffled_free(observation))
    return tictactoe_board(observation, agent, env) + "\nFree: " + free


class TicTacToeGame(PettingZooGame):
    """``molt/tictactoe-v4``'s game: ``-v3``'s board, its ``Free:`` line shuffled by the position *and the game's
    seed* (``shuffled_free(observation, seed)``), so one position is listed in another order in another game.

    Why (molt_envs/README.md): a model SFT'd to reply one of the last listed squares plays, at temperature 1, one
    of two squares that ``-v3`` fixes by the position, so self-play games from an empty board are a few lines of
    play repeated, and RL self-play collapsed on them; seeded by the game too, those two squares are a random pair
    of the free ones in each game, and self-play from the same start raises the rate against a random player.
    The observation formatter is this class's (``observation_formatter`` is not used)."""

    game_seed: int | None = None

    def reset(self, seed: int | None) -> None:
        super().reset(seed)
        self.game_seed = seed

    def observe(self, seat: str, first: bool) -> list[dict[str, Any]]:
        observation = self.env.observe(seat)
        free = " ".join(str(i) for i in shuffled_free(observation, self.game_seed))
        messages = [{"role": "user", "content": tictactoe_board(observation, seat, self.env) + "\nFree: " + free}]
        if first and self.instructions is not None:
            messages.insert(0, {"role": "system", "content": self.instructions(seat, self.env)})
        return messages


def tictactoe_rules(agent: str, env: Any) -> str:
    me, other = _marks(agent, env)
    return f"Tic-tac-toe. You are {me}, your opponent is {other}. Reply with the number of a free square."


def connect_four_board(observation: Any, agent: str, env: Any) -> str:
    """Column numbers, then six rows top to bottom (``.`` empty)."""
    planes = observation["observation"]
    me, other = _marks(agent, env)
    rows = ["".join(me if cell[0] else other if cell[1] else "." for cell in row) for row in planes]
    return "0123456\n" + "\n".join(rows)


def connect_four_rules(agent: str, env: Any) -> str:
    me, other = _marks(agent, env)
    return (
        f"Connect four. You are {me}, your opponent is {other}. Four in a row (across, down or diagonal) wins. "
        "Reply with the number of a column that is not full."
    )


def game_split(
    split: str, size: int, seed: int, rows: str, game_seeded: bool = False, **game_kwargs: Any
) -> Iterator[dict[str, Any]]:
    """Dataset rows of a game (``rows``: ``self_play``, ``vs_random``, ``random_moves`` or ``listed_moves``, whose
    reply is the last square ``shuffled_free`` lists; module docstring).

    ``game_kwargs`` are the env's kwargs (the split sets ``env_kwargs = true``): ``random_moves`` plays the very
    game the env makes, so its prompts are exactly what a seat sees. ``game_seeded``: that game is
    ``TicTacToeGame`` (``-v4``: the ``Free:`` order seeded by the game too).
    """
    if rows == "self_play":
        for k in range(seed, seed + size):
            yield {"prompt": "self-play game", "label": {"seed": k}}
    elif rows == "vs_random":
        for i, k in enumerate(range(seed, seed + size)):
            yield {
                "prompt": "game against a random player",
                "label": {"seed": k, "mode": "vs", "opponent": "random", "model_seat": i % 2},
            }
    elif rows in ("random_moves", "listed_moves"):
        yield from _random_move_rows(size, seed, game_kwargs, listed=rows == "listed_moves", game_seeded=game_seeded)
    else:
        raise ValueError(f"rows {rows!r} is not one of 'self_play', 'vs_random', 'random_moves', 'listed_moves'")


def _random_move_rows(
    size: int, seed: int, game_kwargs: dict[str, Any], listed: bool, game_seeded: bool = False
) -> Iterator[dict[str, Any]]:
    """Every position of random games, as the seat's whole conversation so far and a random legal reply.

    ``listed``: the reply is the last square ``shuffled_free`` lists (a fixed function of the position, so one seat
    of each game, alternating with the game, plays it and gives the rows, while the other plays uniformly random
    moves and gives none: otherwise every game would be the same game)."""
    from molt_envs.scripted import random_legal_action

    game = (TicTacToeGame if game_seeded else PettingZooGame)(**game_kwargs)
    produced, k = 0, seed
    while produced < size:
        rng = random.Random(k)
        game.reset(k)
        history: dict[str, list[dict[str, Any]]] = {s: [] for s in game.seats}
        lister = game.seats[k % 2]
        while (seat := game.to_move()) is not None and produced < size:
            messages = history[seat] + game.observe(seat, first=not history[seat])
            observation = game.env.observe(seat)
            if listed and seat == lister:
                move = str(shuffled_free(observation, k if game_seeded else None)[-1])
            else:
                move = str(random_legal_action(observation, seat, game.env, rng))
            if seat == lister or not listed:
                yield {"prompt": messages, "label": {"seed": k}, "reference": move}
                produced += 1
            history[seat] = [*messages, {"role": "assistant", "content": move}]
            game.play_text(seat, move)
        k += 1
    game.close()
