"""Gymnasium's ``toy_text`` games as text envs (``gym/frozen-lake-v1``, ``gym/taxi-v1``, ``gym/cliff-walking-v1``,
``gym/blackjack-v1``), run by ``molt_envs.bridges.GymnasiumEnv``: the formatters draw the state as text, the parsers
read the model's move.

Action grammar: the model may think first; the last action word of its reply is the move (case-insensitive, e.g.
"the hole is below me, so: right"). A reply with no action word ends the episode as a counted ``invalid_action``.
Each dataset row is an episode seed; the train and test seed ranges are disjoint.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from molt_envs.bridges import clean_action


def _last_word(text: str, words: tuple[str, ...]) -> int:
    found = re.findall(r"\b(" + "|".join(words) + r")\b", clean_action(text).lower())
    if not found:
        raise ValueError(f"no move ({', '.join(words)}) in {text[-80:]!r}")
    return words.index(found[-1])


def seed_split(split: str, size: int, seed: int, name: str) -> Iterator[dict[str, Any]]:
    """Rows ``{"prompt": "<name> episode <k>", "label": k}`` for seeds ``seed .. seed + size - 1``."""
    for k in range(seed, seed + size):
        yield {"prompt": f"{name} episode {k}", "label": k}


# -- FrozenLake: 0 left, 1 down, 2 right, 3 up
LAKE_MOVES = ("left", "down", "right", "up")


def frozen_lake_move(text: str) -> int:
    return _last_word(text, LAKE_MOVES)


def frozen_lake_board(observation: Any, env: Any) -> str:
    """The map with ``@`` where the player stands (S start, F ice, H hole, G goal)."""
    rows = [[c.decode() for c in row] for row in env.desc]
    ncol = len(rows[0])
    rows[int(observation) // ncol][int(observation) % ncol] = "@"
    return "\n".join("".join(row) for row in rows) + "\nYour move (left, down, right or up)?"


# -- Taxi: 0 south, 1 north, 2 east, 3 west, 4 pickup, 5 dropoff
TAXI_MOVES = ("south", "north", "east", "west", "pickup", "dropoff")
_TAXI_STOPS = "RGYB"


def taxi_move(text: str) -> int:
    return _last_word(text, TAXI_MOVES)


def taxi_board(observation: Any, env: Any) -> str:
    """The map (``|`` walls) with ``T`` for the taxi, then where the passenger is and where they go."""
    row, col, passenger, destination = env.decode(int(observation))
    lines = [[c.decode() for c in line] for line in env.desc]
    lines[1 + row][2 * col + 1] = "T"
    where = "in the taxi" if passenger == 4 else f"waiting at {_TAXI_STOPS[passenger]}"
    return (
        "\n".join("".join(line) for line in lines)
        + f"\nPassenger: {where}. Destination: {_TAXI_STOPS[destination]}."
        + "\nYour move (south, north, east, west, pickup or dropoff)?"
    )


# -- CliffWalking: 0 up, 1 right, 2 down, 3 left
CLIFF_MOVES = ("up", "right", "down", "left")


def cliff_move(text: str) -> int:
    return _last_word(text, CLIFF_MOVES)


def cliff_board(observation: Any, env: Any) -> str:
    """The 4 x 12 grid: ``@`` the player, ``C`` the cliff, ``G`` the goal, ``.`` safe ground."""
    nrow, ncol = env.shape
    cells = [["." for _ in range(ncol)] for _ in range(nrow)]
    for c in range(1, ncol - 1):
        cells[nrow - 1][c] = "C"
    cells[nrow - 1][ncol - 1] = "G"
    cells[int(observation) // ncol][int(observation) % ncol] = "@"
    return "\n".join("".join(row) for row in cells) + "\nYour move (up, right, down or left)?"


# -- Blackjack: 0 stick, 1 hit
BLACKJACK_MOVES = ("stick", "hit")


def blackjack_move(text: str) -> int:
    return _last_word(text, BLACKJACK_MOVES)


def blackjack_hand(observation: Any, env: Any) -> str:
    player, dealer, usable_ace = (int(x) for x in observation)
    ace = " (with an ace counted as 11)" if usable_ace else ""
    shows = "an ace" if dealer == 1 else str(dealer)
    return f"Your cards total {player}{ace}. The dealer shows {shows}.\nYour move (hit or stick)?"
