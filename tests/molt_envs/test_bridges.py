"""Real Gymnasium and PettingZoo environments driven through the LLM loop by the bridges."""

from __future__ import annotations

import functools

import gymnasium
import numpy as np
import pytest
from chat_support import ScriptedEngine
from gymnasium import spaces
from gymnasium.utils.env_checker import check_env
from pettingzoo import AECEnv
from pettingzoo.test import api_test
from pettingzoo.utils import AgentSelector

from molt_envs import SamplingParams, StepEnvRunner
from molt_envs.bridges import GymnasiumEnv, PettingZooGame
from molt_envs.seats import OneSeatEnv


class GuessNumber(gymnasium.Env):
    """Guess a secret in 0..9 within 3 tries; text in, text out; +1 for a hit."""

    metadata = {"render_modes": []}

    def __init__(self):
        self.observation_space = spaces.Text(max_length=64, charset="abcdefghijklmnopqrstuvwxyz0123456789 .!?")
        self.action_space = spaces.Discrete(10)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.secret, self.tries = int(self.np_random.integers(10)), 0
        return "guess a digit", {}

    def step(self, action):
        self.tries += 1
        if action == self.secret:
            return "correct!", 1.0, True, False, {}
        hint = "higher" if action < self.secret else "lower"
        return f"{hint}", 0.0, False, self.tries >= 3, {}


gymnasium.register("molt-test/GuessNumber-v0", entry_point=GuessNumber)


class HighCard(AECEnv):
    """Two players each play a digit in turn; the higher digit wins +1 / -1."""

    metadata = {"render_modes": [], "name": "high_card_v0", "is_parallelizable": True}

    def __init__(self):
        super().__init__()
        self.possible_agents = ["player_0", "player_1"]
        self._spaces = {a: spaces.Discrete(10) for a in self.possible_agents}
        self._obs = {a: spaces.Discrete(11) for a in self.possible_agents}

    def observation_space(self, agent):
        return self._obs[agent]

    def action_space(self, agent):
        return self._spaces[agent]

    def observe(self, agent):
        return np.int64(self.played.get("player_0", 10) if agent == "player_1" else 10)

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        self.rewards = {a: 0.0 for a in self.agents}
        self._cumulative_rewards = {a: 0.0 for a in self.agents}
        self.terminations = {a: False for a in self.agents}
        self.truncations = {a: False for a in self.agents}
        self.infos = {a: {} for a in self.agents}
        self.played = {}
        self._selector = AgentSelector(self.agents)
        self.agent_selection = self._selector.next()

    def step(self, action):
        if self.terminations[self.agent_selection] or self.truncations[self.agent_selection]:
            self._was_dead_step(action)
            return
        agent = self.agent_selection
        self._cumulative_rewards[agent] = 0.0
        self.played[agent] = int(action)
        self.rewards = {a: 0.0 for a in self.agents}
        if len(self.played) == 2:
            a, b = self.played["player_0"], self.played["player_1"]
            win = (a > b) - (a < b)
            self.rewards = {"player_0": float(win), "player_1": float(-win)}
            self.terminations = {x: True for x in self.agents}
        self._accumulate_rewards()
        self.agent_selection = self._selector.next()


def digit(text: str) -> int:
    text = text.replace("<|im_end|>", "").strip()
    if not text.isdigit() or len(text) != 1:
        raise ValueError(f"not a digit: {text!r}")
    return int(text)


def test_the_fixture_envs_pass_their_own_libraries_checkers():
    check_env(GuessNumber(), skip_render_check=True)
    api_test(HighCard(), num_cycles=20)


def hint_of(observation, env) -> str:
    return f"{observation} (try {env.tries} of 3)"


async def test_gymnasium_episode_through_the_runner(tiny_tokenizer):
    env = GuessNumber()
    env.reset(seed=7)
    secret = env.secret
    wrong = (secret + 5) % 10
    factory = functools.partial(
        GymnasiumEnv,
        "molt-test/GuessNumber-v0",
        seed=7,
        action_parser=f"{__name__}:digit",
        observation_formatter=f"{__name__}:hint_of",
        instructions="Guess my digit.",
    )
    engine = ScriptedEngine(tiny_tokenizer, [str(wrong), str(secret)])
    traj = await StepEnvRunner(factory).execute("", None, SamplingParams(max_tokens=4), 512, tiny_tokenizer, engine)
    assert traj.ok, traj.failure
    assert traj.num_turns == 2 and traj.reward == 1.0 and traj.info["total_reward"] == 1.0
    hint = "higher" if wrong < secret else "lower"
    text = tiny_tokenizer.decode(traj.token_ids)
    # observations are chat messages, rendered by the model's own template (here ChatML) after each action
    assert text.startswith("<|im_start|>system\nGuess my digit.<|im_end|>\n<|im_start|>user\nguess a digit (try 0")
    assert f"<|im_end|>\n<|im_start|>user\n{hint} (try 1 of 3)<|im_end|>\n<|im_start|>assistant\n" in text


async def test_gymnasium_invalid_action_is_a_counted_outcome_with_its_reward():
    env = GymnasiumEnv("molt-test/GuessNumber-v0", seed=1, action_parser=f"{__name__}:digit", invalid_reward=-2)
    start = await env.reset({"observation": "", "label": None})
    assert start["observation"] == [{"role": "user", "content": "guess a digit"}]
    result = await env.step({"action_text": "forty-two", "observation_text": "", "label": None, "turn": 0})
    assert result.terminated and result.info["invalid_action"] == 1.0 and result.reward == -2.0
    await env.close()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"action_parser": "no_such_pkg.parse:digit"}, "action_parser 'no_such_pkg.parse:digit' cannot be imported"),
        ({"observation_formatter": "molt_envs.bridges:nope"}, "module 'molt_envs.bridges' has no attribute 'nope'"),
        ({"action_parser": "digit"}, "action_parser 'digit' must look like 'package.module:function'"),
        ({"observation_formatter": "molt_envs.bridges:MODEL_POLICY"}, "has no attribute"),
    ],
)
def test_a_parser_or_formatter_that_does_not_import_fails_at_make(kwargs, message):
    with pytest.raises(ValueError, match=message):
        GymnasiumEnv("molt-test/GuessNumber-v0", **kwargs)


def high_card_digit(observation, agent, env) -> str:
    return f"{agent} sees {int(observation)}"


@pytest.mark.parametrize("my_move", [9, 0])
async def test_pettingzoo_seat_plays_against_a_random_opponent(my_move):
    game = PettingZooGame(
        env_factory=f"{__name__}:HighCard", action_parser=f"{__name__}:digit", mode="vs", opponent="random"
    )
    env = OneSeatEnv(game)
    await env.reset({"observation": "", "label": {"seed": 3, "model_seat": "player_0"}})
    result = await env.step({"action_text": str(my_move), "observation_text": "", "label": None, "turn": 0})
    assert result.terminated
    opponent = game.env.played["player_1"]
    assert result.reward == float((my_move > opponent) - (my_move < opponent))
    await env.close()


async def test_pettingzoo_second_seat_sees_the_first_move():
    game = PettingZooGame(
        env_factory=f"{__name__}:HighCard",
        action_parser=f"{__name__}:digit",
        observation_formatter=f"{__name__}:high_card_digit",
    )
    env = OneSeatEnv(game)
    start = await env.reset({"observation": "", "label": {"seed": 5, "model_seat": "player_1"}})
    seen = int(start["observation"][0]["content"].rsplit(" ", 1)[1])
    assert seen == game.env.played["player_0"]
    result = await env.step({"action_text": str(min(seen + 1, 9)), "observation_text": "", "label": None, "turn": 0})
    assert result.terminated and result.reward == (1.0 if seen < 9 else 0.0)
    with pytest.raises(ValueError, match="model_seat 'nobody' is not one of the seats"):
        await OneSeatEnv(game).reset({"observation": "", "label": {"model_seat": "nobody"}})


class Steering(HighCard):
    """HighCard with a continuous action space, which the text bridge cannot parse into."""

    def action_space(self, agent):
        return spaces.Box(-1.0, 1.0, (1,))


def test_a_pettingzoo_env_whose_actions_are_not_discrete_fails_at_make():
    with pytest.raises(ValueError, match=r"Steering'.*agent 'player_0' has action space Box.*not Discrete"):
        PettingZooGame(env_factory=f"{__name__}:Steering")
    with pytest.raises(ValueError, match="give exactly one of pettingzoo_id"):
        PettingZooGame()
