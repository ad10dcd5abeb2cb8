"""``molt-env serve-env ID... --protocol openenv``: our envs driven by OpenEnv's released client (``GenericEnvClient``
over ``/ws``) against a real server process, and the session bookkeeping of the OpenEnv app."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import threading

import httpx
import pytest

pytest.importorskip("openenv", reason="the openenv extra is part of [dev]")

from openenv.core.generic_client import GenericEnvClient  # noqa: E402

import env_registry  # noqa: E402
from env_registry.ecosystems.openenv import server as openenv_server  # noqa: E402

IDS = ["molt/sort-v1", "molt/python-tool-v1", "molt/tictactoe-v4"]
READY = re.compile(r"at (http://\S+?)/molt/sort-v1")


@pytest.fixture(scope="module")
def server():
    """A real ``molt-env serve-env --protocol openenv`` process serving three IDs (at most 2 sessions each)."""
    cmd = [sys.executable, "-m", "env_registry.cli", "serve-env", *IDS, "--protocol", "openenv", "--port", "0"]
    proc = subprocess.Popen(
        [*cmd, "--max-sessions", "2", "--exit-on-stdin-eof"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    for line in proc.stdout:
        lines.append(line)
        if match := READY.search(line):
            break
    else:
        raise AssertionError("the server did not start:\n" + "".join(lines))
    threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
    yield match[1]
    proc.stdin.close()
    proc.wait(timeout=30)


def run(coro):
    return asyncio.run(coro)


def test_sort_episode_rewards_the_right_answer_fully_and_a_wrong_one_less(server):
    async def episode(answer_of) -> tuple[float, bool, dict]:
        async with GenericEnvClient(base_url=f"{server}/molt/sort-v1") as client:
            first = await client.reset(seed=5)
            prompt = first.observation["messages"][-1]["content"]
            assert first.observation["text"].endswith(prompt) and not first.done
            result = await client.step({"message": answer_of(prompt.removeprefix("sort:").removesuffix("="))})
            return result.reward, result.done, result.observation["info"]

    right, done, info = run(episode(lambda digits: "".join(sorted(digits))))
    assert (right, done, info["exact"]) == (1.0, True, 1.0)
    wrong, done, info = run(episode(lambda digits: "".join(sorted(digits, reverse=True)) + "9"))
    assert done and wrong < 1.0 and info["exact"] == 0.0


def test_the_episode_of_a_seed_is_row_seed_of_the_split(server):
    rows = env_registry.load_split(env_registry.spec("molt/sort-v1"), "train", 8)

    async def prompt(seed: int) -> str:
        async with GenericEnvClient(base_url=f"{server}/molt/sort-v1") as client:
            return (await client.reset(seed=seed)).observation["messages"][-1]["content"]

    assert [run(prompt(i)) for i in (0, 7)] == [rows[0]["prompt"][-1]["content"], rows[7]["prompt"][-1]["content"]]


@pytest.mark.isolation
def test_python_tool_env_runs_its_tool_call_in_the_sandbox_and_grades_the_answer(server):
    row = env_registry.load_split(env_registry.spec("molt/python-tool-v1"), "train", 1)[0]

    async def episode() -> list:
        async with GenericEnvClient(base_url=f"{server}/molt/python-tool-v1") as client:
            first = await client.reset(seed=0)
            assert [t["function"]["name"] for t in first.observation["tools"]] == ["python_executor"]
            call = {"name": "python_executor", "arguments": {"code": "print(6 * 7, sum(range(5)))"}}
            tool = await client.step({"message": "", "tool_calls": [call]})
            answer = await client.step({"message": f"\\boxed{{{row['label']}}}"})
            return [tool, answer]

    tool, answer = run(episode())
    assert not tool.done and "42 10" in tool.observation["text"]  # the sandbox's output, fed back
    assert tool.observation["feedback"][0]["role"] == "tool"
    assert answer.done and answer.reward == 1.0


def test_a_game_is_one_session_with_the_seat_to_move_and_opposite_rewards(server):
    async def game():
        async with GenericEnvClient(base_url=f"{server}/molt/tictactoe-v4") as client:
            start = await client.reset(seed=1)
            x = start.observation["seat"]
            free = re.search(r"Free: ([\d ]+)", start.observation["text"])[1].split()
            first = await client.step({"message": free[0]})
            o = first.observation["seat"]
            with pytest.raises(Exception, match="cannot move"):
                await client.step({"message": free[1], "seat": x})  # not x's turn
            last = await client.step({"message": free[0]})  # onto the taken square: o forfeits
            return x, o, first, last

    x, o, first, last = run(game())
    assert x != o and not first.done
    assert last.done and last.reward == -1.0 and last.observation["rewards"] == {x: 1.0, o: -1.0}


def test_a_malformed_action_gets_openenvs_validation_error_naming_the_field(server):
    """On the raw wire (OpenEnv's client shows only the message): the error's ``errors`` name the field."""
    from websockets.sync.client import connect

    with connect(server.replace("http://", "ws://") + "/molt/sort-v1/ws") as ws:
        ws.send(json.dumps({"type": "reset", "data": {"seed": 0}}))
        assert json.loads(ws.recv())["type"] == "observation"
        ws.send(json.dumps({"type": "step", "data": {"mesage": "123"}}))
        error = json.loads(ws.recv())
    assert error["type"] == "error" and error["data"]["code"] == "VALIDATION_ERROR"
    assert ["mesage"] in [list(e["loc"]) for e in error["data"]["errors"]]


def test_sessions_past_max_sessions_get_capacity_reached(server):
    async def three():
        clients = [GenericEnvClient(base_url=f"{server}/molt/sort-v1") for _ in range(3)]
        try:
            for client in clients[:2]:
                await client.connect()
                await client.reset(seed=0)
            await clients[2].connect()
            await clients[2].reset(seed=0)
        finally:
            for client in clients:
                await client.close()

    with pytest.raises(Exception, match="CAPACITY_REACHED"):
        run(three())


def test_schema_health_and_metadata_are_openenvs(server):
    schema = httpx.get(f"{server}/molt/sort-v1/schema").json()
    assert {"message", "tool_calls", "seat"} <= set(schema["action"]["properties"])
    assert {"messages", "feedback", "tools"} <= set(schema["observation"]["properties"])
    assert httpx.get(f"{server}/molt/sort-v1/health").json()["status"] == "healthy"
    assert httpx.get(f"{server}/molt/sort-v1/metadata").json()["name"] == "molt/sort-v1"


def test_refusals_name_the_flag_and_what_acts():
    cli = [sys.executable, "-m", "env_registry.cli", "serve-env"]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    for args, message in [
        (["molt/sort-v1", "molt/arith-v1"], "serves one ID per process"),
        (["molt/sort-v1", "--max-sessions", "4"], "--max-sessions acts on --protocol openenv only"),
        (["molt/sort-v1", "--protocol", "openenv", "--max-episodes", "4"], "--max-episodes acts on --protocol molt"),
    ]:
        proc = subprocess.run([*cli, *args, "--port", "0"], capture_output=True, text=True, timeout=60, env=env)
        assert proc.returncode != 0 and message in proc.stderr, (args, proc.stderr)


def test_no_env_instance_is_left_after_a_thousand_sessions_or_an_idle_one():
    """In process (to count what the app holds): 1,000 sessions opened, played and closed, then one left idle."""
    import uvicorn

    app = openenv_server.openenv_app(["molt/sort-v1"], max_sessions=8, session_timeout_s=1.0)
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", ws="websockets-sansio")
    uv = uvicorn.Server(config)
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    while not uv.started:
        threading.Event().wait(0.05)
    url = f"http://127.0.0.1:{uv.servers[0].sockets[0].getsockname()[1]}"

    async def sessions(n: int) -> None:
        async def one(i: int) -> None:
            async with GenericEnvClient(base_url=url) as client:
                await client.reset(seed=i)
                if i % 2:
                    await client.step({"message": "0"})

        for start in range(0, n, 8):
            await asyncio.gather(*(one(i) for i in range(start, min(start + 8, n))))

    async def idle() -> str:
        async with GenericEnvClient(base_url=url) as client:
            await client.reset(seed=0)
            assert len(openenv_server.HOLDING) == 1
            await asyncio.sleep(2.0)  # past the 1 s idle timeout
            assert not openenv_server.HOLDING
            with pytest.raises(Exception, match="idled past 1 s") as caught:
                await client.step({"message": "0"})
            return str(caught.value)

    try:
        run(sessions(1000))
        assert not openenv_server.HOLDING
        run(idle())
    finally:
        uv.should_exit = True
        thread.join(timeout=10)
