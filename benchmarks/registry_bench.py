"""Requests/s and latency of the registry server (``molt-env serve``) on SQLite and on PostgreSQL, and publish
throughput.

For each backend the bench fills a fresh registry with ``--packages`` env packages of ``--versions`` versions each
(built once by hatchling, published through the JSON API: that is the publish-throughput row), then drives the
running server with an aiohttp client holding ``c`` keep-alive connections (c = 1 and 64) over:

- ``/api/health``: the baseline, in the same server process: FastAPI + uvicorn with no registry work, so the
  ``vs health`` column is what the data layer and the page cost on top of the framework;
- ``/simple/<pkg>/`` (the PEP 503 index pip reads), ``/api/resolve?env_id=...`` (what ``molt-env install`` asks),
  ``/packages/<pkg>`` (the hub's package page, README rendered and sanitized).

Every request of a row goes to a package drawn round-robin from all of them. The client runs on the same machine,
so its CPU counts against the server's: on 2 cores the figures are a floor; ``server CPU ms/req`` (the server's
processes' user + system time over the row) and ``client CPU ms/req`` (the bench's own) do not depend on what else
runs there; nor does ``PostgreSQL CPU ms/req`` (the throwaway cluster's processes): their sum is what one request
costs the machine. PostgreSQL is a throwaway cluster
started by the bench (``tests/env_registry/pg_cluster.py``), unless ``--pg-url`` names one.

    .venv/bin/python benchmarks/registry_bench.py [--backends sqlite postgresql] [--requests 3000] [--workers 1]

``--smoke`` (what ``make test`` runs, tests/test_benchmarks_smoke.py): both backends, 2 packages x 1 version, 40
requests per row at 1 and 4 clients; the same rows and ratios, figures meaningless.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import aiohttp
import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "env_registry"))  # the test suite's throwaway PostgreSQL cluster

import pg_cluster  # noqa: E402
from packaging_support import hatch_build, set_version  # noqa: E402

from env_registry.packages.scaffold import init  # noqa: E402
from env_registry.store.client import RegistryClient  # noqa: E402

MOLT_ENV = str(Path(sys.executable).with_name("molt-env"))


def build_releases(workdir: Path, packages: int, versions: int) -> list:
    releases = []
    for i in range(packages):
        src = init(workdir / f"src{i}", f"bench/env{i}-v1", package=f"bench-env{i}")
        for v in range(versions):
            set_version(src, f"1.{v}.0")
            (src / "README.md").write_text(f"# bench-env{i}\n\nRelease **1.{v}.0** of a benchmark env.\n" * 20)
            releases.append(hatch_build(src, workdir / f"dist{i}-{v}"))
    return releases


def start_server(root: Path, db: str | None, workers: int) -> tuple[subprocess.Popen, str, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [MOLT_ENV, "serve", "--root", str(root), "--port", str(port), "--mint-token", "bench"]
    cmd += ["--db", db] if db else []
    cmd += ["--workers", str(workers)] if workers > 1 else []
    log = root.with_name(root.name + ".log")
    process = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        match = re.search(r"\(shown once\): (\S+)", log.read_text())
        try:
            if match and httpx.get(f"{url}/api/health", timeout=1).status_code == 200:
                return process, url, match[1]
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"molt-env serve did not start:\n{log.read_text()}")


async def drive(url: str, paths: list[str], concurrency: int, requests: int) -> tuple[float, list[float]]:
    """``requests`` GETs over ``concurrency`` keep-alive connections; returns (wall seconds, latencies in ms)."""
    latencies: list[float] = []
    counter = iter(range(requests))
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(url, connector=connector) as session:

        async def worker() -> None:
            for i in counter:
                start = time.perf_counter()
                async with session.get(paths[i % len(paths)]) as response:
                    await response.read()
                    if response.status != 200:
                        raise RuntimeError(f"{paths[i % len(paths)]} answered {response.status}")
                latencies.append((time.perf_counter() - start) * 1000)

        for path in paths[: min(len(paths), 50)]:  # warm-up: connections, caches, the README renderer
            async with session.get(path) as response:
                await response.read()
        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - began, latencies


def publish_throughput(url: str, token: str, releases: list, concurrency: int) -> float:
    client = RegistryClient(url, token)
    began = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(client.publish, releases))
    return len(releases) / (time.perf_counter() - began)


def tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` and its descendants so far, live or reaped (Linux ``/proc``)."""
    total, pending = 0.0, [pid]
    while pending:
        pid = pending.pop()
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        # its own time and its reaped children's (PostgreSQL ends backends when the pool closes overflow connections)
        total += sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")
        for task in Path(f"/proc/{pid}/task").iterdir():
            pending += [int(child) for child in (task / "children").read_text().split()]
    return total


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def bench_backend(backend: str, args: argparse.Namespace, releases: list, workdir: Path) -> list[list[str]]:
    cluster = None
    db = None
    if backend == "postgresql":
        if args.pg_url:
            db = args.pg_url
        else:
            cluster = pg_cluster.start()
            db = cluster.new_database()
    process, url, token = start_server(workdir / f"root-{backend}", db, args.workers)
    postmaster = None  # the throwaway cluster's processes: their CPU is the database's share of a request
    if cluster is not None:
        postmaster = int((cluster.base / "data" / "postmaster.pid").read_text().split()[0])
    rows = []
    try:
        rate = publish_throughput(url, token, releases, concurrency=4)
        rows.append([backend, "publish (4 clients)", "4", f"{rate:.1f} releases/s", "", "", "", "", "", ""])
        names = sorted({r.name for r in releases})
        ids = sorted({e for r in releases for e in r.env_ids})
        endpoints = {
            "/api/health": ["/api/health"],
            "/simple/<pkg>/": [f"/simple/{n}/" for n in names],
            "/api/resolve": [f"/api/resolve?env_id={e}" for e in ids],
            "/packages/<pkg>": [f"/packages/{n}" for n in names],
        }
        for concurrency in args.concurrency:
            floor = None
            for label, paths in endpoints.items():
                count = args.requests if concurrency > 1 else max(args.requests // 4, min(args.requests, 200))
                cpu_before, client_before = tree_cpu(process.pid), time.process_time()
                db_before = tree_cpu(postmaster) if postmaster else 0.0
                wall, latencies = asyncio.run(drive(url, paths, concurrency, count))
                cpu_ms = (tree_cpu(process.pid) - cpu_before) * 1000 / count
                client_ms = (time.process_time() - client_before) * 1000 / count
                db_ms = f"{(tree_cpu(postmaster) - db_before) * 1000 / count:.2f}" if postmaster else ""
                rps = len(latencies) / wall
                floor = floor or rps
                rows.append(
                    [
                        backend,
                        label,
                        str(concurrency),
                        f"{rps:,.0f}",
                        f"{statistics.median(latencies):.2f}",
                        f"{percentile(latencies, 99):.2f}",
                        f"{cpu_ms:.2f}",
                        f"{client_ms:.2f}",
                        db_ms,
                        "1.00" if label == "/api/health" else f"{rps / floor:.2f}",
                    ]
                )
                print(" | ".join(rows[-1]), flush=True)
            ratios = ", ".join(f"{row[1]} {row[9]}x" for row in rows[-len(endpoints) + 1 :])
            print(f"ratio req/s vs /api/health, {backend}, {concurrency} clients: {ratios}", flush=True)
    finally:
        process.terminate()
        process.wait(timeout=30)
        if cluster is not None:
            cluster.stop()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", nargs="+", default=["sqlite", "postgresql"])
    parser.add_argument("--packages", type=int, default=20)
    parser.add_argument("--versions", type=int, default=3)
    parser.add_argument("--requests", type=int, default=3000, help="requests per row at 64 clients (1/4 at 1)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--workers", type=int, default=1, help="molt-env serve --workers")
    parser.add_argument("--pg-url", help="an existing PostgreSQL database instead of a throwaway cluster")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, seconds: the code path, not the figures")
    args = parser.parse_args()
    if args.smoke:
        args.packages, args.versions, args.requests, args.concurrency = 2, 1, 40, [1, 4]
    print(f"load before: {os.getloadavg()}; cores: {os.cpu_count()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="molt-registry-bench-") as tmp:
        workdir = Path(tmp)
        releases = build_releases(workdir, args.packages, args.versions)
        rows = []
        for backend in args.backends:
            rows += bench_backend(backend, args, releases, workdir)
    print(f"\nload after: {os.getloadavg()}\n")
    print(
        "| backend | endpoint | clients | req/s | p50 ms | p99 ms | server CPU ms/req | client CPU ms/req "
        "| PostgreSQL CPU ms/req | vs health |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
