"""Remote envs: ``molt-env serve-env`` in its own process, driven through ``make``/``runner_for`` on its URL; episodes
are token-exact with the same env in process; bad servers and bad messages are clear errors or counted failures."""

from __future__ import annotations

import asyncio
import json
import random
import re
import subprocess
import sys
import textwrap

import httpx
import pytest
from packaging_support import MOLT_ENV, run_cli

import env_registry
import sandboxes
from env_registry.errors import EnvServerUnavailable, InvalidEnvId, RegistrationError
from molt_envs import SamplingParams
from molt_envs.replay_model import ByteChatTokenizer, ReplayEngine

READY = re.compile(r" at (http://\S+) \(")


def start(cmd: list[str]) -> tuple[subprocess.Popen, str]:
    """Run a server command; returns it and the URL of its ready line."""
    process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = process.stdout.readline()
    match = READY.search(line)
    if match is None:
        process.kill()
        raise RuntimeError(f"{cmd} did not come up: {line!r}")
    return process, match[1]


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture(scope="module")
def served():
    """``served(env_id, *flags)`` -> the URL of a ``molt-env serve-env`` of that ID (one per module and flags)."""
    running: dict[tuple[str, ...], tuple[subprocess.Popen, str]] = {}

    def serve(env_id: str, *flags: str) -> str:
        key = (env_id, *flags)
        if key not in running:
            running[key] = start([MOLT_ENV, "serve-env", env_id, "--port", "0", *flags])
        return running[key][1]

    yield serve
    for process, _ in running.values():
        stop(process)


def run(env_id: str, text: str, label: str, prompt: object = "1+2=", max_tokens: int = 16):
    tokenizer = ByteChatTokenizer()
    runner = env_registry.runner_for(env_id)
    params = SamplingParams(max_tokens=max_tokens)
    return asyncio.run(runner.execute(prompt, label, params, 4096, tokenizer, ReplayEngine(tokenizer, text)))


def same_episode(a, b) -> None:
    assert a.token_ids == b.token_ids and a.log_probs == b.log_probs and a.action_ranges == b.action_ranges
    assert (a.reward, a.score, a.info, a.truncated, a.num_turns) == (
        b.reward,
        b.score,
        b.info,
        b.truncated,
        b.num_turns,
    )
    assert (a.env_id, a.spec_hash, a.failure) == (b.env_id, b.spec_hash, b.failure)


def test_the_spec_hash_and_rows_come_from_the_server(served):
    url = served("molt/arith-v1")
    remote, local = env_registry.spec(url), env_registry.spec("molt/arith-v1")
    assert remote.hash == local.hash and remote.model_dump() == local.model_dump()
    assert env_registry.EnvSpec.from_json(remote.to_json()).hash == local.hash  # it serializes as a plain spec
    assert env_registry.load_split(remote, "test", 5) == env_registry.load_split(local, "test", 5)
    assert env_registry.count_rows(remote, "test") == 500
    with pytest.raises(env_registry.Error, match="no dataset split 'dev'"):
        env_registry.load_split(remote, "dev")


def test_a_remote_episode_is_token_exact_with_the_env_in_process(served):
    url = served("molt/arith-v1")
    for text in ("3", "41"):
        remote, local = run(url, text, "3"), run("molt/arith-v1", text, "3")
        same_episode(remote, local)
    assert remote.reward == 0.0 and run(url, "3", "3").reward == 1.0


def test_a_served_game_is_played_through_the_wire_as_in_process(served):
    """``molt/tictactoe-v4`` served: a ``RemoteGame`` whose seats, moves, random opponents and returns are the
    server's, token-exact with the game in process (self-play, and the model against a random player)."""
    url = served("molt/tictactoe-v4")
    game = env_registry.make(url)
    try:
        assert type(game).__name__ == "RemoteGame" and game.spec.kind == "game" and len(game.seats) == 2
    finally:
        game.close()
    moves = [f"<move>{square}</move>" for square in (4, 0, 8, 2, 6, 1, 3, 5, 7)]
    for label in ({"seed": 5}, {"seed": 6, "mode": "vs", "opponent": "random", "model_seat": 1}):
        tokenizer = ByteChatTokenizer()
        episodes = [
            asyncio.run(
                env_registry.runner_for(env_id).execute(
                    "tic", label, SamplingParams(max_tokens=32), 4096, tokenizer, ReplayEngine(tokenizer, moves)
                )
            )
            for env_id in (url, "molt/tictactoe-v4")
        ]
        remote, local = episodes
        assert remote and len(remote) == len(local) and all(t.ok for t in remote), [t.failure for t in remote]
        for a, b in zip(remote, local, strict=True):
            assert a.seat == b.seat
            same_episode(a, b)
        if label.get("mode") != "vs":
            assert sum(t.reward for t in remote) == 0.0


@pytest.mark.skipif(sandboxes.probe().auto is None, reason="no sandbox provider works on this host")
def test_a_multi_turn_tool_env_runs_its_sandboxed_tool_in_the_server(served):
    call = '<tool_call>\n{"name": "python_executor", "arguments": {"code": "print(6 * 7)"}}\n</tool_call>'
    url = served("molt/python-tool-v1")
    remote = run(url, call, "42", prompt="What is 6 * 7?", max_tokens=128)
    local = run("molt/python-tool-v1", call, "42", prompt="What is 6 * 7?", max_tokens=128)
    same_episode(remote, local)
    assert remote.num_turns == 4 and remote.truncated  # max_turns of tool calls, each answered by the sandbox
    assert "<tool_response>\n42\n</tool_response>" in ByteChatTokenizer().decode(remote.token_ids)


def test_a_served_chat_agent_calls_back_the_trainers_session_server(served):
    url = served("molt/chat-gsm8k-v1")
    remote = run(url, "so \\boxed{3}", "3", prompt=[{"role": "user", "content": "1+2?"}], max_tokens=64)
    local = run("molt/chat-gsm8k-v1", "so \\boxed{3}", "3", prompt=[{"role": "user", "content": "1+2?"}], max_tokens=64)
    assert len(remote) == len(local) == 1
    remote[0].rollout_id = local[0].rollout_id = ""
    same_episode(remote[0], local[0])
    assert remote[0].reward == 1.0


def test_an_env_failure_in_the_server_keeps_its_stage(served):
    remote, local = run(served("molt/arith-v1"), "3", "not a number"), run("molt/arith-v1", "3", "not a number")
    assert local.failure.startswith("step: ValueError: invalid literal")
    assert remote.failure.startswith("step: RemoteEnvError: ValueError: invalid literal")  # counted as failure_step


def test_make_of_a_url_refuses_what_cannot_cross(served):
    url = served("molt/arith-v1")
    with pytest.raises(RegistrationError, match="kwargs"):
        env_registry.make(url, max_operand=5)
    with pytest.raises(RegistrationError, match="no class to import"):
        env_registry.registry.load(url)
    with pytest.raises(EnvServerUnavailable, match="pins package version 9.9"):
        env_registry.spec(url + "@9.9")
    with pytest.raises(InvalidEnvId, match="not an env ID"):
        env_registry.spec(url.rsplit("/", 2)[0] + "/no such id")
    with pytest.raises(InvalidEnvId, match="unknown option"):
        env_registry.spec(url + "?retries=3")


def test_max_episodes_makes_later_episodes_wait(served):
    url = served("molt/arith-v1", "--max-episodes", "1")

    async def two_episodes():
        first, second = env_registry.make(url), env_registry.make(url)
        state = {"observation": "1+2=", "label": "3", "images": []}
        await first.reset(state)
        waiting = asyncio.create_task(second.reset(state))
        await asyncio.sleep(1.0)
        blocked = not waiting.done()
        await first.close()
        await asyncio.wait_for(waiting, 30)
        await second.close()
        return blocked

    assert asyncio.run(two_episodes())


async def exchange(url: str, protocol: str, *messages: str | None) -> list[dict]:
    from websockets.asyncio.client import connect

    base = url.replace("http://", "ws://")
    async with connect(f"{base}/ws?protocol={protocol}") as ws:
        answers = []
        for message in messages:
            if message is not None:
                await ws.send(message)
            answers.append(json.loads(await ws.recv()))
        return answers


def test_the_server_answers_malformed_messages_and_keeps_the_episode(served):
    url = served("molt/arith-v1")
    step = {"observation_text": "1+2=3", "action_text": "3", "label": "3", "sampling_params": {}, "turn": 0}
    bad, unknown, no_field, good = asyncio.run(
        exchange(
            url,
            "1",
            "{not json",
            json.dumps({"type": "teleport", "data": {}}),
            json.dumps({"type": "step", "data": {**step, "turn": -1}}),
            json.dumps({"type": "step", "data": step}),
        )
    )
    assert (bad["type"], bad["data"]["code"]) == ("error", "INVALID_JSON")
    assert unknown["data"]["code"] == "VALIDATION_ERROR" and "teleport" in unknown["data"]["message"]
    assert no_field["data"]["code"] == "VALIDATION_ERROR" and "turn" in no_field["data"]["message"]
    assert good["type"] == "observation" and good["data"]["reward"] == 1.0 and good["data"]["done"] is True


def test_a_game_session_refuses_what_is_no_game_call_and_stays_open(served):
    url = served("molt/tictactoe-v4")
    rng = [3, list(random.Random(0).getstate()[1]), None]
    setup, step, model, reset, env_reset = asyncio.run(
        exchange(
            url,
            "1",
            json.dumps({"type": "game", "data": {}}),
            json.dumps(
                {"type": "step", "data": {"observation_text": "", "action_text": "", "sampling_params": {}, "turn": 0}}
            ),
            json.dumps({"type": "play_policy", "data": {"seat": "x", "policy": "model", "rng_state": rng}}),
            json.dumps({"type": "game_reset", "data": {"seed": 1}}),
            json.dumps({"type": "reset", "data": {"observation": ""}}),
        )
    )
    assert setup["type"] == "game" and len(setup["data"]["setup"]["seats"]) == 2
    assert step["data"]["code"] == "UNKNOWN_TYPE" and "is a game" in step["data"]["message"]
    assert model["data"]["code"] == "VALIDATION_ERROR" and "play_text" in model["data"]["message"]
    assert reset["type"] == "game" and reset["data"]["to_move"] in setup["data"]["setup"]["seats"]
    assert env_reset["data"]["code"] == "UNKNOWN_TYPE"
    (no_game,) = asyncio.run(exchange(served("molt/arith-v1"), "1", json.dumps({"type": "returns", "data": {}})))
    assert no_game["data"]["code"] == "UNKNOWN_TYPE" and "not a game" in no_game["data"]["message"]


def test_a_client_of_another_protocol_version_is_refused(served):
    (answer,) = asyncio.run(exchange(served("molt/arith-v1"), "2", None))  # the server speaks first, and closes
    assert answer["data"]["code"] == "PROTOCOL_MISMATCH" and "molt-env/1" in answer["data"]["message"]


# -- servers that are not what they claim (real processes on loopback) --

HOSTILE = textwrap.dedent("""
    import json, sys
    from fastapi import FastAPI, WebSocket
    from fastapi.responses import HTMLResponse
    from molt_envs.remote.server import serve

    mode, metadata = sys.argv[1], json.loads(sys.argv[2])
    app = FastAPI()
    env = metadata["id"]

    @app.get("/health")
    def health():
        if mode == "html":
            return HTMLResponse("<html><body>a web page</body></html>")
        if mode == "not-health":
            return {"hello": "world"}
        return {"status": "healthy", "protocol": "molt-env/2" if mode == "v2" else "molt-env/1", "envs": [env]}

    @app.get(f"/{env}/metadata")
    def get_metadata():
        return metadata

    @app.websocket(f"/{env}/ws")
    async def episode(ws: WebSocket):
        await ws.accept()
        while True:
            message = json.loads(await ws.receive_text())
            if message["type"] == "reset":
                state = message["data"]
                await ws.send_text(json.dumps({"type": "observation", "data": {"observation": state}}))
            else:
                await ws.send_text('{"type": "observation", "data": {"reward": "lots"}}')

    serve(app, on_ready=lambda url: print(f"hostile at {url}/{env} (test)", flush=True))
""")


@pytest.fixture
def hostile(tmp_path, served):
    metadata = httpx.get(f"{served('molt/arith-v1')}/metadata").json()
    script = tmp_path / "hostile.py"
    script.write_text(HOSTILE)
    processes = []

    def start_hostile(mode: str) -> str:
        process, url = start([sys.executable, str(script), mode, json.dumps(metadata)])
        processes.append(process)
        return url

    yield start_hostile
    for process in processes:
        stop(process)


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        ("html", "is not an env server's health"),
        ("not-health", "is not an env server's health"),
        ("v2", "speaks 'molt-env/2', this client speaks 'molt-env/1'"),
    ],
)
def test_a_url_that_is_no_env_server_of_this_protocol_is_a_clear_error_naming_it(hostile, mode, message):
    url = hostile(mode)
    with pytest.raises(EnvServerUnavailable, match=re.escape(message)) as caught:
        env_registry.make(url)
    assert url.rsplit("/", 2)[0] in str(caught.value)


def test_nothing_listening_is_a_clear_error_naming_the_url():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(EnvServerUnavailable, match=f"nothing answers at http://127.0.0.1:{port}"):
        env_registry.make(f"http://127.0.0.1:{port}/molt/arith-v1")


def test_a_served_id_that_is_not_there_is_a_clear_error(served):
    base = served("molt/arith-v1").rsplit("/", 2)[0]
    with pytest.raises(EnvServerUnavailable, match=r"serves \['molt/arith-v1'\], not 'molt/gsm8k-v1'"):
        env_registry.make(f"{base}/molt/gsm8k-v1")


def test_a_garbage_answer_mid_episode_is_a_counted_protocol_failure(hostile):
    episode = run(hostile("garbage-steps"), "3", "3")
    assert episode.failure.startswith("remote_protocol: ProtocolViolation:"), episode.failure
    assert "not molt-env/1" in episode.failure


def test_molt_env_check_and_info_reach_the_server(served):
    url = served("molt/arith-v1")
    checked = run_cli("check", url)
    assert checked.returncode == 0 and "served by the env server at" in checked.stdout, checked.stdout
    info = run_cli("info", url)
    assert info.returncode == 0 and json.loads(info.stdout)["hash"] == env_registry.spec("molt/arith-v1").hash
