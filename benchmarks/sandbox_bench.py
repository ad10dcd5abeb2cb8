"""Sandbox executor latency and throughput, side by side, on this machine.

    .venv/bin/python benchmarks/sandbox_bench.py [--n 300] [--concurrency 8] [--workers N]

(a) a fresh `python -I -c` subprocess per call, the way Molt's python_executor runs snippets
    (its RLIMIT_AS preamble included, a fresh temp cwd, a new session);
(b) our `local` provider (bubblewrap jails, warm zygotes, one fork per call) through the public API;
(c) our `docker` provider, when a Docker engine answers.
Latency = sequential calls (p50/p99, ms). Throughput = `--concurrency` calls in flight (exec/s).
CPU ms/exec = CPU time of everything the calls ran (our process, subprocesses, jails), measured with a
cpuacct cgroup when we are root; unlike wall-clock figures it barely moves when other work shares the
cores, and 1000 * cores / (CPU ms/exec) bounds the executions/s the machine can sustain.
Docker's containers live in the engine's cgroups, so tier (c) has no CPU figure.

    .venv/bin/python benchmarks/sandbox_bench.py --ab-injail DIR [--n 300] [--blocks 16]

instead runs only tier (b) twice over, side by side: one warm pool whose jails run the in-jail modules in DIR (another
version of sandboxes/injail/, e.g. `git archive REV sandboxes/injail | tar -x --strip-components=2 -C DIR`) and one
running the current ones, `--blocks` blocks of `--n` sequential calls each, alternated; each side's p50 and CPU
ms/call, and how many blocks the current code won.

    .venv/bin/python benchmarks/sandbox_bench.py --smoke [--ab-injail DIR]

(what `make test` runs, tests/test_benchmarks_smoke.py): n=10, 2 calls in flight, 1 worker (2 blocks with
--ab-injail): every tier and the ratio line in seconds, figures meaningless.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import sandboxes

SNIPPET = "print(sum(range(100)))"
MOLT_PREAMBLE = "import resource\nresource.setrlimit(resource.RLIMIT_AS, (1 << 30, 3 << 29))\n"


class CpuMeter:
    """CPU nanoseconds used by this process and everything it starts (cgroup v1 cpuacct), if available."""

    def __init__(self) -> None:
        self.path = None
        base = "/sys/fs/cgroup/cpuacct"
        if os.geteuid() == 0 and os.access(base, os.W_OK):
            self.path = os.path.join(base, f"sandbox-bench-{os.getpid()}")
            os.makedirs(self.path, exist_ok=True)
            with open(os.path.join(self.path, "cgroup.procs"), "w") as handle:
                handle.write(str(os.getpid()))

    def read(self) -> int | None:
        if self.path is None:
            return None
        with open(os.path.join(self.path, "cpuacct.usage")) as handle:
            return int(handle.read())

    def close(self) -> None:
        if self.path is not None:
            with open("/sys/fs/cgroup/cpuacct/cgroup.procs", "w") as handle:
                handle.write(str(os.getpid()))
            os.rmdir(self.path)


METER: CpuMeter | None = None


def cpu_ms_per_call(before: int | None, calls: int) -> float | None:
    after = METER.read() if METER else None
    return None if before is None or after is None else (after - before) / calls / 1e6


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def fresh_subprocess_call() -> float:
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-") as cwd:
        out = subprocess.run(
            [sys.executable, "-I", "-c", MOLT_PREAMBLE + SNIPPET],
            capture_output=True,
            timeout=10,
            cwd=cwd,
            start_new_session=True,
        )
    if out.stdout != b"4950\n":
        raise RuntimeError(f"fresh subprocess returned {out!r}")
    return time.perf_counter() - start


def bench_fresh(n: int, concurrency: int) -> dict:
    for _ in range(5):
        fresh_subprocess_call()
    before = METER.read() if METER else None
    latencies = [fresh_subprocess_call() for _ in range(n)]
    cpu_ms = cpu_ms_per_call(before, n)
    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(lambda _: fresh_subprocess_call(), range(n)))
    return summarize("a: fresh python -I -c", latencies, n / (time.perf_counter() - start), cpu_ms)


async def bench_provider(label: str, provider: str, n: int, concurrency: int, options: dict) -> dict:
    async with sandboxes.open(provider, wall_s=10, **options) as sb:
        warm = await asyncio.gather(*(sb.run_python(SNIPPET) for _ in range(max(4, concurrency))))
        if any(r.stdout != "4950\n" for r in warm):
            raise RuntimeError(f"{provider} returned {warm[0]!r}")
        latencies = []
        before = METER.read() if METER and provider == "local" else None
        for _ in range(n):
            start = time.perf_counter()
            r = await sb.run_python(SNIPPET)
            latencies.append(time.perf_counter() - start)
            assert r.ok, r
        cpu_ms = cpu_ms_per_call(before, n)
        semaphore = asyncio.Semaphore(concurrency)

        async def one() -> None:
            async with semaphore:
                r = await sb.run_python(SNIPPET)
                assert r.ok, r

        start = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(3 * n)))
        throughput = 3 * n / (time.perf_counter() - start)
    return summarize(label, latencies, throughput, cpu_ms)


async def bench_ab(old_dir: str, n: int, blocks: int, workers: int) -> None:
    """Tier (b) with the in-jail modules of `old_dir` against the current ones, in alternated blocks of `n` calls."""
    from sandboxes import jail

    current = (jail.IN_JAIL_DIR, jail.IN_JAIL_MODULES)
    old = (old_dir, tuple(sorted(f for f in os.listdir(old_dir) if f.endswith(".py") and f != "__init__.py")))
    sides = {}
    for label, (directory, modules) in (("old", old), ("new", current)):
        jail.IN_JAIL_DIR, jail.IN_JAIL_MODULES = directory, modules  # read when a worker starts
        # a pool of its own per side (pools are shared by options), never recycled: its jails keep their code
        sides[label] = sb = sandboxes.open("local", wall_s=10, workers=workers, recycle_after=10**9 + len(sides))
        await sb.start()
        await asyncio.gather(*(sb.run_python(SNIPPET) for _ in range(4 * workers)))  # every worker started
    jail.IN_JAIL_DIR, jail.IN_JAIL_MODULES = current
    latencies = {label: [] for label in sides}
    cpu_ns = dict.fromkeys(sides, 0)
    block_p50 = {label: [] for label in sides}
    for block in range(blocks):
        for label in ("old", "new") if block % 2 == 0 else ("new", "old"):
            sb, times = sides[label], []
            before = METER.read() if METER else None
            for _ in range(n):
                start = time.perf_counter()
                r = await sb.run_python(SNIPPET)
                times.append(time.perf_counter() - start)
                assert r.stdout == "4950\n", r
            if before is not None:
                cpu_ns[label] += METER.read() - before
            latencies[label] += times
            block_p50[label].append(statistics.median(times) * 1000)
    for sb in sides.values():
        await sb.close()
    wins = sum(new < old for old, new in zip(block_p50["old"], block_p50["new"], strict=True))
    print(f"{'side':<6}{'p50 ms':>9}{'p99 ms':>9}{'CPU ms/exec':>13}   block p50s (ms)")
    for label, times in latencies.items():
        ms = [t * 1000 for t in times]
        cpu = f"{cpu_ns[label] / len(times) / 1e6:>13.3f}" if METER and METER.path else f"{'n/a':>13}"
        blocks_text = " ".join(f"{x:.2f}" for x in block_p50[label])
        print(f"{label:<6}{statistics.median(ms):>9.3f}{percentile(ms, 0.99):>9.2f}{cpu}   {blocks_text}")
    print(f"new p50 lower than old in {wins} of {blocks} blocks; old = {old_dir}")


def summarize(label: str, latencies: list[float], throughput: float, cpu_ms: float | None) -> dict:
    ms = [x * 1000 for x in latencies]
    return {
        "label": label,
        "p50_ms": statistics.median(ms),
        "p99_ms": percentile(ms, 0.99),
        "exec_per_s": throughput,
        "cpu_ms": cpu_ms,
    }


def machine() -> str:
    cpus = os.cpu_count()
    try:
        with open("/proc/cpuinfo") as handle:
            model = next(line.split(":", 1)[1].strip() for line in handle if line.startswith("model name"))
    except (OSError, StopIteration):
        model = platform.processor() or "?"
    return f"{platform.system()} {platform.release()}, {cpus} vCPU ({model}), Python {platform.python_version()}"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=300, help="sequential calls per tier (throughput runs 3n)")
    parser.add_argument("--concurrency", type=int, default=8, help="calls in flight for the throughput run")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2, help="warm workers in our pools")
    parser.add_argument("--ab-injail", metavar="DIR", help="tier (b) only: DIR's in-jail modules vs the current ones")
    parser.add_argument("--blocks", type=int, default=16, help="alternated blocks of --n calls per side (--ab-injail)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, seconds: the code path, not the figures")
    args = parser.parse_args()
    if args.smoke:
        args.n, args.concurrency, args.workers, args.blocks = 10, 2, 1, 2
    global METER
    METER = CpuMeter()
    report = sandboxes.probe()
    load_before = load_average()
    print(f"# {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {machine()}")
    print(
        f"# snippet {SNIPPET!r}; n={args.n}; concurrency={args.concurrency}; workers={args.workers}; "
        f"landlock ABI {report.landlock_abi}, cgroup {report.cgroup}, docker {report.docker or 'none'}"
    )
    if args.ab_injail:
        await bench_ab(args.ab_injail, args.n, args.blocks, args.workers)
        sandboxes.shutdown()
        METER.close()
        print(f"# load average before: {load_before}; after: {load_average()}")
        return
    rows = [bench_fresh(args.n, min(args.concurrency, os.cpu_count() or 2))]
    rows.append(
        await bench_provider("b: sandboxes local", "local", args.n, args.concurrency, {"workers": args.workers})
    )
    if report.docker:
        rows.append(
            await bench_provider("c: sandboxes docker", "docker", args.n, args.concurrency, {"workers": args.workers})
        )
    else:
        print(f"# c: docker skipped: {report.docker_detail}")
    sandboxes.shutdown()
    METER.close()
    print(f"# load average before: {load_before}; after: {load_average()}")
    print(f"{'tier':<24}{'p50 ms':>9}{'p99 ms':>9}{'exec/s':>9}{'CPU ms/exec':>13}{'exec/s bound':>14}")
    cores = os.cpu_count() or 1
    for row in rows:
        cpu = f"{'n/a':>13}{'n/a':>14}"
        if row["cpu_ms"]:
            cpu = f"{row['cpu_ms']:>13.2f}{1000 * cores / row['cpu_ms']:>14.0f}"
        print(f"{row['label']:<24}{row['p50_ms']:>9.2f}{row['p99_ms']:>9.2f}{row['exec_per_s']:>9.0f}{cpu}")
    a, b = rows[0], rows[1]
    ratio = f"ratio a/b: p50 {a['p50_ms'] / b['p50_ms']:.1f}x, throughput {b['exec_per_s'] / a['exec_per_s']:.1f}x"
    if a["cpu_ms"] and b["cpu_ms"]:
        ratio += f", CPU per exec {a['cpu_ms'] / b['cpu_ms']:.1f}x"
    print(ratio)


def load_average() -> str:
    with open("/proc/loadavg") as handle:
        return " ".join(handle.read().split()[:3])


if __name__ == "__main__":
    asyncio.run(main())
