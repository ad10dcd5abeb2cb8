"""molt IDs inside Gymnasium: ``import env_registry.gym`` registers them lazily; ``gymnasium.make`` gives real
``gymnasium.Env``s that pass Gymnasium's own ``check_env``; ChatAgents and bad input get clear errors."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

import env_registry
import env_registry.gym  # noqa: F401  (registers every molt ID in Gymnasium's registry)
from env_registry.gym import MoltGymEnv

# the built-in text envs: not the ``test/*`` IDs other test modules register while collected, nor an env whose reward
# is an LLM judge's (it needs a judge endpoint: molt-train rl --judge.*, tested in tests/molt_train/test_judge.py)
TEXT_ENVS = sorted(
    i
    for i in env_registry.registry
    if env_registry.registry[i].kind != "chat_agent"
    and not i.startswith("test/")
    and "llm-judge" not in env_registry.registry[i].tags
)
CHAT_AGENTS = sorted(i for i in env_registry.registry if env_registry.registry[i].kind == "chat_agent")


def test_registration_is_lazy_and_the_module_form_needs_no_import():
    code = (
        "import sys, gymnasium, env_registry.gym\n"
        "envs = [m for m in sys.modules if m.startswith('molt_envs.envs.') or m == 'reasoning_gym']\n"
        "env = gymnasium.make('env_registry.gym:molt/arith-v1')\n"
        "print(envs, type(env.unwrapped).__name__, sorted(k for k in gymnasium.registry if k.startswith('rg/'))[:2])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[] MoltGymEnv ['rg/basic-arithmetic-v1', 'rg/chain-sum-v1']"
    code = "import gymnasium; e = gymnasium.make('env_registry.gym:molt/arith-v1'); print(e.reset(seed=1)[0])"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.parametrize("env_id", TEXT_ENVS)
def test_every_built_in_text_env_passes_gymnasiums_check_env(env_id):
    env = gymnasium.make(env_id, split="test", num_tasks=4)
    assert isinstance(env.unwrapped, gymnasium.Env)
    assert isinstance(env.observation_space, gymnasium.spaces.Text)
    assert isinstance(env.action_space, gymnasium.spaces.Text)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # Gymnasium's advice on wrappers it does not see here
        check_env(env.unwrapped)
    env.close()


def test_same_seed_same_task_and_an_episode_runs_to_its_end():
    env = gymnasium.make("molt/arith-v1", render_mode="ansi")
    first, info = env.reset(seed=5)
    again, info_again = env.reset(seed=5)
    assert first == again and info == info_again and info["messages"] == [{"role": "user", "content": first}]
    a, op, b = first.rstrip("=").replace("-", " - ").replace("+", " + ").split()
    answer = int(a) + int(b) if op == "+" else int(a) - int(b)
    obs, reward, terminated, truncated, step_info = env.step(f"{answer}")
    assert (obs, reward, terminated, truncated, step_info["exact"]) == ("", 1.0, True, False, 1.0)
    assert env.render() == f"{first}\n{answer}\n"
    env.close()
    env.close()  # twice is fine


def test_a_multi_turn_env_continues_until_it_terminates():
    env = gymnasium.make("gym/frozen-lake-v1", split="test")
    obs, info = env.reset(seed=0)
    assert info["messages"][0]["role"] == "system" and "@" in obs and "Your move" in obs
    turns, terminated, truncated = 0, False, False
    while not (terminated or truncated):
        obs, reward, terminated, truncated, step = env.step("I think the safest is: right")
        turns += 1
        assert step["invalid_action"] == 0.0
    assert 1 <= turns <= env_registry.spec("gym/frozen-lake-v1").max_turns
    _, reward, terminated, _, step = env.reset(seed=0) and env.step("no move here")
    assert terminated and step["invalid_action"] == 1.0 and reward == 0.0


def test_a_game_is_one_seat_against_its_default_opponent():
    env = gymnasium.make("molt/tictactoe-v1", split="test")
    obs, _ = env.reset(seed=0)
    assert "Tic-tac-toe. You are" in obs
    rewards = []
    for _ in range(5):
        board = obs.rsplit("\n\n", 1)[-1]
        free = [c for c in board.split() if c.isdigit()]
        obs, reward, terminated, truncated, info = env.step(f"square {free[0]}")
        rewards.append(reward)
        if terminated:
            break
    assert terminated and info["illegal_move"] == 0.0 and sum(rewards) in (-1.0, 0.0, 1.0)


def test_difficulty_knobs_are_kwargs_recorded_in_the_spec_hash():
    easy = gymnasium.make("rg/countdown-v1", split="test", num_tasks=2)
    hard = gymnasium.make("rg/countdown-v1", split="test", num_tasks=2, difficulty=3, config={"max_numbers": 6})
    assert easy.unwrapped.molt_spec.hash != hard.unwrapped.molt_spec.hash
    assert hard.unwrapped.molt_spec.kwargs == {"task": "countdown", "difficulty": 3, "config": {"max_numbers": 6}}
    assert easy.reset(seed=0, options={"index": 0})[0] != hard.reset(seed=0, options={"index": 0})[0]
    with pytest.raises(ValueError, match="difficulty must be a curriculum level"):
        gymnasium.make("rg/countdown-v1", difficulty=-1)


def test_chat_agents_refuse_gymnasium_with_what_to_use():
    with pytest.raises(env_registry.NotAGymnasiumEnv, match=r"is a ChatAgent.*runner_for.*molt-train rl --env"):
        gymnasium.make(CHAT_AGENTS[0])


def test_bad_input_is_a_clear_error_at_make():
    with pytest.raises(gymnasium.error.NameNotFound, match="arithh"):
        gymnasium.make("molt/arithh-v1")
    with pytest.raises(env_registry.PackageVersionMismatch, match=r"pins package version 9\.9\.9.*molt-env install"):
        gymnasium.make("molt/arith-v1", package_version="9.9.9")
    with pytest.raises(ValueError, match="action_parser 'nope.nope:parse' cannot be imported"):
        gymnasium.make("gym/taxi-v1", action_parser="nope.nope:parse")
    with pytest.raises(ValueError, match="render_mode 'human' is not supported"):
        MoltGymEnv("molt/arith-v1", render_mode="human")
    assert json.loads(env_registry.spec("gym/taxi-v1").to_json())["kwargs"]["gym_id"] == "Taxi-v4"
