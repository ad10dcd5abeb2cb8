"""What a remote env costs per step: the same env in process and behind ``molt-env serve-env`` on loopback, side by
side in one command, over both protocols the server speaks.

    .venv/bin/python benchmarks/remote_env_bench.py [--env molt/arith-v1] [--episodes 1 256] [--steps 20]
                                                     [--gen-ms 1000 0] [--url http://host:port/ns/name-v1]
                                                     [--protocol molt-env/1 openenv]

``molt-env/1`` is ours (molt_envs/remote: what ``molt-train`` uses between its processes); ``openenv`` is the same env
behind ``serve-env --protocol openenv`` (OpenEnv's ``create_app``), stepped by OpenEnv's released client
(``GenericEnvClient`` over ``/ws``), as an OpenEnv user would. An OpenEnv episode of a single-turn env ends at its
step, so each timed OpenEnv step follows an (untimed) ``reset`` on the same session: at ``--gen-ms 0`` its server
answers two messages per step, which its steps/s shows.

Each of ``--episodes`` concurrent episodes resets, then steps ``--steps`` times; before each step it waits a
"generation" of ``--gen-ms`` (uniform in 0.5x..1.5x, asyncio.sleep: no CPU, the way an engine's generation leaves
the rollout loop free). ``--gen-ms 0`` is the saturation case: every episode steps again at once, so latency there
is queueing behind the other episodes, and steps/s is the figure. The latency of one ``await env.step(...)`` is
timed on the client; "added p50" is remote p50 minus in-process p50 at the same concurrency. ``open`` is an
episode's WebSocket handshake plus its reset. CPU per step: the client process's CPU time over the run
(``time.process_time``), and the server process's (``/proc/PID/stat``, 10 ms ticks), each divided by the steps;
unlike wall-clock figures these barely move when other work shares the cores.

``--smoke`` (what ``make test`` runs, tests/test_benchmarks_smoke.py): 1 and 4 episodes of 3 steps at 5 ms and 0 ms
generations; the same rows and comparisons in a few seconds, figures meaningless.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import env_registry
from molt_envs import SamplingParams

TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def start_server(env_id: str, *protocol: str) -> tuple[subprocess.Popen, str]:
    molt_env = str(Path(sys.executable).with_name("molt-env"))
    process = subprocess.Popen(
        [molt_env, "serve-env", env_id, "--port", "0", *protocol],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    match = re.search(r" at (http://\S+) \(", process.stdout.readline())
    if match is None:
        process.kill()
        raise SystemExit(f"molt-env serve-env {env_id} did not start")
    return process, match[1]


def server_cpu_s(pid: int | None) -> float:
    if pid is None:
        return float("nan")
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * TICK_S  # utime + stime


async def run(make, row: dict, episodes: int, steps: int, gen_s: float) -> tuple[list[float], list[float], float]:
    step_s: list[float] = []
    open_s: list[float] = []
    state = {
        "observation_text": "1+2=3",
        "action_text": "3",
        "label": row["label"],
        "sampling_params": SamplingParams(max_tokens=8),
        "turn": 0,
        "images": [],
    }

    async def episode(i: int) -> None:
        rng = random.Random(i)
        env = make()
        t = time.perf_counter()
        await env.reset({"observation": row["prompt"], "label": row["label"], "images": []})
        open_s.append(time.perf_counter() - t)
        for _ in range(steps):
            if gen_s:
                await asyncio.sleep(gen_s * rng.uniform(0.5, 1.5))
            t = time.perf_counter()
            await env.step(state)
            step_s.append(time.perf_counter() - t)
        await env.close()

    start = time.perf_counter()
    await asyncio.gather(*(episode(i) for i in range(episodes)))
    return step_s, open_s, time.perf_counter() - start


async def run_openenv(url: str, episodes: int, steps: int, gen_s: float) -> tuple[list[float], list[float], float]:
    """``run`` through OpenEnv's own client: each session resets (seed i), then steps the model's answer."""
    from openenv.core.generic_client import GenericEnvClient

    step_s: list[float] = []
    open_s: list[float] = []

    async def episode(i: int) -> None:
        rng = random.Random(i)
        t = time.perf_counter()
        async with GenericEnvClient(base_url=url) as client:
            await client.reset(seed=i)
            open_s.append(time.perf_counter() - t)
            for step in range(steps):
                if step:
                    await client.reset(seed=i)
                if gen_s:
                    await asyncio.sleep(gen_s * rng.uniform(0.5, 1.5))
                t = time.perf_counter()
                result = await client.step({"message": "3"})
                step_s.append(time.perf_counter() - t)
                assert result.done, "a single-turn env's OpenEnv episode ends at its step"

    start = time.perf_counter()
    await asyncio.gather(*(episode(i) for i in range(episodes)))
    return step_s, open_s, time.perf_counter() - start


def quantile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q * 100) - 1] if len(values) > 1 else values[0]


def measure(label: str, make, row: dict, episodes: int, steps: int, gen_ms: float, server_pid: int | None) -> dict:
    """One row: ``make`` is an env factory, or (``label`` "openenv") the OpenEnv server's URL."""
    cpu, server = time.process_time(), server_cpu_s(server_pid)
    if label == "openenv":
        step_s, open_s, wall = asyncio.run(run_openenv(make, episodes, steps, gen_ms / 1000))
    else:
        step_s, open_s, wall = asyncio.run(run(make, row, episodes, steps, gen_ms / 1000))
    n = len(step_s)
    return {
        "where": label,
        "episodes": episodes,
        "gen_ms": gen_ms,
        "steps": n,
        "p50_ms": 1000 * statistics.median(step_s),
        "p99_ms": 1000 * quantile(step_s, 0.99),
        "open_p50_ms": 1000 * statistics.median(open_s),
        "steps_per_s": n / wall,
        "client_cpu_ms": 1000 * (time.process_time() - cpu) / n,
        "server_cpu_ms": 1000 * (server_cpu_s(server_pid) - server) / n,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="molt/arith-v1", help="an env installed here (served and run in process)")
    parser.add_argument("--episodes", type=int, nargs="+", default=[1, 256])
    parser.add_argument("--steps", type=int, default=20, help="steps per episode")
    parser.add_argument(
        "--gen-ms", type=float, nargs="+", default=[1000.0, 200.0, 0.0], help="generation time per turn"
    )
    parser.add_argument("--url", help="bench this running server instead of starting one (no server CPU figure)")
    parser.add_argument(
        "--protocol", nargs="+", default=["molt-env/1", "openenv"], choices=["molt-env/1", "openenv"], help="served as"
    )
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, seconds: the code path, not the figures")
    args = parser.parse_args()
    if args.smoke:
        args.episodes, args.steps, args.gen_ms = [1, 4], 3, [5.0, 0.0]

    if args.url and args.protocol != ["molt-env/1"]:
        parser.error("--url benches a running molt-env/1 server: add --protocol molt-env/1")
    servers: dict[str, tuple[subprocess.Popen | None, str]] = {}
    try:
        if "molt-env/1" in args.protocol:
            servers["remote"] = (None, args.url) if args.url else start_server(args.env)
        if "openenv" in args.protocol:
            import openenv.core.generic_client  # noqa: F401  (imported before the clock starts)

            sessions = str(max(args.episodes))
            servers["openenv"] = start_server(args.env, "--protocol", "openenv", "--max-sessions", sessions)
        local_spec, local = env_registry.registry.factory(args.env)
        row = env_registry.load_split(local_spec, next(iter(local_spec.datasets)), 1)[0]
        clients = {}
        if "remote" in servers:
            remote_spec, clients["remote"] = env_registry.registry.factory(servers["remote"][1])
            assert remote_spec.hash == local_spec.hash, "the server serves another version of the env"
        if "openenv" in servers:
            clients["openenv"] = servers["openenv"][1]
        rows = []
        for gen_ms in args.gen_ms:
            for episodes in args.episodes:
                here = measure("in process", local, row, episodes, args.steps, gen_ms, None)
                rows.append(here)
                for label, client in clients.items():
                    process = servers[label][0]
                    there = measure(label, client, row, episodes, args.steps, gen_ms, process and process.pid)
                    there["added_p50_ms"] = there["p50_ms"] - here["p50_ms"]
                    rows.append(there)
                    print(
                        f"gen {gen_ms:g} ms, {episodes} episodes: added p50 {there['added_p50_ms']:.3f} ms "
                        f"({label} {there['p50_ms']:.3f}, in process {here['p50_ms']:.3f}); ratio steps/s {label} / "
                        f"in process {there['steps_per_s'] / here['steps_per_s']:.3f}x",
                        file=sys.stderr,
                        flush=True,
                    )
    finally:
        for process, _ in servers.values():
            if process is not None:
                process.terminate()
                process.wait(timeout=10)

    load = os.getloadavg()[0]
    print(
        f"**{datetime.now(UTC):%Y-%m-%d}, {platform.node()}: {os.cpu_count()} cores, load average {load:.1f}, "
        f"Python {platform.python_version()}; env {args.env}, {args.steps} steps per episode.**\n"
    )
    print(
        "| gen ms | episodes | where | p50 / p99 step (ms) | added p50 (ms) | open p50 (ms) | steps/s "
        "| client CPU ms/step | server CPU ms/step |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        added = f"**{r['added_p50_ms']:.3f}**" if "added_p50_ms" in r else ""
        server = "" if r["where"] == "in process" else f"{r['server_cpu_ms']:.3f}"
        print(
            f"| {r['gen_ms']:g} | {r['episodes']} | {r['where']} | {r['p50_ms']:.3f} / {r['p99_ms']:.3f} | {added} "
            f"| {r['open_p50_ms']:.3f} | {r['steps_per_s']:.0f} | {r['client_cpu_ms']:.3f} | {server} |"
        )


if __name__ == "__main__":
    main()
