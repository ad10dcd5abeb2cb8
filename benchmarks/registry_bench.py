"""Requests/s and latency of the registry server (``molt-env serve``) on SQLite and on PostgreSQL, and publish
throughput.

For each backend the bench fills a fresh registry with ``--packages`` env packages of ``--versions`` versions each
(built once by hatchling, published through the JSON API: that is the publish-throughput row), then drives the
running server with an aiohttp client holding ``c`` keep-alive connections (c = 1 and 64) over:

- ``/api/health``: the baseline, in the same server process: FastAPI + uvicorn with no registry work, so the
  ``vs health`` column is what the data layer and the page cost on top of the framework;
- ``/simple/<pkg>/`` (the PEP 503 index pip reads), ``/api/resolve?env_id=...`` (what ``molt-env install`` asks),
  ``/packages/<pkg>`` (the hub's package page, README rendered and sanitized), ``/envs/<id>`` (the hub's env page),
  ``/evals/<id>/`` (an uploaded eval's episodes in the hub's viewer pages: its first and second page and an
  episode, 400 episodes uploaded through the API).

Then the trajectory viewer (``molt-env view``, ``env_registry/hub/viewer.py``) on a synthesized eval of
``--viewer-episodes`` episodes (default 10,000; records shaped as ``molt-env eval`` writes them, ``--viewer-turns``
tool-call turns each, in a shuffled order as a concurrent eval finishes them), its app in process through httpx's
ASGI transport, so the time of a request is the server's (no socket, no other process): the first page cold (the
first request after ``samples.jsonl`` changed: the index is built) and warm, a filtered page cold (the index plus
the field scan) and warm, the last page; against a baseline in the same command, what the viewer did per file
change before it paged: the whole file read and ``json.loads`` per line (its floor: it also rendered 1,000 rows).
The field scan is timed with ``json`` and with orjson (used when installed). Goal: first page <= 300 ms.

Every request of a row goes to a package drawn round-robin from all of them. The client runs on the same machine,
so its CPU counts against the server's: on 2 cores the figures are a floor; ``server CPU ms/req`` (the server's
processes' user + system time over the row) and ``client CPU ms/req`` (the bench's own) do not depend on what else
runs there; nor does ``PostgreSQL CPU ms/req`` (the throwaway cluster's processes): their sum is what one request
costs the machine. PostgreSQL is a throwaway cluster
started by the bench (``tests/env_registry/pg_cluster.py``), unless ``--pg-url`` names one.

    .venv/bin/python benchmarks/registry_bench.py [--backends sqlite postgresql] [--requests 3000] [--workers 1]
    .venv/bin/python benchmarks/registry_bench.py --backends [--viewer-episodes 10000]     # the viewer only

``--smoke`` (what ``make test`` runs, tests/test_benchmarks_smoke.py): both backends, 2 packages x 1 version, 40
requests per row at 1 and 4 clients, a viewer of 1,000 episodes; the same rows and ratios, figures meaningless.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import aiohttp
import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "env_registry"))  # the test suite's throwaway PostgreSQL cluster

import pg_cluster  # noqa: E402
from packaging_support import hatch_build, set_version  # noqa: E402

from env_registry.hub import viewer  # noqa: E402
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


def upload_eval(url: str, token: str, release, workdir: Path, episodes: int = 400) -> int:
    """An eval of the release's first env (``episodes`` records, 100 prompts x 4) uploaded with its episodes, as
    ``molt-env eval --out DIR --publish-results`` does; returns its id (its pages: ``/evals/<id>/``)."""
    env_id = release.env_ids[0]
    summary = {
        "env_id": env_id, "package_version": release.version, "spec_hash": "ab" * 8, "split": "test",
        "num_prompts": episodes // 4, "n": 4, "pass@1": 0.4, "pass@4": 0.7, "mean_reward": 0.4, "failures": {},
        "model": "bench", "seed": 0, "started": "2026-12-05T00:00:00Z", "finished": "2026-12-05T00:01:00Z",
    }  # fmt: skip
    samples = workdir / f"samples-{release.name}-{uuid.uuid4().hex}.jsonl"
    with samples.open("w") as f:
        for i in range(episodes):
            messages = [{"role": "user", "content": f"question {i // 4}"}, {"role": "assistant", "content": "x " * 200}]
            record = {"env_id": env_id, "prompt_id": i // 4, "sample": i % 4, "prompt": messages[:1],
                      "transcript": messages, "reward": float(i % 3 == 0), "completed": True, "failure": None,
                      "turns": 1, "prompt_tokens": 30, "completion_tokens": 200, "info": {}}  # fmt: skip
            f.write(json.dumps(record) + "\n")
    client = RegistryClient(url, token)
    record = client.publish_eval(release.name, release.version, summary)
    client.publish_eval_samples(release.name, release.version, record.id, samples)
    return record.id


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
        run = upload_eval(url, token, releases[-1], workdir)
        names = sorted({r.name for r in releases})
        ids = sorted({e for r in releases for e in r.env_ids})
        endpoints = {
            "/api/health": ["/api/health"],
            "/simple/<pkg>/": [f"/simple/{n}/" for n in names],
            "/api/resolve": [f"/api/resolve?env_id={e}" for e in ids],
            "/packages/<pkg>": [f"/packages/{n}" for n in names],
            "/envs/<id>": [f"/envs/{e}" for e in ids],
            "/evals/<id>/ (episodes)": [f"/evals/{run}/", f"/evals/{run}/?page=2", f"/evals/{run}/episodes/5"],
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


def synthesize_eval(root: Path, episodes: int, turns: int) -> float:
    """An eval directory of ``episodes`` records as ``molt-env eval`` writes them (two envs, 4 samples a prompt,
    ``turns`` tool-call turns each) in a shuffled order, and its summary.json; returns the file's size in MB."""
    rng = random.Random(0)
    envs = ["bench/coin-v1", "bench/tool-v1"]
    lines = []
    for i in range(episodes):
        messages = [{"role": "user", "content": f"question {i // 4}: " + "what is the answer? " * 10}]
        for _ in range(turns):
            call = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "x"}'}}
            messages.append({"role": "assistant", "content": "let me look it up. " * 20, "tool_calls": [call]})
            messages.append({"role": "tool", "content": "a tool result. " * 20, "tool_call_id": "call_1"})
        failure = {"reason": "timeout", "detail": "the sample ran past --timeout 60 s"} if i % 11 == 0 else None
        reward = None if failure else float(rng.random() < 0.4)
        record = {
            "env_id": envs[i * 2 // episodes], "spec_hash": "ab" * 32, "package_version": "1.0.0",
            "prompt_id": i % (episodes // 2) // 4, "sample": i % 4, "seed": rng.randrange(2**31),
            "prompt": messages[:1], "label": "42", "transcript": messages, "actions": [], "prompt_tokens": 300,
            "completion_tokens": rng.randrange(1, 2000), "turns": turns, "truncated": False,
            "completed": failure is None, "reward": reward, "score": reward, "info": {"answer": "42"},
            "failure": failure, "latency_s": rng.random(), "finished": "2026-12-04T23:00:00+00:00",
        }  # fmt: skip
        lines.append(json.dumps(record, ensure_ascii=False) + "\n")
    rng.shuffle(lines)
    root.mkdir(parents=True)
    (root / viewer.SAMPLES).write_text("".join(lines))
    summary = {"env_id": envs, "model": "bench", "n": 4, "num_prompts": episodes // 4, "pass@1": 0.4,
               "mean_reward": 0.4, "failures": {"timeout": (episodes + 10) // 11},
               "envs": {e: {"pass_threshold": 1.0} for e in envs}}  # fmt: skip
    (root / viewer.SUMMARY).write_text(json.dumps(summary))
    return (root / viewer.SAMPLES).stat().st_size / 1e6


def whole_file(path: Path) -> int:
    """The baseline: what the viewer did on every change of the file before it paged (its floor)."""
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    records.sort(key=lambda r: (r["env_id"], r["prompt_id"], r["sample"]))
    return len(records)


def bench_viewer(args: argparse.Namespace, workdir: Path) -> list[str]:
    root = workdir / "eval"
    megabytes = synthesize_eval(root, args.viewer_episodes, args.viewer_turns)
    samples = root / viewer.SAMPLES
    app = viewer.create_app(root)
    last = -(-args.viewer_episodes // viewer.PAGE_SIZE)
    filtered = "/?reward=pass&min_len=100&page=2"

    def touch() -> None:  # a new version of the file: the viewer indexes it again
        stat = samples.stat()
        os.utime(samples, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))

    async def timed(client: httpx.AsyncClient, path: str) -> float:
        start = time.perf_counter()
        response = await client.get(path)
        elapsed = (time.perf_counter() - start) * 1000
        if response.status_code != 200 or 'href="/episodes/' not in response.text:
            raise RuntimeError(f"the viewer answered {path} with {response.status_code}")
        return elapsed

    async def measure() -> dict[str, list[float]]:
        times: dict[str, list[float]] = {k: [] for k in ("cold", "warm", "cold filtered", "warm filtered", "last")}
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://viewer") as client:
            await timed(client, "/")
            for _ in range(args.viewer_cold):
                touch()
                times["cold"].append(await timed(client, "/"))
                times["warm"] += [await timed(client, "/") for _ in range(args.viewer_warm)]
                touch()
                times["cold filtered"].append(await timed(client, filtered))
                times["warm filtered"] += [await timed(client, filtered) for _ in range(args.viewer_warm)]
                times["last"] += [await timed(client, f"/?page={last}") for _ in range(args.viewer_warm)]
        return times

    times = asyncio.run(measure())
    baseline = []
    for _ in range(args.viewer_cold):
        start = time.perf_counter()
        whole_file(samples)
        baseline.append((time.perf_counter() - start) * 1000)
    scans: dict[str, list[float]] = {"json": [], "orjson": [], "index": []}
    for _ in range(args.viewer_cold):
        start = time.perf_counter()
        viewer.Index(samples, {})
        scans["index"].append((time.perf_counter() - start) * 1000)
        for name, loads in (("json", json.loads), ("orjson", viewer._fast_loads)):
            index = viewer.Index(samples, {})
            saved, viewer._fast_loads = viewer._fast_loads, loads
            start = time.perf_counter()
            index.fields()
            scans[name].append((time.perf_counter() - start) * 1000)
            viewer._fast_loads = saved
    index_ms, scans = statistics.median(scans.pop("index")), {k: statistics.median(v) for k, v in scans.items()}
    if viewer._fast_loads is json.loads:
        scans["orjson"] = float("nan")  # not installed: the json figure twice
    cold, base = statistics.median(times["cold"]), statistics.median(baseline)
    lines = [
        f"viewer {args.viewer_episodes} episodes ({megabytes:.1f} MB): index {index_ms:.1f} ms, field scan json "
        f"{scans['json']:.1f} ms, orjson {scans['orjson']:.1f} ms",
        f"viewer first page cold p50 {cold:.1f} ms, max {max(times['cold']):.1f} ms; warm p50 "
        f"{statistics.median(times['warm']):.1f} ms, p99 {percentile(times['warm'], 99):.1f} ms; baseline whole file "
        f"{base:.1f} ms; ratio cold/baseline {cold / base:.2f}x",
        f"viewer filtered page cold p50 {statistics.median(times['cold filtered']):.1f} ms; warm p50 "
        f"{statistics.median(times['warm filtered']):.1f} ms, p99 {percentile(times['warm filtered'], 99):.1f} ms; "
        f"last page warm p50 {statistics.median(times['last']):.1f} ms",
        f"goal first page <= 300 ms (cold, max): {'met' if max(times['cold']) <= 300 else 'NOT met'}",
    ]
    for line in lines:
        print(line, flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", nargs="*", default=["sqlite", "postgresql"], help="none: the viewer only")
    parser.add_argument("--packages", type=int, default=20)
    parser.add_argument("--versions", type=int, default=3)
    parser.add_argument("--requests", type=int, default=3000, help="requests per row at 64 clients (1/4 at 1)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--workers", type=int, default=1, help="molt-env serve --workers")
    parser.add_argument("--pg-url", help="an existing PostgreSQL database instead of a throwaway cluster")
    parser.add_argument("--viewer-episodes", type=int, default=10_000, help="episodes of the viewer's eval")
    parser.add_argument("--viewer-turns", type=int, default=4, help="tool-call turns per episode of the viewer's eval")
    parser.add_argument("--viewer-cold", type=int, default=7, help="cold requests per viewer row (file changed)")
    parser.add_argument("--viewer-warm", type=int, default=20, help="warm requests after each cold one")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, seconds: the code path, not the figures")
    args = parser.parse_args()
    if args.smoke:
        args.packages, args.versions, args.requests, args.concurrency = 2, 1, 40, [1, 4]
        args.viewer_episodes, args.viewer_cold, args.viewer_warm = 1000, 2, 3
    print(f"load before: {os.getloadavg()}; cores: {os.cpu_count()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="molt-registry-bench-") as tmp:
        workdir = Path(tmp)
        releases = build_releases(workdir, args.packages, args.versions) if args.backends else []
        rows = []
        for backend in args.backends:
            rows += bench_backend(backend, args, releases, workdir)
        viewer_lines = bench_viewer(args, workdir)
    print(f"\nload after: {os.getloadavg()}\n")
    print(
        "| backend | endpoint | clients | req/s | p50 ms | p99 ms | server CPU ms/req | client CPU ms/req "
        "| PostgreSQL CPU ms/req | vs health |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print("\n" + "\n".join(viewer_lines))


if __name__ == "__main__":
    main()
