"""``openenv:URL`` and ``openenv:PACKAGE``: OpenEnv 0.10.0 envs through OpenEnv's own client, for real.

The env is written here with OpenEnv's server API (``create_app``, its ``Environment``, ``Action``/``Observation``
subclasses; and an ``MCPEnvironment`` with FastMCP tools): guess a seed-chosen secret word, -0.25 per wrong guess and
+1 for the right one. It runs as real uvicorn processes (by URL), and as a package this project serves itself. Shown:
the spec resolved with the server's version stamped, whole episodes through the real runner with the exact summed
reward, invalid actions counted, MCP tools, every failure ending its episode with a counted reason, bad input
failing at resolve time naming the URL, ``molt-env check``, ``molt-env eval`` with exact pass@k against a scripted
endpoint, and two RL steps of ``molt-train rl`` on the tiny model."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

import env_registry
from env_registry.cli import main as molt_env_main
from env_registry.datasets import load_split
from env_registry.ecosystems.openenv.source import SOURCE
from env_registry.ecosystems.openenv.wire import parse_action
from env_registry.errors import EnvServerUnavailable, NameNotFound, UnregisteredEnv
from env_registry.evaluation import pass_at_k
from env_registry.mix import split_weight
from env_registry.runners import runner_for
from molt_envs import SamplingParams
from molt_envs.replay_model import ByteChatTokenizer, ReplayEngine

pytest.importorskip("openenv")

MOLT_TRAIN = str(Path(sys.executable).with_name("molt-train"))
TOK = ByteChatTokenizer()
PARAMS = SamplingParams(max_tokens=256)
WORDS = ["apple", "berry", "cherry", "grape", "lemon", "mango", "peach", "plum"]

GUESS_APP = '''
"""guess_word: guess a seed-chosen secret word; -0.25 per wrong guess, +1 for the right one; 3 guesses."""
import os
import time

from pydantic import Field

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, EnvironmentMetadata, Observation, State

WORDS = ["apple", "berry", "cherry", "grape", "lemon", "mango", "peach", "plum"]


def target(seed):
    return WORDS[(seed or 0) * 5 % len(WORDS)]


def start_message(word):
    return f"Guess my secret word, one of: {', '.join(WORDS)}; it starts with {word[0]!r} and has {len(word)} letters."


class GuessAction(Action):
    word: str = Field(pattern="^[a-z]{1,12}$", description="your guess: one lowercase word")


class GuessObservation(Observation):
    message: str = ""
    guesses_left: int = 0


class GuessEnv(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state, self.target, self.left = State(step_count=0), target(0), 3

    def reset(self, seed=None, episode_id=None, **kwargs):
        self._state, self.target, self.left = State(episode_id=episode_id, step_count=0), target(seed), 3
        return GuessObservation(message=start_message(self.target), guesses_left=3)

    def step(self, action, timeout_s=None, **kwargs):
        if action.word == "sleep":
            time.sleep(5)
        self._state.step_count += 1
        self.left -= 1
        if action.word == self.target:
            return GuessObservation(message="correct!", guesses_left=self.left, done=True, reward=1.0)
        where = "after" if action.word < self.target else "before"
        message = f"no, not {action.word}; it comes {where} it in the alphabet"
        return GuessObservation(message=message, guesses_left=self.left, done=self.left == 0, reward=-0.25)

    @property
    def state(self):
        return self._state

    def get_metadata(self):
        return EnvironmentMetadata(name="guess_word", description="Guess a secret word from a list.", version="2.3.1")


app = create_app(
    GuessEnv, GuessAction, GuessObservation, env_name="guess_word",
    max_concurrent_envs=int(os.environ.get("GUESS_MAX_ENVS", "16")),
)
'''

TOOLS_APP = '''
"""guess_word_tools: the same game through MCP tools guess(word) and letters()."""
from fastmcp import FastMCP

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from openenv.core.env_server.types import Observation, State

from guess_env.server.app import start_message, target


class StartObservation(Observation):
    message: str


class ToolGuessEnv(MCPEnvironment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        mcp = FastMCP("guess")
        env = self

        @mcp.tool
        def guess(word: str) -> str:
            """Guess the secret word."""
            env.last = word
            return "correct!" if word == env.target else f"no, not {word}"

        @mcp.tool
        def letters() -> int:
            """How many letters the secret word has."""
            return len(env.target)

        super().__init__(mcp)
        self._state, self.target, self.last = State(step_count=0), target(0), None

    def reset(self, seed=None, episode_id=None, **kwargs):
        self._state, self.target, self.last = State(episode_id=episode_id, step_count=0), target(seed), None
        return StartObservation(message=start_message(self.target))

    async def step_async(self, action, timeout_s=None, **kwargs):
        self.last = None
        observation = await super().step_async(action, timeout_s=timeout_s, **kwargs)
        if self.last is not None:  # a guess: rewarded like the plain game
            self._state.step_count += 1
            observation.reward = 1.0 if self.last == self.target else -0.25
            observation.done = self.last == self.target or self._state.step_count >= 3
        return observation

    def _step_impl(self, action, timeout_s=None, **kwargs):
        raise ValueError("act through the tools")

    @property
    def state(self):
        return self._state


app = create_app(ToolGuessEnv, CallToolAction, CallToolObservation, env_name="guess_word_tools", max_concurrent_envs=8)
'''


def target(seed: int) -> str:
    return WORDS[seed * 5 % len(WORDS)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, deadline: float) -> None:
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the OpenEnv server at {url} exited: {proc.stderr.read().decode()[-2000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"the OpenEnv server at {url} did not start")


@pytest.fixture(scope="module")
def package_dir(tmp_path_factory) -> Path:
    """``guess_env``, an OpenEnv env package in OpenEnv's layout (``server/app.py``), installed as the distribution
    ``openenv-guess_env`` on a path of its own."""
    root = tmp_path_factory.mktemp("openenv-pkg")
    server = root / "guess_env" / "server"
    server.mkdir(parents=True)
    (root / "guess_env" / "__init__.py").write_text("")
    (server / "__init__.py").write_text("")
    (server / "app.py").write_text(GUESS_APP)
    (server / "tools_app.py").write_text(TOOLS_APP)
    (root / "guess_env" / "openenv.yaml").write_text(
        "spec_version: 1\nname: guess_env\napp: server.app:app\ndescription: Guess a secret word\n"
        "validation:\n  reward:\n    range: [-1.0, 1.0]\n"
    )
    dist = root / "openenv_guess_env-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: openenv-guess_env\nVersion: 0.1.0\n")
    return root


@pytest.fixture(scope="module")
def servers(package_dir):
    """The plain game and the MCP game, each a real uvicorn process on a free port (started side by side)."""
    procs, urls = [], {}
    for name, app in (("guess", "guess_env.server.app:app"), ("tools", "guess_env.server.tools_app:app")):
        port = free_port()
        cmd = [sys.executable, "-m", "uvicorn", app, "--app-dir", str(package_dir), "--port", str(port)]
        procs.append(subprocess.Popen([*cmd, "--log-level", "warning"], stderr=subprocess.PIPE))
        urls[name] = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        for proc, url in zip(procs, urls.values(), strict=True):
            wait_healthy(url, proc, deadline)
        yield urls
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)


@contextlib.contextmanager
def http_app(routes):
    """A Starlette app of ``routes`` on a free port in a thread (yields its URL)."""
    import uvicorn
    from starlette.applications import Starlette

    server = uvicorn.Server(uvicorn.Config(Starlette(routes=routes), port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture(scope="module")
def impostors():
    """Servers that are not OpenEnv's: ``/web`` a plain web site (404s), ``/garbage`` healthy but with garbage
    schemas, ``/text`` answers that are not JSON, ``/badws`` OpenEnv's answers over HTTP but garbage on ``/ws``."""
    from starlette.responses import JSONResponse, PlainTextResponse
    from starlette.routing import Route, WebSocketRoute

    schema = {"action": {"title": "A", "properties": {"word": {"type": "string"}}, "required": ["word"]}}
    schema["observation"] = {"title": "O", "properties": {}}
    answers = {
        "/garbage/health": {"status": "healthy"},
        "/garbage/schema": {"action": 5},
        "/garbage/metadata": {"name": "x"},
        "/badws/health": {"status": "healthy"},
        "/badws/schema": schema,
        "/badws/metadata": {"name": "badws", "description": "garbage on the socket"},
    }

    async def get(request):
        if request.url.path.startswith("/text/"):
            return PlainTextResponse("all good")
        if request.url.path in answers:
            return JSONResponse(answers[request.url.path])
        return PlainTextResponse("Not Found", status_code=404)

    async def ws(websocket):
        await websocket.accept()
        await websocket.receive_text()
        await websocket.send_text("this is not JSON {")
        await websocket.receive_text()

    with http_app([WebSocketRoute("/badws/ws", ws), Route("/{path:path}", get)]) as url:
        yield url


def play(env_id: str, replies: list[str], split: str = "test", engine=None):
    """One episode of ``env_id`` on the first row of ``split`` through the real runner, the model's replies scripted."""
    row = load_split(env_registry.spec(env_id), split, 1)[0]
    engine = engine or ReplayEngine(TOK, replies)
    return asyncio.run(runner_for(env_id).run_row(row, PARAMS, 65536, TOK, engine)), row


def test_a_url_resolves_to_a_spec_with_the_servers_version_and_seed_tasks(servers):
    spec = env_registry.spec(f"openenv:{servers['guess']}")
    assert spec.id == f"openenv:{servers['guess']}" and spec.kind == "env" and spec.deterministic is False
    assert spec.upstream == {
        "ecosystem": "openenv", "library": "openenv", "version": "0.10.0", "license": "BSD-3-Clause",
        "server": "guess_word", "server_version": "2.3.1",
    }  # fmt: skip
    assert spec.kwargs["base_url"] == servers["guess"] and spec.kwargs["mcp"] is False
    assert spec.kwargs["action_schema"]["required"] == ["word"]
    assert "Guess a secret word from a list" in spec.description
    assert env_registry.spec(f"openenv:{servers['guess']}").hash == spec.hash
    train = [r["label"]["seed"] for r in load_split(spec, "train", 3)]
    test = [r["label"]["seed"] for r in load_split(spec, "test", 3)]
    assert train == [0, 1, 2] and test == [1_000_000, 1_000_001, 1_000_002]
    picked = env_registry.spec(f"openenv:{servers['guess']}?seeds=[7,3]")
    assert [r["label"] for r in load_split(picked, "test")] == [{"seed": 7}, {"seed": 3}]
    assert picked.hash != spec.hash
    url = servers["guess"]  # --env ID[:weight]: a URL's port and kwargs are no weight
    assert split_weight(f"openenv:{url}?seeds=[7,3]") == (f"openenv:{url}?seeds=[7,3]", None)
    assert split_weight(f"openenv:{url}:2") == (f"openenv:{url}", 2.0)
    assert env_registry.spec(f"openenv:{url}/").id == spec.id


def test_an_episode_through_the_runner_sums_the_servers_rewards(servers):
    seed = 1_000_000
    wrong = [w for w in WORDS if w != target(seed)]
    replies = [wrong[0], f'Sure.\n```json\n{{"word": "{wrong[1]}"}}\n```', f'{{"word": "{target(seed)}"}}']
    traj, row = play(f"openenv:{servers['guess']}", replies)
    assert row["label"] == {"seed": seed} and traj.failure is None
    assert traj.reward == -0.25 - 0.25 + 1.0 and traj.score == 0.5 and traj.num_turns == 3
    assert traj.info == {"invalid_action": 0.0, "invalid_actions": 0.0, "env_steps": 3.0, "total_reward": 0.5}
    text = TOK.decode(traj.token_ids)
    assert '"required": ["word"]' in text and "Or reply with just the value of 'word'" in text  # the schema
    assert f"starts with {target(seed)[0]!r}" in text and "guesses_left: 1" in text  # observations as text
    assert "metadata" not in text.split("<|im_start|>user")[1]  # OpenEnv's metadata field is never shown


def test_invalid_actions_are_counted_and_end_the_episode_unless_allowed(servers):
    url, word = servers["guess"], target(1_000_000)
    traj, _ = play(f"openenv:{url}", ["Plum!"])  # the server refuses it (its pattern): VALIDATION_ERROR
    assert traj.failure is None and traj.reward == 0.0 and traj.num_turns == 1
    assert traj.info["invalid_action"] == 1.0 and traj.info["invalid_actions"] == 1.0 and traj.info["env_steps"] == 0
    retry = f"openenv:{url}?max_invalid_actions=1&invalid_reward=-0.5"
    traj, _ = play(retry, ['{"guess": "plum"}', word])  # a field the schema does not have, then the word
    assert traj.failure is None and traj.reward == -0.5 + 1.0 and traj.num_turns == 2
    assert traj.info["invalid_action"] == 0.0 and traj.info["invalid_actions"] == 1.0
    assert "Invalid action: the server refused it" in TOK.decode(traj.token_ids)


def test_parse_action_reads_json_a_fenced_block_or_the_raw_text():
    one_string = {"properties": {"word": {"type": "string"}, "metadata": {}}, "required": ["word"]}
    two = {"properties": {"x": {"type": "integer"}, "y": {"type": "integer"}}, "required": ["x", "y"]}
    assert parse_action('{"x": 1, "y": 2}', two) == {"x": 1, "y": 2}
    assert parse_action('I move:\n```json\n{"x": 1}\n```\nthen\n```json\n{"x": 3, "y": 4}\n```', two) == {
        "x": 3,
        "y": 4,
    }
    assert parse_action('my action is {"x": 5, "y": 6} ok', two) == {"x": 5, "y": 6}
    assert parse_action("  plum ", one_string) == {"word": "plum"}
    reply = {"properties": {"message": {"type": "string", "default": ""}, "tool_calls": {"type": "array"}}}
    assert parse_action("\\boxed{4}", reply) == {"message": "\\boxed{4}"}  # requires none, one string field
    for text in ("x=1, y=2", "", '{"x": 1', "[1, 2]"):
        with pytest.raises(ValueError, match="no JSON object"):
            parse_action(text, two)


def test_an_mcp_env_lists_its_tools_and_each_tool_call_is_a_step(servers):
    env_id = f"openenv:{servers['tools']}"
    spec = env_registry.spec(env_id)
    assert spec.kwargs["mcp"] is True and "tools" in spec.tags

    def call(name: str, **arguments) -> str:
        return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"

    word = target(1_000_000)
    traj, _ = play(env_id, [call("letters"), call("guess", word="zebra"), call("guess", word=word)])
    assert traj.failure is None and traj.reward == 0.0 - 0.25 + 1.0 and traj.num_turns == 3
    text = TOK.decode(traj.token_ids)
    assert '"name": "guess"' in text.split("</tools>")[0]  # list_tools became the episode's tools
    assert f"<tool_response>\n{len(word)}\n</tool_response>" in text and "no, not zebra" in text
    traj, _ = play(env_id, ["I think it is apple."])  # no tool call
    assert traj.reward == 0.0 and traj.info["invalid_action"] == 1.0


def test_conformance_passes(servers, capsys):
    assert molt_env_main(["check", f"openenv:{servers['guess']}"]) == 0, capsys.readouterr().out


def test_eval_against_a_scripted_endpoint_gives_exact_pass_at_k(servers, tmp_path, capsys):
    """-n 4 on three tasks; the scripted model guesses right first time on 1, 2 and 4 of a task's samples (else one
    wrong guess, then the right one: 0.75)."""
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    right_first = {target(1_000_000): 1, target(1_000_001): 2, target(1_000_002): 4}
    first_turns: Counter = Counter()

    async def chat(request):
        messages = (await request.json())["messages"]
        word = next(w for w in WORDS if f"starts with {w[0]!r} and has {len(w)} letters" in messages[1]["content"])
        reply = word
        if len(messages) == 2:
            first_turns[word] += 1
            reply = word if first_turns[word] <= right_first[word] else "berry"
        return JSONResponse({
            "id": "x", "object": "chat.completion", "created": 0, "model": "scripted",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": reply}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11},
        })  # fmt: skip

    out = tmp_path / "eval"
    with http_app([Route("/v1/chat/completions", chat, methods=["POST"])]) as endpoint:
        argv = ["eval", f"openenv:{servers['guess']}", "--base-url", f"{endpoint}/v1", "-n", "4", "--k", "1,2"]
        rc = molt_env_main([*argv, "--max-samples", "3", "--out", str(out), "--quiet"])
    assert rc == 0, capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["failures"] == {} and sum(first_turns.values()) == 12
    for k in (1, 2):
        expected = sum(pass_at_k(4, c, k) for c in right_first.values()) / 3
        assert summary[f"pass@{k}"] == pytest.approx(expected)
    assert summary["pass@1"] == pytest.approx((1 / 4 + 2 / 4 + 1) / 3)
    rewards = sorted(json.loads(line)["reward"] for line in (out / "samples.jsonl").read_text().splitlines())
    assert rewards == [0.75] * 5 + [1.0] * 7


def test_a_package_is_served_here_and_every_failure_ends_its_episode_with_a_counted_reason(
    package_dir, servers, impostors, monkeypatch
):
    """``openenv:guess_env`` started by this process (at most one session: ``GUESS_MAX_ENVS=1``): an episode, the
    server at capacity, the server killed mid-episode (and restarted for the next), a timeout, garbage on the wire."""
    from openenv.core.generic_client import GenericEnvClient

    monkeypatch.syspath_prepend(str(package_dir))
    monkeypatch.setenv("GUESS_MAX_ENVS", "1")
    assert [e.env_id for e in SOURCE.catalog()] == ["openenv:guess_env"]  # the installed openenv-* distribution
    spec = env_registry.spec("openenv:guess_env")
    assert spec.kwargs["app"] == "guess_env.server.app:app" and "base_url" not in spec.kwargs
    assert spec.reward_range == (-1.0, 1.0) and spec.upstream["server_version"] == "2.3.1"  # openenv.yaml's range
    word = target(1_000_000)
    traj, row = play("openenv:guess_env", [word])
    assert traj.failure is None and traj.reward == 1.0
    endpoint = served_endpoint()

    async def at_capacity(env_id: str, hold_s: float):
        """An episode while another client holds the one session for ``hold_s``."""
        held = GenericEnvClient(base_url=endpoint.base_url)
        await held.reset(seed=1)
        release = asyncio.get_running_loop().call_later(hold_s, lambda: asyncio.ensure_future(held.close()))
        try:
            return await runner_for(env_id).run_row(row, PARAMS, 65536, TOK, ReplayEngine(TOK, [word]))
        finally:
            release.cancel()
            await held.close()

    started = time.monotonic()
    traj = asyncio.run(at_capacity("openenv:guess_env?timeout_s=1", 30))  # asked again for 1 s, then counted
    assert traj.failure.startswith("remote_capacity: ") and "CAPACITY_REACHED" in traj.failure
    assert 0.5 <= time.monotonic() - started < 10
    traj = asyncio.run(at_capacity("openenv:guess_env", 1.5))  # the session frees up while it waits
    assert traj.failure is None and traj.reward == 1.0

    class KillingEngine(ReplayEngine):
        async def generate(self, prompt_ids, params, images=None):
            if self.calls == 1:  # after the first step: the server dies
                endpoint.server.process.kill()
                endpoint.server.process.wait()
            return await super().generate(prompt_ids, params, images)

    traj, _ = play("openenv:guess_env", [], engine=KillingEngine(TOK, ["berry", "cherry"]))
    assert traj.failure.startswith("remote_lost: "), traj.failure
    assert endpoint.server.restarts == 1 and endpoint.server.healthy()  # restarted for the episodes that follow
    traj, _ = play("openenv:guess_env", [word])
    assert traj.failure is None and traj.reward == 1.0

    traj, _ = play(f"openenv:{servers['guess']}?timeout_s=1", ["sleep"])
    assert traj.failure.startswith("remote_timeout: ") and "no answer within 1 s" in traj.failure
    traj, _ = play(f"openenv:{impostors}/badws", ["x"])
    assert traj.failure.startswith("remote_protocol: "), traj.failure


def served_endpoint(python: str = sys.executable):
    """This process's server of ``guess_env`` under ``python`` (started by resolving ``openenv:guess_env``)."""
    from env_registry.serving.managed_servers import _ENDPOINTS

    return _ENDPOINTS[(python, "guess_env.server.app:app")]


def test_a_package_is_served_from_the_interpreter_python_names(package_dir, tmp_path):
    """``?python=``: the package's server runs under another interpreter (a venv that has openenv and the package,
    and not this process's ``sys.path``)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    (site,) = (venv / "lib").glob("python3*/site-packages")
    here = next(p for p in sys.path if p.endswith("site-packages") and (Path(p) / "openenv").is_dir())
    (site / "deps.pth").write_text(f"{here}\n{package_dir}\n")
    python = str(venv / "bin" / "python")
    env_id = f"openenv:guess_env?python={python}"
    spec = env_registry.spec(env_id)
    assert spec.kwargs["python"] == python and spec.kwargs["app"] == "guess_env.server.app:app"
    traj, _ = play(env_id, ["berry", target(1_000_000)])
    assert traj.failure is None and traj.reward == 0.75
    assert served_endpoint(python).server.process.args[0] == python


def test_bad_input_fails_at_resolve_time_naming_what_is_wrong(servers, impostors, package_dir, monkeypatch):
    nobody, web, text, junk = (
        f"http://127.0.0.1:{free_port()}",
        f"{impostors}/web",
        f"{impostors}/text",
        f"{impostors}/garbage",
    )
    guess = servers["guess"]
    not_openenv = EnvServerUnavailable
    cases = {
        f"openenv:{nobody}": (not_openenv, f"nothing answers at {nobody}"),
        f"openenv:{web}": (not_openenv, f"{web} is not an OpenEnv server: GET /health answered 404"),
        f"openenv:{text}": (not_openenv, f"{text} is not an OpenEnv server: GET /health answered 200 'all good'"),
        f"openenv:{junk}": (not_openenv, f"{junk} is not an OpenEnv server: /schema has no action"),
        f"openenv:{guess}?colour=red": (UnregisteredEnv, "unknown kwarg 'colour'"),
        f"openenv:{guess}?timeout_s=-1": (UnregisteredEnv, "timeout_s must be a number of seconds > 0, got -1"),
        f"openenv:{guess}?seeds=[-1]": (UnregisteredEnv, "seeds must be a list of ints >= 0"),
        f"openenv:{guess}?python=/usr/bin/python3": (UnregisteredEnv, "'python' is for packages"),
        "openenv:no_such_env": (NameNotFound, "no OpenEnv env package 'no_such_env' is installed here"),
        "openenv:guess_en": (NameNotFound, "Did you mean openenv:guess_env?"),
        "openenv:not-a-package!": (NameNotFound, "names neither a server (openenv:http://host:port) nor"),
        "openenv:guess_env?python=/no/python": (
            not_openenv,
            "cannot start the env server of OpenEnv package guess_env",
        ),
    }
    monkeypatch.syspath_prepend(str(package_dir))
    for env_id, (error, message) in cases.items():
        with pytest.raises(error) as caught:
            env_registry.spec(env_id)
        assert message in str(caught.value), (env_id, str(caught.value))


def test_two_rl_steps_of_molt_train_on_an_openenv_url(servers, tiny_tokenizer, tmp_path):
    """``molt-train rl --env openenv:http://...`` as users run it: a real local Ray, the tiny policy, two steps."""
    from molt_train.models.tiny import build_tiny_model, save_tiny

    model = save_tiny(
        build_tiny_model(tiny_tokenizer, hidden_size=32, num_layers=1, seed=0), tiny_tokenizer, tmp_path / "m"
    )
    out = tmp_path / "run"
    cmd = [MOLT_TRAIN, "rl", "--env", f"openenv:{servers['guess']}", "--actor.model_name_or_path", str(model)]
    cmd += ["--ckpt.output_dir", str(out), "--rollout.batch_size", "2", "--rollout.n_samples_per_prompt", "2"]
    cmd += ["--algo.advantage.estimator", "grpo", "--rollout.max_new_tokens", "4", "--actor.adam.lr", "1e-3"]
    cmd += ["--no-logger.progress", "--train.num_steps", "2", "--eval.max_samples", "0", "--ray.num_cpus", "2"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env={**os.environ, "RAY_DEDUP_LOGS": "0"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert r["rollout/num_rollouts"] == 4 and not any(k.startswith("rollout/dropped/failure") for k in r), r
