"""`molt/python-tool-v1` end to end: a tool call runs in a real sandbox and its output comes back as masked tokens."""

from __future__ import annotations

import pytest
from chat_support import ScriptedEngine

import env_registry
import sandboxes
from molt_envs import SamplingParams
from molt_envs.tools import ToolBox, format_result, truncate_for_model

needs_sandbox = pytest.mark.skipif(
    sandboxes.probe().auto is None, reason="no sandbox provider works on this host (see sandboxes.probe())"
)


@needs_sandbox
async def test_tool_call_runs_in_the_sandbox_and_answer_is_graded(tiny_tokenizer):
    code_call = '<tool_call>\n{"name": "python_executor", "arguments": {"code": "print(123 * 456 - 7)"}}\n</tool_call>'
    engine = ScriptedEngine(
        tiny_tokenizer, [code_call, "\\boxed{56081}"]
    )  # the model is scripted; env and sandbox are real
    runner = env_registry.runner_for("molt/python-tool-v1")
    traj = await runner.execute(
        "What is 123 * 456 - 7?", "56081", SamplingParams(max_tokens=64), 1024, tiny_tokenizer, engine
    )
    assert traj.ok, traj.failure
    assert traj.reward == 1.0 and traj.num_turns == 2 and traj.info["tool_calls"] == 1.0
    text = tiny_tokenizer.decode(traj.token_ids)
    assert "# Tools" in text and '"name": "python_executor"' in text  # tools rendered into the prompt
    assert "<tool_response>\n56081\n</tool_response>" in text
    (_, first_end), (second_start, _) = traj.action_ranges
    feedback = traj.token_ids[first_end:second_start]
    assert "56081" in tiny_tokenizer.decode(feedback) and all(
        lp == 0.0 for lp in traj.log_probs[first_end:second_start]
    )
    assert engine.calls[1][0] == traj.token_ids[:second_start]


@needs_sandbox
async def test_toolbox_contains_hostile_code_and_reports_status():
    async with ToolBox("auto", wall_s=2.0) as tools:
        out = await tools.call("python_executor", {"code": "import socket; socket.create_connection(('1.1.1.1', 80))"})
        assert "status: error" in out
        spin = await tools.call("python_executor", {"code": "while True: pass"})
        assert "status: timeout" in spin or "status: cpu_limit" in spin  # whichever limit trips first (cpu_s = wall_s)
        assert await tools.call("shell", {"command": "echo hi"}) == "hi"
        assert (await tools.call("nope", {})).startswith("error: unknown tool 'nope'")
        assert "needs a string argument 'code'" in await tools.call("python_executor", {"code": 3})
        assert "not valid JSON" in await tools.call("python_executor", "{oops")


@needs_sandbox
async def test_persistent_toolbox_keeps_state_between_calls():
    async with ToolBox("auto", persistent=True) as tools:
        await tools.python_executor("x = 41")
        assert (await tools.python_executor("print(x + 1)")).strip() == "42"


def test_truncation_marker_is_visible():
    text = "a" * 50 + "b" * 50
    cut = truncate_for_model(text, 60)
    assert cut.startswith("a") and cut.endswith("b") and "characters truncated" in cut and len(cut) < len(text)
    assert truncate_for_model("short", 60) == "short"
    ok = sandboxes.Result(
        stdout="x" * 10,
        stderr="",
        exit_code=0,
        signal=None,
        status="ok",
        truncated=False,
        wall_ms=1.0,
        provider="local",
    )
    assert format_result(ok, 100) == "x" * 10
