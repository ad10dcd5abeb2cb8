"""``gym:ENV_ID``: Gymnasium's own envs played as text, for real. The catalog against ``gymnasium.registry`` (available,
or why not: a missing dependency, a space with no text form), scripted episodes through the env server with
Gymnasium's exact rewards (a Box observation and a Discrete action, a Box action, kwargs to ``gymnasium.make``), the
action parser on each kind of space, bad input, ``molt-env check``, and no molt ID registered into Gymnasium by
importing the adapter."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

import env_registry
from env_registry.errors import NameNotFound, UnregisteredEnv
from env_registry.remote import RemoteEnvSpec
from molt_envs import SamplingParams
from molt_envs.replay_model import ByteChatTokenizer, ReplayEngine

gymnasium = pytest.importorskip("gymnasium")
from gymnasium import spaces  # noqa: E402

from env_registry.ecosystems.gymnasium import SOURCE, format_value, parse_action  # noqa: E402

MOLT_ENV = str(Path(sys.executable).with_name("molt-env"))
TOK = ByteChatTokenizer()
PARAMS = SamplingParams(max_tokens=64)
PIXELS = "molt-test/CartPolePixels-v0"


def pixel_cartpole(**kwargs):
    """CartPole seen through its rendered frames: a 400 x 600 x 3 image observation (no text form)."""
    from gymnasium.wrappers import AddRenderObservation

    return AddRenderObservation(gymnasium.make("CartPole-v1", render_mode="rgb_array").unwrapped, render_only=True)


def play(env_id: str, seed: int, replies: list[str]):
    """One episode of ``env_id`` on the episode seed ``seed``, the model's replies scripted."""
    runner = env_registry.runner_for(env_id)
    return asyncio.run(runner.execute(f"episode {seed}", seed, PARAMS, 1 << 20, TOK, ReplayEngine(TOK, replies)))


def gymnasium_return(gym_id: str, seed: int, actions: list, **kwargs) -> tuple[float, int, bool]:
    """What Gymnasium itself pays for ``actions`` after ``reset(seed=seed)``: (return, steps, truncated)."""
    env = gymnasium.make(gym_id, **kwargs)
    env.reset(seed=seed)
    total = 0.0
    for steps, action in enumerate(actions, 1):
        _, reward, terminated, truncated, _ = env.step(action)
        total += float(reward)
        if terminated or truncated:
            return total, steps, truncated
    raise AssertionError("the actions did not end the episode")


def test_the_catalog_lists_gymnasiums_registry_with_availability():
    done = subprocess.run([MOLT_ENV, "list", "--source", "gym"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    listed = {line.split()[0]: line for line in done.stdout.splitlines() if line.startswith("  gym:")}
    theirs = {  # not the molt IDs env_registry.gym registers, nor what other test modules register in this process
        n
        for n, s in gymnasium.registry.items()
        if not str(s.entry_point).startswith("env_registry.") and not n.startswith("molt-test/")
    }
    assert set(listed) == {f"gym:{name}" for name in theirs}  # (not the molt IDs env_registry.gym registers)
    for name in ("CartPole-v1", "FrozenLake-v1", "Taxi-v4", "Blackjack-v1", "Pendulum-v1", "MountainCarContinuous-v0"):
        assert " available  -- Gymnasium " in listed[f"gym:{name}"], listed[f"gym:{name}"]
    assert "observation in order: an integer from 0 to 31;" in listed["gym:Blackjack-v1"]  # a Tuple
    assert "action 1 number, each from -2 to 2" in listed["gym:Pendulum-v1"]  # a Box action
    try:
        import Box2D  # noqa: F401
    except ImportError:
        reason = "unavailable: gymnasium.make('LunarLander-v3') fails here: DependencyNotInstalled: Box2D is not"
        assert reason in listed["gym:LunarLander-v3"]
    available = sum(" available  -- " in line for line in listed.values())
    assert f"{len(listed)} IDs of gym:, {available} available, {len(listed) - available} unavailable" in done.stdout


def test_an_env_whose_observation_has_no_text_form_is_unavailable_saying_why():
    gymnasium.register(PIXELS, entry_point=pixel_cartpole)
    try:
        (entry,) = [e for e in SOURCE.catalog() if e.env_id == f"gym:{PIXELS}"]
        assert not entry.available
        assert entry.reason == (
            "its observation space Box(0, 255, (400, 600, 3), uint8) has 720000 numbers, too many to read as text "
            "(at most 64)"
        )
        with pytest.raises(UnregisteredEnv, match=r"720000 numbers, too many to read as text"):
            env_registry.spec(f"gym:{PIXELS}")
    finally:
        gymnasium.registry.pop(PIXELS)


def test_cartpole_box_observation_discrete_action_earns_gymnasiums_exact_rewards():
    spec = env_registry.spec("gym:CartPole-v1")
    assert isinstance(spec, RemoteEnvSpec) and spec.max_turns == 500
    assert spec.upstream == {
        "ecosystem": "gym",
        "library": "gymnasium",
        "version": gymnasium.__version__,
        "license": "MIT",
    }
    actions = [0, 0, 1, 1, 0, 1, 0, 0] + [0] * 30
    replies = [f"push {'right' if a else 'left'}: {a}" for a in actions]
    for seed in (3, 1_000_001):
        traj = play("gym:CartPole-v1", seed, replies)
        total, steps, _ = gymnasium_return("CartPole-v1", seed, actions)
        assert traj.ok, traj.failure
        assert (traj.reward, traj.num_turns, traj.info["invalid_action"]) == (total, steps, 0.0)
        env = gymnasium.make("CartPole-v1")
        first, _ = env.reset(seed=seed)
        text = TOK.decode(traj.token_ids)
        assert f"Observation: {format_value(env.observation_space, first)}" in text
        assert "Reply with an action: an integer from 0 to 1" in text


def test_a_time_limit_kwarg_truncates_and_a_reply_outside_the_space_ends_the_episode():
    spec = env_registry.spec("gym:CartPole-v1?max_episode_steps=5")
    assert spec.max_turns == 5 and spec.kwargs == {"gym_id": "CartPole-v1", "make_kwargs": {"max_episode_steps": 5}}
    assert spec.hash != env_registry.spec("gym:CartPole-v1").hash
    assert env_registry.spec("gym:CartPole-v1?reward_range=[0,500]").reward_range == (0.0, 500.0)  # for pass@k
    traj = play("gym:CartPole-v1?max_episode_steps=5", 0, ["0", "1"] * 5)
    assert gymnasium_return("CartPole-v1", 0, [0, 1] * 5, max_episode_steps=5) == (5.0, 5, True)
    assert (traj.reward, traj.num_turns, traj.truncated) == (5.0, 5, True)
    traj = play("gym:CartPole-v1?max_episode_steps=5", 0, ["1", "I pick 2"])  # Discrete(2) has no 2
    assert (traj.reward, traj.num_turns, traj.info["invalid_action"]) == (1.0, 2, 1.0)


def test_frozen_lake_kwargs_reach_gymnasium_make():
    plain, still = env_registry.spec("gym:FrozenLake-v1"), env_registry.spec("gym:FrozenLake-v1?is_slippery=false")
    assert still.kwargs["make_kwargs"] == {"is_slippery": False} and still.hash != plain.hash
    assert still.reward_range == (0.0, 1.0)  # FrozenLake states its own
    path = [1, 1, 2, 2, 1, 2]  # down, down, right, right, down, right: S to G around the holes
    assert gymnasium_return("FrozenLake-v1", 0, path, is_slippery=False) == (1.0, 6, False)
    traj = play("gym:FrozenLake-v1?is_slippery=false", 0, [f"move {a}" for a in path])
    assert (traj.reward, traj.num_turns, traj.truncated) == (1.0, 6, False)


def test_pendulum_box_action_parsed_from_text():
    torques = [0.5, -1.25, 2.0, 0.0]
    traj = play("gym:Pendulum-v1?max_episode_steps=4", 7, [f"torque {t}" for t in torques])
    total, steps, truncated = gymnasium_return("Pendulum-v1", 7, [[t] for t in torques], max_episode_steps=4)
    assert (traj.reward, traj.num_turns, traj.truncated) == (pytest.approx(total, abs=1e-9), steps, truncated)
    assert traj.reward < 0 and steps == 4


@pytest.mark.parametrize(
    ("space", "text", "expected"),
    [
        (spaces.Discrete(3, start=-1), "I choose -1", -1),
        (spaces.MultiDiscrete([3, 4]), "first 2, then 3", [2, 3]),
        (spaces.MultiBinary(3), "1 0 1", [1, 0, 1]),
        (spaces.Box(-1.0, 1.0, (2,)), "x=0.25 y=-1e-1", [0.25, -0.1]),
        (spaces.Tuple((spaces.Discrete(2), spaces.Box(0.0, 5.0, (1,)))), "1 and 4.5", (1, [4.5])),
        (spaces.Text(10), "<|im_end|> hello ", "hello"),
    ],
)
def test_actions_parse_from_the_last_numbers_of_a_reply(space, text, expected):
    action = parse_action(space, text)
    assert space.contains(action)
    if isinstance(expected, tuple):
        assert int(action[0]) == expected[0] and action[1].tolist() == expected[1]
    else:
        assert (action.tolist() if hasattr(action, "tolist") else action) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("space", "text", "message"),
    [
        (spaces.Discrete(2), "left", r"names 0 number\(s\), the action needs 1"),
        (spaces.Discrete(2), "2", r"'2' is not in Discrete\(2\)"),
        (spaces.Discrete(2), "0.5", r"not all integers"),
        (spaces.Box(-2.0, 2.0, (1,)), "3", r"is not in Box"),
        (spaces.MultiDiscrete([2, 2]), "only 1", r"names 1 number\(s\), the action needs 2"),
    ],
)
def test_replies_naming_no_action_in_the_space_are_refused(space, text, message):
    with pytest.raises(ValueError, match=message):
        parse_action(space, text)


@pytest.mark.parametrize(
    ("env_id", "error", "message"),
    [
        ("gym:CartPol-v1", NameNotFound, r"gymnasium has no env 'CartPol-v1'\. Did you mean gym:CartPole-v1\b"),
        ("gym:FrozenLake-v1?foo=1", UnregisteredEnv, r"FrozenLake-v1 takes no kwarg 'foo'; it takes .*is_slippery"),
        ("gym:FrozenLake-v1?is_slippery=2", UnregisteredEnv, r"takes is_slippery: bool, got 2"),
        ("gym:FrozenLake-v1?map_name=%229x9%22", UnregisteredEnv, r"gymnasium.make\('FrozenLake-v1'\) fails here"),
        ("gym:CartPole-v1?render_mode=%22human%22", UnregisteredEnv, r"render_mode is not a kwarg here"),
        ("gym:CartPole-v1?reward_range=5", UnregisteredEnv, r"reward_range must be a list of two numbers"),
    ],
)
def test_bad_names_and_kwargs_fail_naming_them(env_id, error, message):
    with pytest.raises(error, match=message):
        env_registry.make(env_id)


def test_molt_env_check_passes():
    done = subprocess.run(
        [MOLT_ENV, "check", "gym:FrozenLake-v1?is_slippery=false"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 failed" in done.stdout


def test_importing_the_adapter_registers_no_molt_id_into_gymnasium():
    code = (
        "import gymnasium, env_registry\n"
        "import env_registry.ecosystems.gymnasium\n"
        "env_registry.spec('gym:CartPole-v1')  # the gym: source loaded and used\n"
        "print(sum(1 for k in gymnasium.registry if k.startswith(('molt/', 'rg/'))))\n"
        "import env_registry.gym  # the one import that does\n"
        "print(sum(1 for k in gymnasium.registry if k.startswith(('molt/', 'rg/'))) > 0)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["0", "True"], out.stderr
