"""Nothing hangs on the env-server wire: real env servers in their own processes, real signals. A server killed or
stopped (``SIGSTOP``, never resumed) fails its episode as ``ServerLost`` within seconds and is replaced for the next;
an env step that blocks its loop for longer than the keepalive allows is not taken for a dead server; a client that
abandons a step gets it cancelled and its env closed in the server; episodes past the server's ``max_episodes`` wait
for a slot in the client, counted, instead of failing."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest

from env_registry.serving.managed_servers import ManagedEndpoint, ManagedServer
from molt_envs import SamplingParams
from molt_envs.remote.client import RemoteEnv, ServerLost, wire_stats

ENV_ID = "test/faults-v1"
CAPACITY = 2

SERVER = f'''
"""{ENV_ID}: each step does what its action says; marks (files named by the episode's label) say what the server
did with an instance: ``cancelled`` (its step was cancelled), ``closed`` (its close ran)."""

import asyncio
import os
import sys
import time

from molt_envs.contract import Env, Result
from molt_envs.remote.server import ServedEnv, create_app, serve

MARKS = sys.argv[1]


class FaultEnv(Env):
    async def reset(self, state):
        self.label = state["label"]
        return state

    async def step(self, state):
        verb, _, seconds = state["action_text"].partition(" ")
        if verb == "block":
            time.sleep(float(seconds))  # holds the env loop (and the GIL between its ticks)
        elif verb == "sleep":
            try:
                await asyncio.sleep(float(seconds))
            except asyncio.CancelledError:
                self.mark("cancelled")
                raise
        return Result(reward=1.0)

    async def close(self):
        self.mark("closed")

    def mark(self, what):
        open(os.path.join(MARKS, f"{{self.label}}.{{what}}"), "w").close()


served = ServedEnv("{ENV_ID}", "env", FaultEnv, {{}}, "0" * 64, lambda split, limit: iter(()))
app = create_app([served], max_episodes={CAPACITY})
serve(app, on_ready=lambda url: print(f"serving {ENV_ID} at {{url}}/{ENV_ID} (molt-env/1)", flush=True),
      exit_on_stdin_eof=True)
'''


class FaultServer(ManagedServer):
    """The script above as a managed server (started, probed, killed and restarted as an isolated install's)."""

    script: Path
    marks: Path

    def command(self) -> list[str]:
        return [sys.executable, str(self.script), str(self.marks)]


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    FaultServer.script, FaultServer.marks = root / "fault_server.py", root / "marks"
    FaultServer.script.write_text(textwrap.dedent(SERVER))
    FaultServer.marks.mkdir()
    server = FaultServer(sys.executable, ENV_ID, "the fault server")
    server.start()
    yield ManagedEndpoint(server)
    server.stop()
    server.log_path.unlink(missing_ok=True)


def step_state(action: str) -> dict:
    params = SamplingParams(max_tokens=4)
    return {"observation_text": "", "action_text": action, "label": None, "sampling_params": params, "turn": 0}


async def episode(endpoint: ManagedEndpoint, label: str, action: str = "ok") -> float:
    env = RemoteEnv(endpoint)
    try:
        await env.reset({"observation": "go", "label": label, "images": []})
        return (await env.step(step_state(action))).reward
    finally:
        await env.close()


async def lose_mid_step(endpoint: ManagedEndpoint, label: str, signum: int) -> tuple[float, str]:
    """Start a step that sleeps in the server, send ``signum`` to the server; seconds until ``ServerLost``, its
    message."""
    env = RemoteEnv(endpoint)
    await env.reset({"observation": "go", "label": label, "images": []})
    step = asyncio.ensure_future(env.step(step_state("sleep 60")))
    await asyncio.sleep(0.3)
    os.kill(endpoint.server.process.pid, signum)
    start = time.monotonic()
    with pytest.raises(ServerLost, match="during 'step'") as lost:
        await step
    lost_after = time.monotonic() - start
    await env.close()
    return lost_after, str(lost.value)


def test_a_killed_server_fails_its_episode_at_once_and_the_next_runs_on_a_restarted_one(endpoint):
    process, restarts = endpoint.server.process, endpoint.server.restarts
    lost_after, _ = asyncio.run(lose_mid_step(endpoint, "killed", signal.SIGKILL))
    assert lost_after < 3, lost_after
    assert asyncio.run(episode(endpoint, "after-kill")) == 1.0  # waits for the restart, then runs there
    assert endpoint.server.restarts == restarts + 1 and endpoint.server.process.pid != process.pid


def test_a_stopped_server_is_found_by_the_keepalive_then_killed_and_replaced(endpoint):
    """``SIGSTOP`` and never resumed: the kernel still holds the connection open, only the pings (the defaults:
    every 2 s, 4 s for the pong) see that nobody answers; the probe finds it hung, kills it and starts another."""
    process, restarts = endpoint.server.process, endpoint.server.restarts
    lost_after, why = asyncio.run(lose_mid_step(endpoint, "stopped", signal.SIGSTOP))
    assert lost_after <= 10 and "keepalive ping timeout" in why, (lost_after, why)
    assert endpoint.settled(60)
    assert process.returncode == -signal.SIGKILL  # not left stopped
    assert endpoint.server.restarts == restarts + 1
    assert asyncio.run(episode(endpoint, "after-stop")) == 1.0


def test_a_step_that_blocks_its_env_loop_is_slow_not_dead(endpoint, monkeypatch):
    """The env's code runs off the loop that answers pings: a step holding its loop for 5 s, longer than a pong
    may take here (every 1 s, 2 s for the pong), ends normally."""
    monkeypatch.setattr(endpoint, "ping_interval_s", 1.0)
    monkeypatch.setattr(endpoint, "ping_timeout_s", 2.0)
    pid = endpoint.server.process.pid
    start = time.monotonic()
    assert asyncio.run(episode(endpoint, "blocked", "block 5")) == 1.0
    assert time.monotonic() - start >= 5 and endpoint.server.process.pid == pid


def test_an_abandoned_step_is_cancelled_in_the_server_and_its_env_closed(endpoint):
    marks = endpoint.server.marks

    async def abandon() -> None:
        env = RemoteEnv(endpoint)
        await env.reset({"observation": "go", "label": "abandoned", "images": []})
        with pytest.raises(TimeoutError):  # the episode's deadline, as the rollout's wait_for
            await asyncio.wait_for(env.step(step_state("sleep 60")), 0.5)
        await env.close()  # what the runner does next: nothing left to close here

    asyncio.run(abandon())
    deadline = time.monotonic() + 5
    while not (marks / "abandoned.closed").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (marks / "abandoned.cancelled").exists() and (marks / "abandoned.closed").exists()
    assert endpoint.slots.in_use == 0


def test_episodes_past_the_servers_capacity_wait_for_a_slot_counted(endpoint, monkeypatch):
    """Ten episodes on a server taking two: five waves of a 0.4 s step. The last waits ~2 s, past the 1.5 s answer
    timeout: waiting in the client does not run it down (queued in the server, the first answer would time out)."""
    monkeypatch.setattr(endpoint, "timeout_s", 1.5)
    assert endpoint.slots.capacity == CAPACITY  # learned from the server's metadata
    before, process_before = dict(endpoint.stats), wire_stats()

    async def many() -> list[float]:
        return await asyncio.gather(*(episode(endpoint, f"wave-{i}", "sleep 0.4") for i in range(10)))

    assert asyncio.run(many()) == [1.0] * 10
    waits = endpoint.stats["slot_waits"] - before["slot_waits"]
    waited_s = endpoint.stats["slot_wait_s"] - before["slot_wait_s"]
    assert waits == 8 and waited_s > 8 * 0.4, endpoint.stats  # all but the first two, ~1.0 s each on average
    assert wire_stats()["slot_waits"] - process_before["slot_waits"] == 8
    assert endpoint.slots.in_use == 0


def test_a_server_stopped_between_episodes_is_checked_when_an_episode_gives_up_on_its_handshake(endpoint):
    """Stopped while no episode is open: the kernel still accepts the next connection, but no handshake answer comes
    and no keepalive runs yet. The episode's deadline (shorter than the handshake's timeout) abandons it, and that
    alone starts the check that kills and replaces the server."""
    process, restarts = endpoint.server.process, endpoint.server.restarts
    os.kill(process.pid, signal.SIGSTOP)
    with pytest.raises(TimeoutError):
        asyncio.run(asyncio.wait_for(episode(endpoint, "handshake"), 1.0))
    assert endpoint.settled(60)
    assert process.returncode == -signal.SIGKILL and endpoint.server.restarts == restarts + 1
    assert asyncio.run(episode(endpoint, "after-handshake")) == 1.0
