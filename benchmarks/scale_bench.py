"""RL-scale concurrency, side by side with its baseline in one command: many episodes over several env servers, and
many persistent sandbox sessions open at once.

    .venv/bin/python benchmarks/scale_bench.py [--episodes 1000] [--servers 4] [--steps 10] [--gen-ms 200 0]
                                               [--sessions 1000] [--calls 3000] [--concurrency 64]

``episodes``: ``--episodes`` concurrent episodes of ``--env`` spread round-robin over ``--servers`` processes of
``molt-env serve-env`` (the ``molt-env/1`` protocol, loopback), each resetting then stepping ``--steps`` times after a
"generation" of ``--gen-ms`` (uniform 0.5x..1.5x, asyncio.sleep; 0 = saturation); the baseline is the same episodes
with the env in this process. Figures per step: p50/p99 latency, "added p50" (remote minus in-process), steps/s, and
CPU (client: this process; servers: their ``/proc`` ticks) per step. The episode loop is remote_env_bench.py's.

``sandboxes``: ``--sessions`` persistent REPL sessions of the ``local`` provider (one bubblewrap jail each) opened at
once and held; then ``--calls`` small tool calls (``x += 1; x``, the session's own state) spread over them with
``--concurrency`` in flight: calls/s, p50/p99, and the memory the open sessions hold (the proportional set size of the
processes they started, per session). The baseline, in the same command: the same calls on ``--concurrency`` sessions only.

``--smoke`` (what ``make test`` runs, tests/test_benchmarks_smoke.py): 2 servers x 8 episodes x 3 steps, 8 sessions
and 40 calls; the same lines in seconds, figures meaningless.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from remote_env_bench import quantile, run, server_cpu_s, start_server  # noqa: E402

import env_registry  # noqa: E402


def spread(factories: list) -> callable:
    """One env factory handing out the servers' envs in turn (episode i on server i mod n)."""
    turn = iter(range(1 << 62))
    return lambda: factories[next(turn) % len(factories)]()


def episodes(args: argparse.Namespace) -> list[str]:
    servers = [start_server(args.env) for _ in range(args.servers)]
    lines = []
    try:
        local_spec, local = env_registry.registry.factory(args.env)
        row = env_registry.load_split(local_spec, next(iter(local_spec.datasets)), 1)[0]
        remote = spread([env_registry.registry.factory(url)[1] for _, url in servers])
        for gen_ms in args.gen_ms:
            figures = {}
            for where, make in (("in process", local), ("remote", remote)):
                cpu, ticks = time.process_time(), sum(server_cpu_s(p.pid) for p, _ in servers)
                step_s, _, wall = asyncio.run(run(make, row, args.episodes, args.steps, gen_ms / 1000))
                n = len(step_s)
                figures[where] = {
                    "p50": 1000 * statistics.median(step_s),
                    "p99": 1000 * quantile(step_s, 0.99),
                    "steps_s": n / wall,
                    "client_cpu": 1000 * (time.process_time() - cpu) / n,
                    "server_cpu": 1000 * (sum(server_cpu_s(p.pid) for p, _ in servers) - ticks) / n,
                }
            here, there = figures["in process"], figures["remote"]
            lines.append(
                f"episodes: gen {gen_ms:g} ms, {args.episodes} episodes over {args.servers} servers: added p50 "
                f"{there['p50'] - here['p50']:.3f} ms, p99 {there['p99']:.3f} ms (in process {here['p99']:.3f}); "
                f"steps/s {there['steps_s']:.0f} (in process {here['steps_s']:.0f}, ratio "
                f"{there['steps_s'] / here['steps_s']:.3f}x); CPU ms/step client {there['client_cpu']:.3f} "
                f"(in process {here['client_cpu']:.3f}), servers {there['server_cpu']:.3f}"
            )
            print(lines[-1], file=sys.stderr, flush=True)
    finally:
        for process, _ in servers:
            process.terminate()
            process.wait(timeout=30)
    return lines


def descendants() -> set[int]:
    """The pids of this process's descendants (from /proc's parent links)."""
    parent = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        parent[int(stat.parent.name)] = int(fields[1])
    found, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {pid for pid, ppid in parent.items() if ppid in frontier} - found
        found |= frontier
    return found


def pss_mb(pids: set[int]) -> float:
    """Proportional set size of ``pids`` (shared pages split among their sharers), MB."""
    total = 0
    for pid in pids:
        try:
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            continue
        total += next((int(line.split()[1]) for line in rollup.splitlines() if line.startswith("Pss:")), 0)
    return total / 1024


async def calls(sessions: list, total: int, concurrency: int) -> tuple[list[float], float, int]:
    """``total`` calls over ``sessions`` in turn, ``concurrency`` in flight; (latencies, wall seconds, failures)."""
    latencies: list[float] = []
    failed = 0
    queue = iter(range(total))

    async def worker() -> None:
        nonlocal failed
        for i in queue:
            t = time.perf_counter()
            result = await sessions[i % len(sessions)].run_python("x = globals().get('x', 0) + 1\nx")
            latencies.append(time.perf_counter() - t)
            failed += result.exit_code != 0

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, time.perf_counter() - start, failed


async def sandbox_sessions(args: argparse.Namespace) -> list[str]:
    import sandboxes

    before = descendants()
    opened = []
    start = time.perf_counter()
    for batch in range(0, args.sessions, 64):  # opened 64 at a time: each is a jail starting its REPL
        group = [
            sandboxes.open("local", persistent=True, sessions=args.sessions)
            for _ in range(min(64, args.sessions - batch))
        ]
        await asyncio.gather(*(s.start() for s in group))
        opened += group
    open_s = time.perf_counter() - start
    try:
        await calls(opened, len(opened), args.concurrency)  # every REPL once: its state exists, its pages touched
        held_mb = pss_mb(descendants() - before) / len(opened)  # the jails and REPLs the sessions started
        few = opened[: args.concurrency]
        base, base_wall, base_failed = await calls(few, args.calls, args.concurrency)
        many, wall, failed = await calls(opened, args.calls, args.concurrency)
    finally:
        await asyncio.gather(*(s.close() for s in opened), return_exceptions=True)
        sandboxes.shutdown()
    line = (
        f"sandboxes: {len(opened)} persistent sessions open ({open_s:.1f} s to open, {held_mb:.1f} MB each): "
        f"{args.calls} calls, {args.concurrency} in flight: {args.calls / wall:.0f} calls/s, p50 "
        f"{1000 * statistics.median(many):.2f} ms, p99 {1000 * quantile(many, 0.99):.2f} ms, {failed} failed; on "
        f"{len(few)} sessions: {args.calls / base_wall:.0f} calls/s, p50 {1000 * statistics.median(base):.2f} ms, "
        f"{base_failed} failed; ratio calls/s {base_wall / wall:.3f}x"
    )
    print(line, file=sys.stderr, flush=True)
    return [line]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="molt/arith-v1", help="an env installed here (served and run in process)")
    parser.add_argument("--episodes", type=int, default=1000)
    parser.add_argument("--servers", type=int, default=4, help="molt-env serve-env processes the episodes spread over")
    parser.add_argument("--steps", type=int, default=10, help="steps per episode")
    parser.add_argument("--gen-ms", type=float, nargs="+", default=[200.0, 0.0], help="generation time per turn")
    parser.add_argument("--sessions", type=int, default=1000, help="persistent sandbox sessions held open")
    parser.add_argument("--calls", type=int, default=3000, help="tool calls over the open sessions")
    parser.add_argument("--concurrency", type=int, default=64, help="tool calls in flight")
    parser.add_argument("--only", choices=["episodes", "sandboxes"], help="one part only")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, seconds: the code path, not the figures")
    args = parser.parse_args()
    if args.smoke:
        args.episodes, args.servers, args.steps, args.gen_ms = 8, 2, 3, [5.0, 0.0]
        args.sessions, args.calls, args.concurrency = 8, 40, 4
    lines = []
    if args.only in (None, "episodes"):
        lines += episodes(args)
    if args.only in (None, "sandboxes"):
        lines += asyncio.run(sandbox_sessions(args))
    load = os.getloadavg()[0]
    print(
        f"**{datetime.now(UTC):%Y-%m-%d}, {platform.node()}: {os.cpu_count()} cores, load average {load:.1f}, "
        f"Python {platform.python_version()}; env {args.env}, {args.steps} steps per episode.**\n"
    )
    print("\n".join(f"- {line}" for line in lines))


if __name__ == "__main__":
    main()
