"""What our ecosystem adapters cost per step: each foreign env through its ``SCHEME:NAME`` ID against the same env
driven natively by its own library, side by side in one command, at 1 and 64 concurrent episodes.

    .venv/bin/python benchmarks/ecosystems_bench.py [--ecosystems rg textarena gym openenv] [--concurrency 1 64]
                                                    [--steps 2000] [--repeats 3]

The sides, the same env, episodes (seeds, rows) and scripted actions on each (no model):

- ``native``: the library's own loop. ``rg:countdown``: reasoning-gym's ``create_dataset`` item, the reply's
  ``extract_answer`` and ``score_answer``; ``textarena:GuessTheNumber-v0``: ``textarena.make``, ``env.step`` then
  ``env.get_observation`` (the next turn's prompt); ``gym:CartPole-v1``: ``gymnasium.make`` and ``env.step(int)``;
  ``openenv:URL``: OpenEnv's own ``GenericEnvClient`` stepping the OpenEnv server (an echo env written with
  OpenEnv's server API, uvicorn in a process of its own) directly.
- ``adapter``: ``env_registry.make(ID)``'s env, exactly what the runners step (``await env.step(state)`` with the
  reply as text). rg, textarena and gym run in an env server of their own process (the ``Adapter`` default,
  ``molt-env serve-env``, one WebSocket per episode, the ``molt-env/1`` JSON protocol); openenv runs in process
  over OpenEnv's client to the same server the native side steps.
- ``in process``: the adapter's env class in this process (the spec ``local_spec`` gives, what the env server
  itself runs), so ``in process / native`` is the adapter's own wrapping (text in, parsing, re-rendering the
  observation as chat messages, the ``Result``) and ``adapter / in process`` is the process hop (WebSocket, JSON
  both ways, the server's event loop). OpenEnv's adapter has no such split: it is in process already.

Episodes run as the trainer runs them (``molt_train.rollout``: one asyncio task per episode, ``asyncio.gather``):
``--concurrency`` episodes at once, each of the ``C`` slots playing episodes one after another until about
``--steps`` steps are done in all; before each step an episode yields to the loop (``await asyncio.sleep(0)``: where
the generation would be), so the episodes interleave. Native library calls are synchronous and run on the loop,
as a native loop would. Per step: the latency of one step (p50, mean; at 64 episodes an adapter step's latency
includes waiting behind the others' steps in the env server and on the loop, which a synchronous native call never
does) and wall-clock per step (the run's wall time over its steps: the throughput cost, which is what a trainer
pays). CPU per step: this process's (``time.process_time``) and the env server's (``/proc/PID/stat``). ``codec``:
the ``molt-env/1`` JSON of one step measured alone (the client's encode and decode and the server's), the part of
the hop that is serialization. ``--repeats`` runs each side that many times, in turn, and pools the steps.

Goal (issue 39): adapter per step <= 1.1x the native loop. Left out: verifiers (``verifiers.py``), which needs a
venv of its own (its dependencies clash with this project's): an env there is served from that venv by the same
env server as rg/textarena/gym, so its hop costs what theirs do.

``--smoke`` (what ``make test`` runs, tests/test_benchmarks_smoke.py): every ecosystem at 1 and 4 episodes, a few
dozen steps, one repeat; the same rows and ratio lines in seconds, figures meaningless.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from remote_env_bench import server_cpu_s  # noqa: E402

import env_registry  # noqa: E402
from env_registry.datasets import load_split  # noqa: E402
from molt_envs import SamplingParams  # noqa: E402

# an OpenEnv env written with OpenEnv's server API, served by the openenv adapter's own launcher (uvicorn on a free
# loopback port in a process of its own, exiting when our end of its stdin closes)
OPENENV_ECHO = """
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, EnvironmentMetadata, Observation, State
from pydantic import Field

class EchoAction(Action):
    message: str = Field(description="what to echo")

class EchoObservation(Observation):
    echoed: str = ""
    length: int = 0

class EchoEnv(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True
    def __init__(self):
        super().__init__()
        self._state = State(step_count=0)
    def reset(self, seed=None, episode_id=None, **kwargs):
        self._state = State(episode_id=episode_id, step_count=0)
        return EchoObservation(echoed=f"echo env, seed {seed}: say anything", length=0)
    def step(self, action, timeout_s=None, **kwargs):
        self._state.step_count += 1
        text = action.message
        return EchoObservation(echoed=text, length=len(text), reward=len(text) / 10, done=False)
    @property
    def state(self):
        return self._state
    def get_metadata(self):
        return EnvironmentMetadata(name="echo", description="Echoes each message.", version="1.0")

app = create_app(EchoEnv, EchoAction, EchoObservation, env_name="echo", max_concurrent_envs=512)
"""


def step_state(text: str, action: str, label: Any, turn: int) -> dict[str, Any]:
    return {
        "observation_text": text,
        "action_text": action,
        "label": label,
        "sampling_params": SamplingParams(max_tokens=256),
        "turn": turn,
        "images": [],
    }


def first_text(observation: Any) -> str:
    if isinstance(observation, str):
        return observation
    return "\n\n".join(str(m.get("content", "")) for m in observation)


# -- the ecosystems: one native episode and one molt episode of the same row, the same scripted actions ---------------


@dataclass
class Case:
    name: str  # the ecosystem
    env_id: str  # our ID
    max_steps: int  # an episode's steps at most (both sides)
    steps_guess: float  # steps of an average episode, to size a run
    native_open: Callable[[int], Any]  # row index -> an episode: async step(k) -> (reward, done), async close()
    action: Callable[[int, int], str]  # (row index, step) -> the scripted reply
    served: Callable[[], Any] = field(default=None)  # type: ignore[assignment]
    local: Callable[[], Any] | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)
    server_pid: int | None = None  # the adapter's env server (or OpenEnv's server, stepped by both sides)
    native_pid: int | None = None
    cleanup: Callable[[], None] = lambda: None


class SyncEpisode:
    """A native episode of a synchronous library: ``step`` runs on the loop, as the library's own loop would."""

    def __init__(self, step: Callable[[int], tuple[float, bool]]) -> None:
        self._step = step

    async def step(self, k: int) -> tuple[float, bool]:
        return self._step(k)

    async def close(self) -> None:
        pass


def local_factory(module: Any, env_id: str) -> Callable[[], Any]:
    return env_registry.registry.factory(module.SOURCE.local_spec(env_id))[1]


def served_case(case: Case, n_rows: int, local_module: Any) -> Case:
    spec, case.served = env_registry.registry.factory(case.env_id)
    case.server_pid = spec.endpoint().server.process.pid
    case.local = local_factory(local_module, case.env_id)
    case.rows = load_split(local_module.SOURCE.local_spec(case.env_id), "train", n_rows)
    return case


def rg_case(n_rows: int) -> Case:
    import reasoning_gym
    from reasoning_gym.utils import extract_answer

    from env_registry.ecosystems import reasoning_gym as adapter

    dataset = reasoning_gym.create_dataset("countdown", seed=0, size=n_rows)  # rg:countdown's train split
    entries = [dataset[i] for i in range(n_rows)]
    case = Case("rg", "rg:countdown", 1, 1.0, None, None)  # type: ignore[arg-type]

    def native_open(i: int) -> SyncEpisode:
        entry = entries[i]

        def step(k: int) -> tuple[float, bool]:
            return float(dataset.score_answer(extract_answer(case.action(i, k)), entry)), True

        return SyncEpisode(step)

    case.native_open = native_open
    case.action = lambda i, k: f"Let me see.\n<answer>{entries[i]['answer']}</answer>"
    return served_case(case, n_rows, adapter)


def textarena_case(n_rows: int) -> Case:
    import textarena as ta

    from env_registry.ecosystems.textarena import source as adapter

    case = Case("textarena", "textarena:GuessTheNumber-v0", 10, 7.0, None, None)  # type: ignore[arg-type]

    def native_open(i: int) -> SyncEpisode:
        env = ta.make("GuessTheNumber-v0")
        env.reset(num_players=1, seed=i)  # row i of the train split is seed i
        env.get_observation()

        def step(k: int) -> tuple[float, bool]:
            done, _ = env.step(action=case.action(i, k))
            if done:
                rewards, _ = env.close()
                return float(rewards[0]), True
            env.get_observation()  # the next turn's prompt, which the adapter's step returns too
            return 0.0, False

        return SyncEpisode(step)

    case.native_open = native_open
    case.action = lambda i, k: f"I guess [{(k * 7 + i) % 20 + 1}]"
    return served_case(case, n_rows, adapter)


def gym_case(n_rows: int) -> Case:
    import gymnasium

    from env_registry.ecosystems import gymnasium as adapter

    case = Case("gym", "gym:CartPole-v1", 20, 15.0, None, None)  # type: ignore[arg-type]
    seeds = [int(r["label"]) for r in load_split(adapter.SOURCE.local_spec(case.env_id), "train", n_rows)]

    def native_open(i: int) -> SyncEpisode:
        env = gymnasium.make("CartPole-v1")
        env.reset(seed=seeds[i])

        def step(k: int) -> tuple[float, bool]:
            _, reward, terminated, truncated, _ = env.step((i + k) % 2)
            return float(reward), bool(terminated or truncated)

        return SyncEpisode(step)

    case.native_open = native_open
    case.action = lambda i, k: f"Push the cart: {(i + k) % 2}"
    return served_case(case, n_rows, adapter)


def openenv_case(n_rows: int) -> Case:
    from openenv.core.generic_client import GenericEnvClient

    from env_registry.ecosystems.openenv.source import LAUNCHER

    app_dir = tempfile.mkdtemp(prefix="openenv-echo-")
    Path(app_dir, "openenv_echo.py").write_text(OPENENV_ECHO)
    process = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, "openenv_echo:app", app_dir],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    line = process.stdout.readline()
    if " ready at " not in line:
        process.kill()
        raise SystemExit("the OpenEnv echo server did not start")
    url = line.split()[-1]
    case = Case("openenv", f"openenv:{url}", 20, 20.0, None, None)  # type: ignore[arg-type]

    async def native_open(i: int) -> Any:
        client = GenericEnvClient(base_url=url)
        await client.reset(seed=i)

        class Episode:
            async def step(self, k: int) -> tuple[float, bool]:
                result = await client.step({"message": case.action(i, k)})
                return float(result.reward or 0.0), bool(result.done)

            async def close(self) -> None:
                await client.close()

        return Episode()

    def cleanup() -> None:
        process.stdin.close()
        process.wait(timeout=10)

    case.native_open, case.cleanup = native_open, cleanup  # type: ignore[assignment]
    case.action = lambda i, k: f"message {k} of episode {i}"
    spec, case.served = env_registry.registry.factory(case.env_id)
    case.rows = load_split(spec, "train", n_rows)
    case.server_pid = case.native_pid = process.pid
    return case


CASES = {"rg": rg_case, "textarena": textarena_case, "gym": gym_case, "openenv": openenv_case}


# -- driving ----------------------------------------------------------------------------------------------------------


async def drive(open_episode: Callable[[int], Any], case: Case, episodes: int, slots: int) -> dict[str, Any]:
    """``episodes`` episodes (rows 0..episodes-1, modulo the rows), ``slots`` at once; each step timed."""
    step_s: list[float] = []
    rewards = [0.0] * episodes
    steps = [0] * episodes
    queue = iter(range(episodes))

    async def slot() -> None:
        for e in queue:
            i = e % len(case.rows)
            episode = await open_episode(i)
            for k in range(case.max_steps):
                await asyncio.sleep(0)  # where the generation would be: the other episodes run
                t = time.perf_counter()
                reward, done = await episode.step(k)
                step_s.append(time.perf_counter() - t)
                rewards[e] += reward
                steps[e] += 1
                if done:
                    break
            await episode.close()

    start = time.perf_counter()
    await asyncio.gather(*(slot() for _ in range(slots)))
    return {"step_s": step_s, "wall_s": time.perf_counter() - start, "rewards": rewards, "steps": steps}


def molt_opener(case: Case, make: Callable[[], Any]) -> Callable[[int], Any]:
    async def open_episode(i: int) -> Any:
        row = case.rows[i]
        env = make()
        start = await env.reset({"observation": row["prompt"], "label": row["label"], "images": []})
        text = first_text(start["observation"])

        class Episode:
            async def step(self, k: int) -> tuple[float, bool]:
                result = await env.step(step_state(text, case.action(i, k), row["label"], k))
                return float(result.reward), bool(result.terminated or result.truncated)

            async def close(self) -> None:
                await env.close()

        return Episode()

    return open_episode


def native_opener(case: Case) -> Callable[[int], Any]:
    async def open_episode(i: int) -> Any:
        made = case.native_open(i)
        return await made if asyncio.iscoroutine(made) else made

    return open_episode


def sides(case: Case) -> dict[str, tuple[Callable[[int], Any], int | None]]:
    out = {"native": (native_opener(case), case.native_pid)}
    if case.local is not None:
        out["in process"] = (molt_opener(case, case.local), None)
    out["adapter"] = (molt_opener(case, case.served), case.server_pid)
    return out


def codec_us(case: Case, repeats: int = 200) -> float:
    """The ``molt-env/1`` JSON of one step of ``case``, alone: the client's encode of the step and decode of its
    answer, the server's decode and encode (microseconds)."""
    from molt_envs.remote.protocol import (
        CLIENT_MESSAGE,
        STEP_REPLY,
        answer_result,
        dumps,
        result_message,
        step_message,
    )
    from molt_envs.remote.protocol import step_state as from_wire

    if case.local is None:
        return float("nan")

    async def one() -> tuple[dict[str, Any], Any]:
        row = case.rows[0]
        env = case.local()
        start = await env.reset({"observation": row["prompt"], "label": row["label"], "images": []})
        state = step_state(first_text(start["observation"]), case.action(0, 0), row["label"], 0)
        result = await env.step(state)
        await env.close()
        return state, result

    state, result = asyncio.run(one())
    t = time.perf_counter()
    for _ in range(repeats):
        sent = dumps(step_message(state))  # client
        from_wire(CLIENT_MESSAGE.validate_json(sent).data)  # server
        answer = dumps(result_message(result))  # server
        answer_result(STEP_REPLY.validate_json(answer).data)  # client
    return 1e6 * (time.perf_counter() - t) / repeats


def measure(case: Case, slots: int, target_steps: int, repeats: int) -> dict[str, dict[str, Any]]:
    rounds = max(1, math.ceil(target_steps / (slots * case.steps_guess)))
    episodes = slots * rounds
    pooled: dict[str, dict[str, Any]] = {}
    for r in range(repeats):
        order = list(sides(case).items())
        if r % 2:
            order.reverse()
        for side, (opener, pid) in order:
            cpu, server = time.process_time(), server_cpu_s(pid)
            run = asyncio.run(drive(opener, case, episodes, slots))
            cpu, server = time.process_time() - cpu, server_cpu_s(pid) - server
            into = pooled.setdefault(side, {"step_s": [], "wall_s": 0.0, "cpu_s": 0.0, "server_s": 0.0})
            into["step_s"] += run["step_s"]
            into["wall_s"] += run["wall_s"]
            into["cpu_s"] += cpu
            into["server_s"] += server
            if "rewards" in into and (into["rewards"], into["steps"]) != (run["rewards"], run["steps"]):
                raise SystemExit(f"{case.name}: the {side} side played other episodes than before")
            into["rewards"], into["steps"] = run["rewards"], run["steps"]
    native = pooled["native"]
    for side, p in pooled.items():
        if (p["rewards"], p["steps"]) != (native["rewards"], native["steps"]):
            raise SystemExit(
                f"{case.name}: the {side} side's episodes differ from the native ones (rewards "
                f"{sum(p['rewards']):g} vs {sum(native['rewards']):g}, steps {sum(p['steps'])} vs {sum(native['steps'])})"
            )
        n = len(p["step_s"])
        p.update(
            n=n,
            episodes=episodes,
            p50_us=1e6 * statistics.median(p["step_s"]),
            mean_us=1e6 * statistics.fmean(p["step_s"]),
            wall_us=1e6 * p["wall_s"] / n,
            cpu_us=1e6 * p["cpu_s"] / n,
            server_us=1e6 * p["server_s"] / n,
        )
    return pooled


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ecosystems", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64], help="episodes at once")
    parser.add_argument("--steps", type=int, default=2000, help="steps per side and run, about")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each side, in turn, pooled")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, seconds: the code path, not the figures")
    args = parser.parse_args()
    if args.smoke:
        args.concurrency, args.steps, args.repeats = [1, 4], 24, 1
    warnings.simplefilter("ignore")  # Gymnasium and TextArena warn of old versions, deprecated envs, ...

    rows = []
    for name in args.ecosystems:
        t = time.perf_counter()
        case = CASES[name](64 if args.smoke else 256)  # rows, cycled
        print(f"# {name}: {case.env_id} ready in {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
        try:
            codec = codec_us(case)
            measure(case, min(args.concurrency), 10, 1)  # warm: first connections, imports, caches
            for slots in args.concurrency:
                result = measure(case, slots, args.steps, args.repeats)
                native, adapter = result["native"], result["adapter"]
                local = result.get("in process")
                hop = (
                    f" (in process: p50 {local['p50_us'] / native['p50_us']:.2f}x, mean "
                    f"{local['mean_us'] / native['mean_us']:.2f}x)"
                    if local
                    else ""
                )
                print(
                    f"{name} {slots} episodes: adapter p50 {adapter['p50_us']:.1f} us, mean {adapter['mean_us']:.1f} "
                    f"us; native p50 {native['p50_us']:.1f} us, mean {native['mean_us']:.1f} us; ratio p50 "
                    f"{adapter['p50_us'] / native['p50_us']:.2f}x, mean {adapter['mean_us'] / native['mean_us']:.2f}x"
                    f", wall/step {adapter['wall_us'] / native['wall_us']:.2f}x{hop}",
                    file=sys.stderr,
                    flush=True,
                )
                for side, r in result.items():
                    rows.append((name, slots, side, r, native, codec if side == "adapter" else None))
        finally:
            case.cleanup()

    load = os.getloadavg()[0]
    print(
        f"\n**{datetime.now(UTC):%Y-%m-%d}, {platform.node()}: {os.cpu_count()} cores, load average {load:.1f}, "
        f"Python {platform.python_version()}; about {args.steps} steps per side and concurrency, "
        f"{args.repeats} repeats pooled.**\n"
    )
    print(
        "| ecosystem | episodes | side | steps | p50 / mean step (us) | wall/step (us) | ratio p50 / mean / wall "
        "| client CPU us/step | server CPU us/step | codec us/step |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, slots, side, r, native, codec in rows:
        ratio = (
            f"{r['p50_us'] / native['p50_us']:.2f}x / {r['mean_us'] / native['mean_us']:.2f}x / "
            f"{r['wall_us'] / native['wall_us']:.2f}x"
        )
        if side == "adapter":
            ratio = f"**{ratio}**"
        server = f"{r['server_us']:.0f}" if not math.isnan(r["server_us"]) else ""
        print(
            f"| {name} | {slots} | {side} | {r['n']} | {r['p50_us']:.1f} / {r['mean_us']:.1f} | {r['wall_us']:.1f} "
            f"| {ratio} | {r['cpu_us']:.1f} | {server} | {'' if codec is None or math.isnan(codec) else f'{codec:.0f}'} |"
        )


if __name__ == "__main__":
    main()
