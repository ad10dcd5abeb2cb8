"""Multi-seat games: real PettingZoo tic-tac-toe and connect four through ``SeatRunner`` (self-play, vs a random or
scripted player, a frozen checkpoint's engine), and the one-seat ``Env`` view."""

from __future__ import annotations

import random
import re

import pytest
from chat_support import ScriptedEngine

import env_registry
from molt_envs import SamplingParams
from molt_envs.seats import OneSeatEnv, SeatRunner

TTT = "molt/tictactoe-v2"  # the board ends with a ``Free:`` line; molt/tictactoe-v1 is the same game without it
TTT_V1 = "molt/tictactoe-v1"
TTT_V3 = "molt/tictactoe-v3"  # the Free line in a shuffled order seeded by the position
TTT_V4 = "molt/tictactoe-v4"  # ... seeded by the position and the game


def free_squares(prompt_ids, tokenizer) -> list[int]:
    """The free squares of the last board a seat was shown (the numbers on it)."""
    text = tokenizer.decode(prompt_ids)
    board = text.rsplit("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]
    return [int(c) for c in board.split() if c.isdigit()]


def first_free(n, prompt_ids, tokenizer):
    return f"I take square {free_squares(prompt_ids, tokenizer)[0]}"


async def run(runner, label, engine, tokenizer, max_length=1024):
    return await runner.execute("game", label, SamplingParams(max_tokens=16), max_length, tokenizer, engine)


async def test_self_play_gives_one_token_exact_trajectory_per_seat(tiny_tokenizer):
    runner = env_registry.runner_for(TTT)
    assert isinstance(runner, SeatRunner)
    engine = ScriptedEngine(tiny_tokenizer, lambda n, ids: first_free(n, ids, tiny_tokenizer))
    trajs = await run(runner, {"seed": 3}, engine, tiny_tokenizer)
    assert [t.seat for t in trajs] == ["player_1", "player_2"]
    x, o = trajs
    assert all(t.ok for t in trajs), [t.failure for t in trajs]
    # X plays 0, O 1, X 2, O 3, X 4, O 5, X 6: X completes the diagonal 2-4-6 on its 4th move
    assert (x.reward, o.reward) == (1.0, -1.0) and x.reward + o.reward == 0.0
    assert (x.info["win"], o.info["loss"], x.info["seat"]) == (1.0, 1.0, "player_1")
    assert (x.num_turns, o.num_turns) == (4, 3)
    assert x.rollout_id != o.rollout_id and x.env_id == TTT and x.spec_hash == env_registry.spec(TTT).hash
    for traj in trajs:
        assert len(traj.log_probs) == len(traj.token_ids) and len(traj.action_ranges) == traj.num_turns
        # every generate call of this seat saw exactly this seat's context so far: token-exact, nothing re-tokenized
        calls = [c for c in engine.calls if traj.token_ids[: len(c[0])] == c[0]]
        assert len(calls) == traj.num_turns
        for (start, end), (_, _, gen) in zip(traj.action_ranges, calls, strict=True):
            assert traj.token_ids[start:end] == gen.token_ids and traj.log_probs[start:end] == gen.log_probs
    text = tiny_tokenizer.decode(x.token_ids)
    assert text.startswith("<|im_start|>system\nTic-tac-toe. You are X, your opponent is O.")
    assert "<|im_start|>user\nX O X\nO 4 5\n6 7 8\nFree: 4 5 6 7 8<|im_end|>" in text  # the board X saw, 3rd move
    assert "You are O" in tiny_tokenizer.decode(o.token_ids)


async def test_v1_keeps_its_board_text_and_v2_adds_the_free_line(tiny_tokenizer):
    """``-v1`` shows the board exactly as before the ``Free:`` line existed; ``-v2`` is the same game (moves,
    rewards, turns) whose boards end with it. Pinning the older version works, with Gymnasium's out-of-date warning."""
    out_of_date = "'molt/tictactoe-v1' is out of date; consider molt/tictactoe-v4"
    with pytest.warns(env_registry.DeprecatedEnvWarning, match=out_of_date):
        v1_runner = env_registry.runner_for(TTT_V1)
    games = {}
    for env_id, runner in ((TTT_V1, v1_runner), (TTT, env_registry.runner_for(TTT))):
        engine = ScriptedEngine(tiny_tokenizer, lambda n, ids: first_free(n, ids, tiny_tokenizer))
        games[env_id] = await run(runner, {"seed": 3}, engine, tiny_tokenizer)
    (x1, o1), (x2, o2) = games[TTT_V1], games[TTT]
    outcomes = [(t.reward, t.num_turns) for t in (x1, o1)]
    assert outcomes == [(t.reward, t.num_turns) for t in (x2, o2)] == [(1.0, 4), (-1.0, 3)]
    assert x1.env_id == TTT_V1 and x1.spec_hash == env_registry.spec(TTT_V1).hash != env_registry.spec(TTT).hash
    v1_text, v2_text = tiny_tokenizer.decode(x1.token_ids), tiny_tokenizer.decode(x2.token_ids)
    # the pre-e1e9ca0 board X saw before its 3rd move, byte for byte, and no Free line anywhere in the game
    assert "<|im_start|>user\nX O X\nO 4 5\n6 7 8<|im_end|>" in v1_text and "Free" not in v1_text
    assert "<|im_start|>user\nX O X\nO 4 5\n6 7 8\nFree: 4 5 6 7 8<|im_end|>" in v2_text
    assert v2_text.count("\nFree: ") == x2.num_turns  # every board X was shown ends with it
    assert re.sub(r"\nFree:[ 0-9]*", "", v2_text) == v1_text  # and that line is all that differs


async def test_vs_random_returns_only_the_model_seat_and_its_outcome(tiny_tokenizer):
    runner = env_registry.runner_for(TTT, mode="vs", opponent="random")
    engine = ScriptedEngine(tiny_tokenizer, lambda n, ids: first_free(n, ids, tiny_tokenizer))
    outcomes = []
    for seed in range(6):
        (traj,) = await run(runner, {"seed": seed}, engine, tiny_tokenizer)
        assert traj.ok and traj.seat == ["player_1", "player_2"][seed % 2]  # the model seat alternates with the seed
        assert traj.info["win"] + traj.info["draw"] + traj.info["loss"] == 1.0
        assert traj.reward == traj.info["win"] - traj.info["loss"]
        outcomes.append(traj.reward)
    again = [(await run(runner, {"seed": s}, engine, tiny_tokenizer))[0].reward for s in range(6)]
    assert again == outcomes  # the seed fixes the random player's moves


async def test_an_illegal_move_is_a_counted_forfeit(tiny_tokenizer):
    runner = env_registry.runner_for(TTT)
    engine = ScriptedEngine(tiny_tokenizer, ["4", "4"])  # O plays X's square
    x, o = await run(runner, {"seed": 0}, engine, tiny_tokenizer)
    assert (x.reward, o.reward) == (1.0, -1.0)
    assert (o.info["illegal_move"], x.info["opponent_illegal_move"], x.info["illegal_move"]) == (1.0, 1.0, 0.0)
    unparsable = ScriptedEngine(tiny_tokenizer, ["no idea"])
    (x,) = await run(runner, {"seed": 0}, unparsable, tiny_tokenizer)  # O never moved: nothing of it to train on
    assert (x.seat, x.reward, x.info["illegal_move"], x.num_turns) == ("player_1", -1.0, 1.0, 1)


def test_without_forfeit_credit_an_illegal_move_costs_only_its_seat():
    """``forfeit_credit=False`` (an experiment's option, molt_envs/README.md): the other seat gets 0, not +1."""
    game = env_registry.make(TTT, forfeit_credit=False, illegal_reward=-2.0)
    game.reset(0)
    assert game.play_text("player_1", "4") and not game.play_text("player_2", "4")
    assert game.returns() == {"player_1": 0.0, "player_2": -2.0} and game.to_move() is None
    assert game.info("player_1") == {
        "illegal_move": 0.0,
        "opponent_illegal_move": 1.0,
        "win": 0.0,
        "draw": 0.0,
        "loss": 0.0,
    }
    assert game.info("player_2")["loss"] == 1.0
    game.close()


def center_first(observation, agent, env, rng):
    """A scripted player: the centre if free, else the first free square."""
    legal = [i for i, ok in enumerate(observation["action_mask"]) if ok]
    return 4 if 4 in legal else legal[0]


async def test_scripted_player_and_frozen_checkpoint_engine_fill_seats(tiny_tokenizer):
    runner = env_registry.runner_for(TTT, mode="vs", opponent=f"{__name__}:center_first")
    engine = ScriptedEngine(tiny_tokenizer, ["0", "1", "2", "3", "5", "6", "7", "8"])
    (traj,) = await run(runner, {"seed": 0, "model_seat": "player_2"}, engine, tiny_tokenizer)
    assert traj.seat == "player_2" and "You are O" in tiny_tokenizer.decode(traj.token_ids[: traj.prompt_len])
    assert tiny_tokenizer.decode(traj.token_ids).count("<|im_start|>user\n") == traj.num_turns

    frozen = ScriptedEngine(tiny_tokenizer, lambda n, ids: first_free(n, ids, tiny_tokenizer))
    checkpoint = "checkpoint:/models/frozen"
    runner = env_registry.runner_for(TTT, seat_policies={"player_2": checkpoint})
    runner.engines[checkpoint] = (frozen, tiny_tokenizer)
    model = ScriptedEngine(tiny_tokenizer, lambda n, ids: first_free(n, ids, tiny_tokenizer))
    (traj,) = await run(runner, {"seed": 1}, model, tiny_tokenizer)
    assert traj.seat == "player_1" and len(frozen.calls) == traj.num_turns - 1 == 3  # O generated, not returned
    loaded = []
    runner = env_registry.runner_for(TTT, seat_policies={"player_2": checkpoint})
    runner.engine_loader = lambda path: loaded.append(path) or (frozen, tiny_tokenizer)
    await run(runner, {"seed": 1}, model, tiny_tokenizer)
    await run(runner, {"seed": 2}, model, tiny_tokenizer)
    assert loaded == ["/models/frozen"]  # asked once, then kept
    (failed,) = await run(
        env_registry.runner_for(TTT, seat_policies={"player_2": checkpoint}), 1, model, tiny_tokenizer
    )
    assert "no engine for it" in failed.failure


async def test_a_failure_fails_every_seat_and_a_full_context_truncates_the_game(tiny_tokenizer):
    runner = env_registry.runner_for(TTT)
    broken = ScriptedEngine(tiny_tokenizer, ["0"], fail_first=2)
    trajs = await run(runner, {"seed": 0}, broken, tiny_tokenizer)
    assert len(trajs) == 2 and all(t.failure and t.failure.startswith("generate: RuntimeError") for t in trajs)
    engine = ScriptedEngine(tiny_tokenizer, lambda n, ids: first_free(n, ids, tiny_tokenizer))
    x, o = await run(runner, {"seed": 0}, engine, tiny_tokenizer, max_length=90)
    assert x.truncated and o.truncated and x.info["truncated_game"] == 1.0 and x.reward == o.reward == 0.0
    assert max(len(x.token_ids), len(o.token_ids)) <= 90


async def test_v3_lists_the_free_squares_shuffled_and_its_sft_replies_copy_the_last(tiny_tokenizer):
    """``-v3`` is ``-v2``'s game whose ``Free:`` line lists the same squares in an order fixed by the position; its
    ``sft`` rows reply with the last one listed, which over the split is every free square about equally often."""
    from molt_envs.envs.board_games import shuffled_free

    engine = ScriptedEngine(tiny_tokenizer, lambda n, ids: first_free(n, ids, tiny_tokenizer))
    x3, _ = await run(env_registry.runner_for(TTT_V3), {"seed": 3}, engine, tiny_tokenizer)
    x2, _ = await run(env_registry.runner_for(TTT), {"seed": 3}, engine, tiny_tokenizer)
    v2_text, v3_text = tiny_tokenizer.decode(x2.token_ids), tiny_tokenizer.decode(x3.token_ids)
    v2_free, v3_free = re.findall(r"\nFree: ([ 0-9]*)", v2_text), re.findall(r"\nFree: ([ 0-9]*)", v3_text)
    assert len(v3_free) == x3.num_turns and [sorted(f.split()) for f in v3_free] == [f.split() for f in v2_free]
    assert any(f.split() != sorted(f.split()) for f in v3_free)
    assert re.sub(r"\nFree:[ 0-9]*", "", v3_text) == re.sub(r"\nFree:[ 0-9]*", "", v2_text)
    rows = env_registry.load_split(env_registry.spec(TTT_V3), "sft", 400)
    assert all(r["reference"] == r["prompt"][-1]["content"].rsplit(" ", 1)[1] for r in rows)
    replies = [int(r["reference"]) for r in rows]
    assert all(replies.count(square) > len(rows) / 9 / 2 for square in range(9))
    assert len({r["label"]["seed"] for r in rows}) > 50 and len({len(r["prompt"]) for r in rows}) == 5
    game = env_registry.make(TTT_V3)
    game.reset(0)
    observation = game.env.observe("player_1")
    assert shuffled_free(observation) == shuffled_free(observation) and sorted(shuffled_free(observation)) == [
        *range(9)
    ]


async def test_v4_shuffles_the_free_line_by_the_game_too_and_its_sft_replies_copy_the_last(tiny_tokenizer):
    """``-v4`` is ``-v3``'s game (boards, moves, rewards) whose ``Free:`` order is seeded by the game's seed as well
    as the position: the same position is listed in other orders in other games, one game always the same way;
    its ``sft`` rows reply with the last square their prompt lists."""
    engine = ScriptedEngine(tiny_tokenizer, lambda n, ids: first_free(n, ids, tiny_tokenizer))
    texts = {}
    for env_id, seed in ((TTT_V3, 3), (TTT_V4, 3), (TTT_V4, 4), (TTT_V4, 3)):
        x, o = await run(env_registry.runner_for(env_id), {"seed": seed}, engine, tiny_tokenizer)
        assert (x.reward, x.num_turns, o.reward, o.num_turns) == (1.0, 4, -1.0, 3)  # first_free plays one game
        texts.setdefault((env_id, seed), []).append(tiny_tokenizer.decode(x.token_ids))
    free = {k: [re.findall(r"\nFree: ([ 0-9]*)", t) for t in v] for k, v in texts.items()}
    v3, (v4, v4_again), (other,) = free[(TTT_V3, 3)][0], free[(TTT_V4, 3)], free[(TTT_V4, 4)]
    assert v4 == v4_again and v4 != v3 and v4 != other  # seeded: the same game lists the same way, others not
    assert [sorted(f.split()) for f in v4] == [sorted(f.split()) for f in v3] == [sorted(f.split()) for f in other]
    strip = r"\nFree:[ 0-9]*"
    assert re.sub(strip, "", texts[(TTT_V4, 3)][0]) == re.sub(strip, "", texts[(TTT_V3, 3)][0])
    empty = {f[0] for f in (v3, v4, other)}  # the empty board: one order in -v3, a game's own in -v4
    assert len(empty) == 3
    rows = env_registry.load_split(env_registry.spec(TTT_V4), "sft", 400)
    assert all(r["reference"] == r["prompt"][-1]["content"].rsplit(" ", 1)[1] for r in rows)
    replies = [int(r["reference"]) for r in rows]
    assert all(replies.count(square) > len(rows) / 9 / 2 for square in range(9))
    first = [r["prompt"][1]["content"] for r in rows if len(r["prompt"]) == 2 and "X" not in r["prompt"][1]["content"]]
    assert len(set(first)) > 5  # the empty board's Free line differs from game to game


@pytest.mark.parametrize("env_id", [TTT, TTT_V3, TTT_V4, "molt/connect-four-v1"])
async def test_one_seat_view_plays_against_the_default_random_opponent(env_id):
    rows = env_registry.load_split(env_registry.spec(env_id), "test", 2)
    for row in rows:  # the test split plays against a random player, the model taking each seat in turn
        env = OneSeatEnv(env_registry.make(env_id))
        start = await env.reset({"observation": row["prompt"], "label": row["label"]})
        assert env.seat == env.game.seats[row["label"]["model_seat"]]
        assert start["observation"][0]["role"] == "system" and start["observation"][1]["role"] == "user"
        rng, total, done = random.Random(0), 0.0, False
        while not done:
            mask = env.game.env.observe(env.seat)["action_mask"]
            move = rng.choice([i for i, ok in enumerate(mask) if ok])
            result = await env.step({"action_text": f"thinking... {move}", "label": row["label"]})
            total, done = total + result.reward, result.terminated
        assert result.info["illegal_move"] == 0.0 and total == result.info["total_reward"] in (-1.0, 0.0, 1.0)
        await env.close()


def test_bad_policies_and_modes_fail_at_make():
    with pytest.raises(ValueError, match="opponent 'alphazero' is not a policy"):
        env_registry.make(TTT, mode="vs", opponent="alphazero")
    with pytest.raises(ValueError, match="seat_policies names seat 'player_9'"):
        env_registry.make(TTT, seat_policies={"player_9": "random"})
    with pytest.raises(ValueError, match="mode 'league' is not one of"):
        env_registry.make(TTT, mode="league")
    with pytest.raises(ValueError, match="scripted policy 'no_such_module:fn' cannot be imported"):
        env_registry.make(TTT, mode="vs", opponent="no_such_module:fn")
