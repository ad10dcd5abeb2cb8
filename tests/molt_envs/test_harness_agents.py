"""The real Claude Code and Codex CLIs (npm, installed by ``make harnesses``) as ChatAgents: each runs in a fresh
jail, calls the policy through its session (scripted model text here, so the tool calls are known), runs its own
tool in the jail, and the final workspace is graded; crashes, timeouts and a missing install are counted failures."""

from __future__ import annotations

import pytest
from chat_support import ScriptedEngine

import sandboxes
from molt_envs import ChatAgentRunner, SamplingParams
from molt_envs.chat_runner import close_session_servers
from molt_envs.envs.harness_agents import ClaudeCodeAgent, CodexAgent, generate_split
from molt_envs.harness import DEFAULT_INSTALL_DIR

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(bool(sandboxes.probe().local_missing), reason="the harness jail needs local isolation"),
]
TOOL = {ClaudeCodeAgent: ("Bash", "command"), CodexAgent: ("exec_command", "cmd")}
TASK = next(generate_split("train", size=1))


def writes_answer(agent_class, command: str):
    name, key = TOOL[agent_class]
    return f'<tool_call>\n{{"name": "{name}", "arguments": {{"{key}": "{command}"}}}}\n</tool_call>'


async def episodes(agent_factory, script, n=1, tokenizer=None):
    engine = ScriptedEngine(tokenizer, script)
    runner = ChatAgentRunner(agent_factory, env_id="molt/harness-test-v1")
    try:
        results = [
            await runner.execute(
                TASK["question"], TASK["answer"], SamplingParams(max_tokens=64), 32768, tokenizer, engine
            )
            for _ in range(n)
        ]
    finally:
        await close_session_servers()
    return engine, results


@pytest.mark.parametrize("agent_class", [ClaudeCodeAgent, CodexAgent])
async def test_the_cli_runs_its_tool_in_the_jail_and_the_workspace_is_graded(tiny_tokenizer, agent_class):
    answer = writes_answer(agent_class, f"echo {TASK['answer']} > answer.txt")

    def model(turn, prompt_ids):
        return answer if turn % 2 == 0 else f"I wrote {TASK['answer']} into answer.txt."

    engine, [[first], [second]] = await episodes(agent_class, model, n=2, tokenizer=tiny_tokenizer)
    for segment in (first, second):
        assert segment.failure is None and segment.reward == 1.0
        assert segment.info["file_correct"] == 1.0 and segment.info["answer_in_reply"] == 1.0
        assert segment.info["jail_leftovers"] == 0.0  # the second episode's jail did not see the first's files
        assert len(segment.action_ranges) == 2  # the tool result came back as a continuation of one segment
    prompt, _, gen = engine.calls[0]
    assert first.token_ids[: first.prompt_len] == prompt and first.token_ids[slice(*first.action_ranges[0])] == (
        gen.token_ids
    )
    assert engine.calls[1][0] == first.token_ids[: first.action_ranges[1][0]]  # what the model saw, exactly


async def test_a_wrong_answer_is_reward_zero_not_a_failure(tiny_tokenizer):
    _, [[segment]] = await episodes(ClaudeCodeAgent, lambda turn, _: "I cannot do that.", tokenizer=tiny_tokenizer)
    assert segment.failure is None and segment.reward == 0.0 and segment.info["file_written"] == 0.0


async def test_a_harness_that_runs_too_long_is_a_counted_timeout(tiny_tokenizer):
    looping = writes_answer(ClaudeCodeAgent, "sleep 60")
    _, [[segment]] = await episodes(
        lambda: ClaudeCodeAgent(timeout_s=8), lambda turn, _: looping, tokenizer=tiny_tokenizer
    )
    assert segment.failure.startswith("harness_timeout:") and segment.num_turns == 1


async def test_a_harness_that_gives_up_is_graded_not_dropped(tiny_tokenizer):
    calls_forever = writes_answer(ClaudeCodeAgent, "true")  # past --max-turns, claude -p exits 1
    _, [[segment]] = await episodes(
        lambda: ClaudeCodeAgent(max_turns=1), lambda turn, _: calls_forever, tokenizer=tiny_tokenizer
    )
    assert segment.failure is None and segment.reward == 0.0 and segment.info["exit_code"] == 1.0


async def test_a_harness_killed_by_a_signal_is_a_counted_crash(tiny_tokenizer):
    kill_harness = writes_answer(ClaudeCodeAgent, "kill -9 $PPID")  # the model's command kills Claude Code
    _, [[segment]] = await episodes(ClaudeCodeAgent, lambda turn, _: kill_harness, tokenizer=tiny_tokenizer)
    assert segment.failure.startswith("harness_crash:") and "signal 9" in segment.failure, segment.failure


async def test_a_missing_install_is_counted_and_says_how_to_install(tiny_tokenizer, tmp_path):
    _, [[segment]] = await episodes(
        lambda: CodexAgent(install_dir=str(tmp_path)), ["never called"], tokenizer=tiny_tokenizer
    )
    assert segment.failure.startswith("harness_missing:") and "make harnesses" in segment.failure
    assert DEFAULT_INSTALL_DIR.name == ".harnesses"
