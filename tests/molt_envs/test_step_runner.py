"""StepEnvRunner on a real tiny model: token alignment, budgets, multi-turn, failure isolation, params, and images
on a text-only model (a counted failure; images on a vision model: test_vision_runner.py)."""

from __future__ import annotations

import pytest
from chat_support import RecordingEngine
from PIL import Image

from molt_envs import Env, Result, SamplingParams, StepEnvRunner, Trajectory, load_agent_runner


class OneTurn(Env):
    async def step(self, state):
        return Result(reward=0.5, info={"len": len(state["action_text"])})


class ThreeTurns(Env):
    """Answers each turn with feedback; terminates after the third turn; switches to greedy after turn 1."""

    def __init__(self):
        self.seen = []

    async def step(self, state):
        self.seen.append(state)
        turn = state["turn"]
        return Result(
            reward=1.0,
            observation=f"\n<feedback {turn}>\n",
            terminated=turn == 2,
            sampling_params={"temperature": 0.0} if turn == 0 else None,
        )


class Exploding(Env):
    async def step(self, state):
        raise RuntimeError("grader crashed on purpose")


class NeverEnds(Env):
    async def step(self, state):
        return Result(reward=0.25, observation=" more", terminated=False)


def one_token_turns(tokenizer, **kw) -> SamplingParams:
    """Every token is a stop token: each turn ends naturally after one token (a random model rarely emits EOS)."""
    return SamplingParams(stop_token_ids=list(range(len(tokenizer))), **kw)


def check_alignment(traj: Trajectory, engine: RecordingEngine, prompt_ids: list[int]) -> None:
    assert len(traj.token_ids) == len(traj.log_probs)
    assert traj.token_ids[: len(prompt_ids)] == prompt_ids
    assert len(traj.action_ranges) == len(engine.calls)
    for (start, end), (context, _, gen) in zip(traj.action_ranges, engine.calls, strict=True):
        assert context == traj.token_ids[:start]  # generated over the exact accumulated ids
        assert traj.token_ids[start:end] == gen.token_ids
        assert traj.log_probs[start:end] == pytest.approx(gen.log_probs)
    mask = traj.action_mask()
    assert all(lp == 0.0 for lp, m in zip(traj.log_probs, mask, strict=True) if not m)


async def test_single_turn_alignment_and_reward(tiny_engine, tiny_tokenizer):
    engine = RecordingEngine(tiny_engine)
    prompt = [{"role": "user", "content": "What is 2+2?"}]
    runner = StepEnvRunner(OneTurn, env_id="t/one-v1", spec_hash="abc")
    traj = await runner.execute(prompt, "4", SamplingParams(max_tokens=12, seed=0), 512, tiny_tokenizer, engine)
    rendered = tiny_tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
    check_alignment(traj, engine, tiny_tokenizer.encode(rendered, add_special_tokens=False))
    assert traj.ok and traj.reward == 0.5 and traj.score == 0.5 and traj.num_turns == 1
    assert (traj.env_id, traj.spec_hash, traj.label) == ("t/one-v1", "abc", "4")
    assert traj.info == {"len": len(tiny_tokenizer.decode(engine.calls[0][2].token_ids))}


async def test_multi_turn_feedback_is_masked_and_params_replaced(tiny_engine, tiny_tokenizer):
    engine = RecordingEngine(tiny_engine)
    envs = []
    runner = StepEnvRunner(lambda: envs.append(ThreeTurns()) or envs[-1])
    traj = await runner.execute(
        "Q:", None, one_token_turns(tiny_tokenizer, temperature=1.0, max_tokens=6, seed=1), 512, tiny_tokenizer, engine
    )
    check_alignment(traj, engine, tiny_tokenizer.encode("Q:"))
    assert traj.ok and traj.num_turns == 3 and traj.reward == 3.0  # rewards summed over turns
    assert [c[1].temperature for c in engine.calls] == [1.0, 0.0, 0.0]  # Result.sampling_params replaced them
    assert traj.images == [] and traj.mm_inputs is None
    feedback = tiny_tokenizer.encode("\n<feedback 0>\n", add_special_tokens=False)
    end_first = traj.action_ranges[0][1]
    assert traj.token_ids[end_first : end_first + len(feedback)] == feedback
    assert not any(traj.action_mask()[end_first : end_first + len(feedback)])
    assert [s["turn"] for s in envs[0].seen] == [0, 1, 2]
    assert envs[0].seen[2]["observation_text"].startswith("Q:")
    assert "<feedback 1>" in envs[0].seen[2]["observation_text"]


class ImageLater(Env):
    async def step(self, state):
        return Result(observation="look:", images=[Image.new("RGB", (2, 2))], terminated=False)


async def test_images_on_a_text_only_model_are_a_counted_failure_never_a_crash(tiny_engine, tiny_tokenizer):
    params = SamplingParams(max_tokens=2, seed=0)
    first = await StepEnvRunner(OneTurn).execute(
        "Q:", None, params, 64, tiny_tokenizer, tiny_engine, images=[Image.new("RGB", (4, 4))]
    )
    assert first.failure.startswith("images: ImageError: 1 image(s) came with this episode but the model is text-only")
    later = await StepEnvRunner(ImageLater).execute("Q:", None, params, 64, tiny_tokenizer, tiny_engine)
    assert later.failure.startswith("images: ImageError") and "text-only" in later.failure
    assert later.num_action_tokens > 0  # the turn before the image stays recorded (the episode is dropped whole)


class ToolFeedback(Env):
    """Answers the first turn with a ``tool`` message and a user message; ends on the second turn."""

    async def step(self, state):
        if state["turn"] == 0:
            return Result(observation=[{"role": "tool", "content": "42"}], terminated=False)
        return Result(reward=1.0)


async def test_message_observations_are_rendered_by_the_chat_template(tiny_engine, tiny_tokenizer):
    engine = RecordingEngine(tiny_engine)
    prompt = [{"role": "user", "content": "What is 6*7?"}]
    params = one_token_turns(tiny_tokenizer, max_tokens=4, seed=3)
    traj = await StepEnvRunner(ToolFeedback).execute(prompt, None, params, 512, tiny_tokenizer, engine)
    assert traj.ok and traj.num_turns == 2
    end_first = traj.action_ranges[0][1]
    observation = tiny_tokenizer.decode(traj.token_ids[end_first : traj.action_ranges[1][0]])
    action = tiny_tokenizer.decode(engine.calls[0][2].token_ids)
    # exactly what the template writes after an assistant turn, then the tool turn and the generation prompt
    closing = "\n" if action.endswith("<|im_end|>") else "<|im_end|>\n"
    assert observation == closing + "<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n" + (
        "<|im_start|>assistant\n"
    )
    assert not any(traj.action_mask()[end_first : traj.action_ranges[1][0]])


def test_observation_messages_are_checked():
    with pytest.raises(TypeError, match="role"):
        Result(observation=[{"content": "no role"}])
    with pytest.raises(TypeError, match="list of chat messages"):
        Result(observation=42)


async def test_fresh_env_per_episode(tiny_engine, tiny_tokenizer):
    made = []
    runner = StepEnvRunner(lambda: made.append(OneTurn()) or made[-1])
    for _ in range(2):
        await runner.execute("Q:", None, SamplingParams(max_tokens=2), 64, tiny_tokenizer, tiny_engine)
    assert len(made) == 2 and made[0] is not made[1]


async def test_budget_exhaustion_marks_truncated(tiny_engine, tiny_tokenizer):
    engine = RecordingEngine(tiny_engine)
    prompt_len = len(tiny_tokenizer.encode("Q:"))
    max_length = prompt_len + 20
    traj = await StepEnvRunner(NeverEnds).execute(
        "Q:", None, one_token_turns(tiny_tokenizer, max_tokens=8, seed=0), max_length, tiny_tokenizer, engine
    )
    assert traj.ok and traj.truncated and traj.num_turns > 3
    assert all(reason == "stop" for reason in traj.finish_reasons)
    assert len(traj.token_ids) <= max_length
    assert all(c[1].max_tokens <= max_length - len(c[0]) for c in engine.calls)  # per-turn budget vs total context
    check_alignment(traj, engine, tiny_tokenizer.encode("Q:"))


async def test_max_turns_truncates_a_never_ending_env(tiny_engine, tiny_tokenizer):
    traj = await StepEnvRunner(NeverEnds, max_turns=2).execute(
        "Q:", None, one_token_turns(tiny_tokenizer), 512, tiny_tokenizer, tiny_engine
    )
    assert traj.truncated and traj.num_turns == 2 and traj.reward == 0.5


async def test_an_env_that_raises_ends_only_its_episode_with_a_reason(tiny_engine, tiny_tokenizer):
    traj = await StepEnvRunner(Exploding).execute(
        "Q:", None, SamplingParams(max_tokens=3), 64, tiny_tokenizer, tiny_engine
    )
    assert traj.failure == "step: RuntimeError: grader crashed on purpose"
    assert not traj.ok and traj.num_action_tokens > 0


async def test_prompt_longer_than_the_context_fails_cleanly(tiny_engine, tiny_tokenizer):
    traj = await StepEnvRunner(OneTurn).execute("word " * 100, None, SamplingParams(), 16, tiny_tokenizer, tiny_engine)
    assert not traj.ok and "leaves no room under max_length=16" in traj.failure


def test_load_agent_runner_from_a_file(tmp_path):
    path = tmp_path / "agent.py"
    path.write_text(
        "from molt_envs import Env, Result, StepEnvRunner\n"
        "class E(Env):\n    async def step(self, state):\n        return Result(reward=1.0)\n"
        "class AgentRunner(StepEnvRunner):\n    def __init__(self):\n        super().__init__(E)\n"
    )
    runner = load_agent_runner(path)
    assert isinstance(runner, StepEnvRunner)
    (tmp_path / "bad.py").write_text("x = 1\n")
    with pytest.raises(TypeError, match="must define `AgentRunner`"):
        load_agent_runner(tmp_path / "bad.py")
    with pytest.raises(FileNotFoundError, match="must be an existing .py file"):
        load_agent_runner(tmp_path / "missing.py")
