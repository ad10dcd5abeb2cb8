"""``textarena:ID``: TextArena 0.7.4's games, for real. The catalog (every registered ID, available or why not, from a
real offline probe), a one-player puzzle played to its end through its env server with TextArena's exact reward, a
two-player game through the seats (self-play, vs a random player, TextArena's invalid-move rule), bad input, and
``molt-env check``."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

import env_registry
from env_registry.datasets import load_split
from env_registry.ecosystems.adapter import MissingLibrary
from env_registry.ecosystems.textarena.play import TextArenaGame
from env_registry.ecosystems.textarena.source import SOURCE
from env_registry.errors import NameNotFound, UnregisteredEnv
from env_registry.remote import RemoteEnvSpec, RemoteGame
from env_registry.runners import runner_for
from molt_envs import SamplingParams
from molt_envs.engine import Generation
from molt_envs.replay_model import ByteChatTokenizer, ReplayEngine
from molt_envs.seats import SeatRunner

textarena = pytest.importorskip("textarena")
from textarena.envs.registration import ENV_REGISTRY  # noqa: E402

MOLT_ENV = str(Path(sys.executable).with_name("molt-env"))
TOK = ByteChatTokenizer()
PARAMS = SamplingParams(max_tokens=64)


@pytest.fixture(scope="module", autouse=True)
def probed(tmp_path_factory):
    """A fresh ``$MOLT_CACHE`` for this module (its env servers inherit it), filled by one full availability probe."""
    previous = os.environ.get("MOLT_CACHE")
    os.environ["MOLT_CACHE"] = str(tmp_path_factory.mktemp("molt-cache"))
    started = time.monotonic()
    entries = SOURCE.catalog()
    print(f"probing {len(entries)} TextArena IDs took {time.monotonic() - started:.1f} s")
    yield {e.env_id: e for e in entries}
    if previous is None:
        os.environ.pop("MOLT_CACHE")
    else:
        os.environ["MOLT_CACHE"] = previous


class TextEngine:
    """Replies ``fn(context so far as text)``, then end-of-turn (no model)."""

    def __init__(self, fn):
        self.fn = fn

    async def generate(self, prompt_ids, params, images=None) -> Generation:
        ids = TOK.encode(self.fn(TOK.decode(prompt_ids))) + [TOK.eos_token_id]
        return Generation(ids, [0.0] * len(ids), "stop")


def first_available(context: str) -> str:
    """Tic-tac-toe: the first square of the last ``Available Moves`` line this seat was shown."""
    return "I play " + re.findall(r"\[\d\]", re.findall(r"Available Moves: (.*)", context)[-1])[0]


def textarena_rewards(name: str, players: int, seed: int, moves: list[str]) -> dict[int, float]:
    """What TextArena itself pays for ``moves`` played in turn, from its own ``make``/``reset``/``step``/``close``."""
    env = textarena.make(name)
    env.reset(num_players=players, seed=seed)
    for move in moves:
        done, _ = env.step(move)
        if done:
            break
    assert done, "the moves did not end the game"
    return env.close()[0]


def secret_number(seed: int) -> int:
    env = textarena.make("GuessTheNumber-v0")
    env.reset(num_players=1, seed=seed)
    return env.state.game_state["game_number"]


def test_the_catalog_lists_every_registered_id_with_its_availability(probed):
    variants = {i for i in ENV_REGISTRY for v in ("-train", "-raw") if i.endswith(v) and i[: -len(v)] in ENV_REGISTRY}
    assert set(probed) == {f"textarena:{i}" for i in set(ENV_REGISTRY) - variants}
    assert len(probed) == 238 and len(ENV_REGISTRY) == 712  # 474 are -train/-raw copies with other wrappers
    available = [e for e in probed.values() if e.available]
    assert len(available) >= 150, [(e.env_id, e.reason) for e in probed.values() if not e.available]
    assert all(e.reason for e in probed.values() if not e.available)
    ttt, guess = probed["textarena:TicTacToe-v0"], probed["textarena:GuessTheNumber-v0"]
    assert (ttt.kind, ttt.available, ttt.description) == ("game", True, "2 players")
    assert (guess.kind, guess.available, guess.description) == ("env", True, "1 player")
    assert probed["textarena:Poker-v0"].description == "2-15 players"
    debate = probed["textarena:Debate-v0"]
    assert not debate.available and "OpenRouter" in debate.reason
    if sys.version_info < (3, 12):  # TextArena's chess uses Python 3.12 f-strings
        assert "does not compile under Python 3.11" in probed["textarena:Chess-v0"].reason
    wordle = probed["textarena:Wordle-v0"]
    assert wordle.available or "NLTK" in wordle.reason
    # the CLI lists from the cache: fast, and the same counts
    started = time.monotonic()
    out = subprocess.run([MOLT_ENV, "list", "--source", "textarena"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert time.monotonic() - started < 20
    summary = f"238 IDs of textarena:, {len(available)} available, {238 - len(available)} unavailable"
    assert out.stdout.splitlines()[-1] == summary
    assert re.search(r"textarena:Debate-v0 +game +unavailable: calls an LLM through OpenRouter", out.stdout)


async def test_a_puzzle_is_played_to_its_end_through_its_env_server_with_textarenas_reward():
    spec = env_registry.spec("textarena:GuessTheNumber-v0")
    assert isinstance(spec, RemoteEnvSpec) and spec.kind == "env"  # its own env server process
    assert spec.upstream == {"ecosystem": "textarena", "library": "textarena", "version": "0.7.4", "license": "MIT"}
    runner = runner_for("textarena:GuessTheNumber-v0")

    def bisect(context: str) -> str:  # reads TextArena's higher/lower hints back from the chat
        lo, hi = 1, 20
        for guess, hint in re.findall(
            r"\[(\d+)\]<\|im_end\|>\n<\|im_start\|>user\n\[GAME\][^<]*?(higher|lower)", context
        ):
            lo, hi = (max(lo, int(guess) + 1), hi) if hint == "higher" else (lo, min(hi, int(guess) - 1))
        return f"My guess: [{(lo + hi) // 2}]"

    won = await runner.execute("game", {"seed": 7}, PARAMS, 8192, TOK, TextEngine(bisect))
    assert won.ok, won.failure
    assert won.reward == 1.0 and won.info["invalid_move"] == 0.0 and 1 < won.num_turns <= 5
    text = TOK.decode(won.token_ids)
    assert text.startswith("<|im_start|>user\n[GAME] You are Player 0. You are playing Guess The Number.")
    assert "[Player]" not in text  # its own guesses are not echoed back: they are in the chat already

    # a row whose number is above 11, guessed 1..11: TextArena's turn limit (its 10 turns end after the 11th guess)
    # and its partial reward for the last guess's distance, exactly
    seed = next(s for s in range(100) if secret_number(s) > 11)
    guesses = [f"[{g}]" for g in range(1, 12)]
    expected = textarena_rewards("GuessTheNumber-v0", 1, seed, guesses)[0]
    lost = await runner.execute("game", {"seed": seed}, PARAMS, 8192, TOK, ReplayEngine(TOK, guesses))
    assert lost.ok, lost.failure
    assert lost.num_turns == 11 and lost.reward == expected == 1 - (secret_number(seed) - 11) / 19
    again = await runner.execute("game", {"seed": seed}, PARAMS, 8192, TOK, ReplayEngine(TOK, guesses))
    assert again.token_ids == lost.token_ids  # the samples of one row play the same game


async def test_self_play_gives_one_trajectory_per_seat_with_opposite_rewards():
    spec = env_registry.spec("textarena:TicTacToe-v0")
    assert spec.kind == "game" and isinstance(spec, RemoteEnvSpec)  # games run in their env server too
    x, o = await runner_for("textarena:TicTacToe-v0").execute(
        "game", {"seed": 3}, PARAMS, 8192, TOK, TextEngine(first_available)
    )
    assert (x.seat, o.seat) == ("player_0", "player_1") and x.ok and o.ok
    assert (x.info["seat"], o.info["seat"]) == ("player_0", "player_1")
    # each seat plays the first free square: 0, 1, 2, 3, 4, 5, 6 -- player 0 completes the diagonal 2-4-6
    assert textarena_rewards("TicTacToe-v0", 2, 3, [f"[{i}]" for i in range(9)]) == {0: 1, 1: -1}
    assert (x.reward, o.reward) == (1.0, -1.0) and (x.num_turns, o.num_turns) == (4, 3)
    assert (x.info["win"], o.info["loss"], x.rollout_id != o.rollout_id) == (1.0, 1.0, True)
    assert "You are Player 1 in Tic Tac Toe" in TOK.decode(o.token_ids)


IN_A_FRESH_PROCESS = """
import asyncio, json, os, re, sys
import env_registry
from env_registry.remote import RemoteGame
from molt_envs import SamplingParams
from molt_envs.engine import Generation
from molt_envs.replay_model import ByteChatTokenizer

TOK = ByteChatTokenizer()

class FirstAvailable:
    async def generate(self, prompt_ids, params, images=None):
        context = TOK.decode(prompt_ids)
        move = re.findall(r"\\[\\d\\]", re.findall(r"Available Moves: (.*)", context)[-1])[0]
        ids = TOK.encode("I play " + move) + [TOK.eos_token_id]
        return Generation(ids, [0.0] * len(ids), "stop")

game = env_registry.make("textarena:TicTacToe-v0")
server = env_registry.spec("textarena:TicTacToe-v0").endpoint().server.process.pid
made = [type(game).__name__, isinstance(game, RemoteGame), game.seats]
game.close()
runner = env_registry.runner_for("textarena:TicTacToe-v0")
trajs = asyncio.run(runner.execute("game", {"seed": 3}, SamplingParams(max_tokens=64), 8192, TOK, FirstAvailable()))
print(json.dumps({
    "made": made, "server": server, "me": os.getpid(), "textarena": "textarena" in sys.modules,
    "trajs": [[t.seat, t.reward, t.num_turns, t.failure, t.token_ids] for t in trajs],
}))
"""


async def test_a_game_plays_in_its_env_server_exactly_as_in_process():
    """The game lives in its env server (a fresh process making it never imports TextArena itself), and a game
    through the wire is token for token the game in process: self-play and against a random player (whose moves
    are drawn in the server from the runner's random state)."""
    out = subprocess.run([sys.executable, "-c", IN_A_FRESH_PROCESS], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.splitlines()[-1])
    assert seen["made"] == ["RemoteGame", True, ["player_0", "player_1"]]
    assert seen["server"] != seen["me"] and not seen["textarena"]
    in_process = SeatRunner(lambda: TextArenaGame("TicTacToe-v0"), env_id="textarena:TicTacToe-v0")
    x, o = await in_process.execute("game", {"seed": 3}, PARAMS, 8192, TOK, TextEngine(first_available))
    assert [[t.seat, t.reward, t.num_turns, t.failure, t.token_ids] for t in (x, o)] == seen["trajs"]
    assert x.reward + o.reward == 0.0 and (x.reward, o.reward) == (1.0, -1.0)

    remote = runner_for("textarena:TicTacToe-v0")
    assert isinstance(env_registry.make("textarena:TicTacToe-v0"), RemoteGame)
    for label in (
        {"seed": 3},
        *({"seed": s, "mode": "vs", "opponent": "random", "model_seat": s % 2} for s in range(4)),
    ):
        there = await remote.execute("game", label, PARAMS, 8192, TOK, TextEngine(first_available))
        here = await in_process.execute("game", label, PARAMS, 8192, TOK, TextEngine(first_available))
        assert len(there) == len(here) and all(t.ok for t in there), [t.failure for t in there]
        for a, b in zip(there, here, strict=True):
            assert (a.seat, a.token_ids, a.reward, a.info, a.num_turns) == (
                b.seat,
                b.token_ids,
                b.reward,
                b.info,
                b.num_turns,
            )


async def test_a_served_game_plays_checkpoint_seats_here_and_scripted_seats_there():
    """A frozen checkpoint's seat is generated by the caller (the runner's engine) and crosses as text; a policy that
    is code of the caller's process cannot be played by the server and says so."""
    runner = runner_for("textarena:TicTacToe-v0")
    runner.engines["checkpoint:/frozen"] = (TextEngine(first_available), TOK)
    label = {"seed": 3, "mode": "vs", "opponent": "checkpoint:/frozen", "model_seat": 0}
    (x,) = await runner.execute("game", label, PARAMS, 8192, TOK, TextEngine(first_available))
    assert x.ok and (x.seat, x.reward, x.num_turns) == ("player_0", 1.0, 4)  # the first-free-square game above
    game = env_registry.make("textarena:TicTacToe-v0")
    try:
        game.reset(0)
        with pytest.raises(TypeError, match="plays only its scripted"):
            game.play_policy("player_0", lambda *args: "[4]", random.Random(0))
    finally:
        game.close()


async def test_the_test_split_plays_one_seat_against_a_random_player():
    spec = env_registry.spec("textarena:TicTacToe-v0")
    rows = load_split(spec, "test", 4)
    assert [r["label"]["model_seat"] for r in rows] == [0, 1, 0, 1] and rows[0]["label"]["mode"] == "vs"
    assert rows[0]["label"]["seed"] == 1_000_000 and load_split(spec, "train", 1)[0]["label"] == {"seed": 0}
    runner = runner_for("textarena:TicTacToe-v0")
    for row in rows:
        (traj,) = await runner.execute("game", row["label"], PARAMS, 8192, TOK, TextEngine(first_available))
        assert traj.ok and traj.seat == f"player_{row['label']['model_seat']}"
        assert traj.info["win"] + traj.info["draw"] + traj.info["loss"] == 1.0
        assert "attempted an invalid move" not in TOK.decode(traj.token_ids)  # the random player moves legally


async def test_an_invalid_move_follows_textarenas_rule_a_retry_then_the_loss():
    (traj,) = await runner_for("textarena:TicTacToe-v0").execute(
        "game", {"seed": 0}, PARAMS, 8192, TOK, TextEngine(lambda context: "no idea")
    )  # player_1 never moved: no trajectory of its own
    assert traj.ok and traj.seat == "player_0" and traj.num_turns == 2
    assert traj.reward == -1.0 and traj.info["invalid_move"] == 1.0 and traj.info["invalid_attempts"] == 1.0
    assert "Player 0 attempted an invalid move" in TOK.decode(traj.token_ids)


def test_a_game_keeps_its_random_state_apart_from_the_callers():
    random.seed(123)
    expected = random.random()
    random.seed(123)
    game = TextArenaGame("TicTacToe-v0")
    game.reset(5)  # TextArena seeds the module-level random with 5
    while (seat := game.to_move()) is not None:
        game.play_text(seat, first_available(game.observe(seat, first=False)[0]["content"]))
    assert random.random() == expected


@pytest.mark.parametrize(
    ("env_id", "error", "message"),
    [
        ("textarena:TicTacToe", NameNotFound, "has no env 'TicTacToe'. Did you mean textarena:TicTacToe-v0"),
        (
            "textarena:TicTacToe-v0-train",
            UnregisteredEnv,
            "with other observation wrappers.*use textarena:TicTacToe-v0",
        ),
        (
            "textarena:GuessTheNumber-v0?max_numbr=5",
            UnregisteredEnv,
            "takes no argument 'max_numbr'; it takes: max_number, max_turns, min_number",
        ),
        ('textarena:GuessTheNumber-v0?max_number="x"', UnregisteredEnv, "its max_number is of type int"),
        ("textarena:GuessTheNumber-v0?max_number=0", UnregisteredEnv, "does not run with {'max_number': 0}: fails at"),
        ("textarena:Poker-v0?num_players=20", UnregisteredEnv, "num_players=20; it is for 2-15 players"),
        ("textarena:Poker-v0?opponent=nobody", UnregisteredEnv, "opponent 'nobody' is not a policy"),
        ("textarena:Debate-v0", UnregisteredEnv, "not available here: calls an LLM through OpenRouter"),
    ],
)
def test_bad_input_fails_at_resolve_time_naming_it(env_id, error, message):
    with pytest.raises(error, match=message):
        env_registry.spec(env_id)


def test_kwargs_reach_textarena(probed):
    spec = env_registry.spec("textarena:GuessTheNumber-v0?max_number=50")
    assert spec.kwargs == {"textarena_id": "GuessTheNumber-v0", "env_kwargs": {"max_number": 50}}
    assert spec.hash != env_registry.spec("textarena:GuessTheNumber-v0").hash
    poker = env_registry.spec("textarena:Poker-v0?num_players=4")
    assert poker.kwargs["num_players"] == 4 and poker.datasets["test"].kwargs["players"] == 4


def test_without_textarena_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "textarena", None)  # what find_spec reports for a module that is not there
    with pytest.raises(MissingLibrary, match=r"pip install 'molt-ecosystem\[textarena\]'"):
        env_registry.spec("textarena:TicTacToe-v0")


def test_molt_env_check_passes():
    out = subprocess.run([MOLT_ENV, "check", "textarena:TicTacToe-v0"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "PASS  row 0: garbage action" in out.stdout and out.stdout.rstrip().endswith("0 failed")


async def test_a_real_model_plays_the_seats_token_exact(tiny_engine, tiny_tokenizer):
    """A tiny model built from scratch plays both seats through its own chat template: whatever it writes, each
    seat's trajectory holds exactly its generated tokens and log-probs, and the game stays zero-sum."""
    trajs = await runner_for("textarena:TicTacToe-v0").execute(
        "game", {"seed": 1}, SamplingParams(max_tokens=8, seed=0), 4096, tiny_tokenizer, tiny_engine
    )
    assert trajs and all(t.ok for t in trajs), [t.failure for t in trajs]
    assert trajs[0].seat == "player_0" and sum(t.reward for t in trajs) in (0.0, -1.0)  # -1: player_1 never moved
    for traj in trajs:
        assert len(traj.log_probs) == len(traj.token_ids) and len(traj.action_ranges) == traj.num_turns
        assert traj.reward in (-1.0, 0.0, 1.0)
