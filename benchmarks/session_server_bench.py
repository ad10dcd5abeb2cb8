"""Per-call overhead of the session server beyond generation, at 1, 10 and 100 concurrent sessions.

The server runs in its own process in front of a zero-cost engine (a fixed completion, no CPU), with the real tiny
HF tokenizer and its chat template, so every millisecond measured is the server's: HTTP, JSON, wire decoding,
template rendering, delta tokenization (on the tokenizer pool), capture bookkeeping and reply encoding. Each
session holds a multi-turn conversation (every call extends the last: the token-exact continuation path).

Two regimes:
- ``--engine-ms 0`` (default): calls return instantly, so the sessions saturate the server's event loop; the
  numbers that matter are ``server CPU ms/call`` and ``calls/s`` (the p50s there are queueing, not overhead).
- ``--engine-ms 200``: each call waits 200 ms in the engine (no CPU), like real generation; the server is not
  saturated and ``handler p50/p99`` is the per-call overhead beyond generation.

Reported per level, over all calls after a warm-up round:
- ``handler p50/p99``: the server's time per call from the request body's arrival to the response being ready,
  engine time subtracted (its ``Server-Timing`` header);
- ``client p50/p99``: latency seen by the client, engine time included (adds HTTP and queueing; the load comes
  from ``--clients`` processes so one Python client is not the bottleneck);
- ``server CPU ms/call``: the server process's CPU time (user + system, 10 ms ticks) over the calls, session
  open/delete included, so it errs high; ``calls/s``: chat calls per second of the load generators' wall time.

The last lines give each other wire's handler p50 as a ratio to the openai wire's at the same level (when openai
is among ``--wire``): the Responses and Anthropic wires against chat completions.

    .venv/bin/python benchmarks/session_server_bench.py [--engine-ms 200] [--levels 1 10 100] [--wire openai responses]

``--smoke`` (what ``make test`` runs, tests/test_benchmarks_smoke.py): every wire at 1 and 4 sessions of 2 calls, 2
client processes, 5 ms per call in the engine: the same rows and ratios in seconds, figures meaningless.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import re
import statistics
import sys
import time
from pathlib import Path

GSM8K = Path(__file__).resolve().parents[1] / "molt_envs" / "envs" / "data" / "gsm8k" / "train.jsonl"
REPLY = "Natalia sold 48 / 2 = 24 clips in May, so 48 + 24 = 72 in all. The answer is \\boxed{72}."


def _serve(conn, engine_s: float) -> None:
    """Child process: tiny tokenizer + zero-cost engine + SessionServer; sends its URL, serves until killed."""
    from molt_envs import Generation
    from molt_envs.sessions.server import SessionServer
    from molt_train.models.tiny import train_tokenizer

    with GSM8K.open() as f:
        texts = [json.loads(line)["question"] for _, line in zip(range(1500), f, strict=False)]
    tokenizer = train_tokenizer(texts, vocab_size=1024)
    reply_ids = tokenizer.encode(REPLY, add_special_tokens=False) + [tokenizer.eos_token_id]

    class ZeroCostEngine:  # no CPU; with engine_s > 0 it waits like a remote engine would
        async def generate(self, prompt_ids, params, images=None):
            if engine_s:
                await asyncio.sleep(engine_s)
            ids = reply_ids[: params.max_tokens]
            return Generation(ids, [-0.5] * len(ids), "stop" if ids[-1] == tokenizer.eos_token_id else "length")

    async def main():
        server = SessionServer(ZeroCostEngine(), tokenizer, max_length=1_000_000)
        conn.send(await server.start())
        await asyncio.Event().wait()

    asyncio.run(main())


async def _conversation(http, url: str, turns: int, wire: str, sink: list, system_chars: int) -> None:
    session = (await http.post(f"{url}/sessions")).json()["session_id"]
    messages = [{"role": "user", "content": "Natalia sold clips to 48 of her friends in April. How many in all?"}]
    if system_chars:  # a long context: the template and tokenizer work then goes to the tokenizer pool
        messages.insert(0, {"role": "system", "content": ("You are careful. " * system_chars)[:system_chars]})
    route = {"openai": "chat/completions", "anthropic": "messages", "responses": "responses"}[wire]
    path = f"{url}/s/{session}/v1/{route}"
    for turn in range(turns):
        body = {"model": "policy", "messages": messages, "max_tokens": 64}
        if wire == "responses":  # the whole history as input items, as Codex sends it (store: false)
            body = {"model": "policy", "input": messages, "max_output_tokens": 64, "store": False}
        started = time.perf_counter()
        response = await http.post(path, json=body)
        latency = time.perf_counter() - started
        response.raise_for_status()
        timing = dict(re.findall(r"(\w+);dur=([\d.]+)", response.headers["server-timing"]))
        sink.append((latency * 1000, float(timing["handler"]) - float(timing["engine"])))
        data = response.json()
        if wire == "openai":
            text = data["choices"][0]["message"]["content"]
        elif wire == "responses":
            text = data["output"][0]["content"][0]["text"]
        else:
            text = data["content"][0]["text"]
        messages = messages + [{"role": "assistant", "content": text}, {"role": "user", "content": f"And {turn}?"}]
    await http.delete(f"{url}/sessions/{session}")


def _pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _drive(
    url: str, sessions: int, turns: int, wire: str, system_chars: int
) -> tuple[float, list[tuple[float, float]]]:
    """One load-generating process: ``sessions`` concurrent conversations; returns its wall seconds and
    (client ms, handler ms) per call."""
    import httpx

    async def run() -> tuple[float, list]:
        limits = httpx.Limits(max_connections=sessions + 4, max_keepalive_connections=sessions + 4)
        async with httpx.AsyncClient(limits=limits, timeout=120) as http:
            sink: list = []
            started = time.perf_counter()
            await asyncio.gather(*[_conversation(http, url, turns, wire, sink, system_chars) for _ in range(sessions)])
            return time.perf_counter() - started, sink

    return asyncio.run(run())


def _level(pool, url: str, pid: int, sessions: int, turns: int, wire: str, clients: int, system_chars: int) -> dict:
    shares = [sessions // clients + (i < sessions % clients) for i in range(clients)]
    shares = [n for n in shares if n]
    pool.starmap(_drive, [(url, n, 2, wire, system_chars) for n in shares])  # warm-up
    server_cpu0 = _cpu_s(pid)
    parts = pool.starmap(_drive, [(url, n, turns, wire, system_chars) for n in shares])
    server_cpu = _cpu_s(pid) - server_cpu0  # includes session open/delete calls (2 per session), so it errs high
    wall = max(seconds for seconds, _ in parts)
    sink = [sample for _, part in parts for sample in part]
    client = [c for c, _ in sink]
    handler = [h for _, h in sink]
    return {
        "wire": wire,
        "sessions": sessions,
        "calls": len(sink),
        "handler_p50_ms": _pct(handler, 50),
        "handler_p99_ms": _pct(handler, 99),
        "client_p50_ms": _pct(client, 50),
        "client_p99_ms": _pct(client, 99),
        "calls_per_s": len(sink) / wall,
        "server_cpu_ms_per_call": server_cpu * 1000 / len(sink),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 10, 100])
    parser.add_argument("--turns", type=int, default=6, help="calls per session (each extends the conversation)")
    parser.add_argument(
        "--wire", choices=["openai", "anthropic", "responses"], nargs="+", default=["openai", "anthropic", "responses"]
    )
    parser.add_argument(
        "--clients", type=int, default=4, help="load-generating processes (one is the bottleneck at 100 sessions)"
    )
    parser.add_argument(
        "--engine-ms",
        type=float,
        default=0.0,
        help="simulated generation time per call (no CPU); 0 saturates the server, so p50s then measure queueing",
    )
    parser.add_argument(
        "--system-chars",
        type=int,
        default=0,
        help="prepend a system message this long (over INLINE_MAX_CHARS, the tokenizer work goes to the pool)",
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, seconds: the code path, not the figures")
    args = parser.parse_args()
    if args.smoke:
        args.levels, args.turns, args.clients, args.engine_ms = [1, 4], 2, 2, 5.0
    parent, child = mp.get_context("spawn").Pipe()
    server = mp.get_context("spawn").Process(target=_serve, args=(child, args.engine_ms / 1000), daemon=True)
    server.start()
    url = parent.recv()
    try:
        with mp.get_context("spawn").Pool(args.clients) as pool:
            rows = [
                _level(pool, url, server.pid, n, args.turns, wire, args.clients, args.system_chars)
                for wire in args.wire
                for n in args.levels
            ]
    finally:
        server.kill()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, "
        f"{args.clients} client processes, {args.turns} calls per session, engine {args.engine_ms:g} ms per call, "
        f"system prompt {args.system_chars} chars"
    )
    print("| wire | sessions | calls | server CPU ms/call | handler p50 / p99 (ms) | client p50 / p99 (ms) | calls/s |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['wire']} | {r['sessions']} | {r['calls']} | {r['server_cpu_ms_per_call']:.2f} "
            f"| {r['handler_p50_ms']:.2f} / {r['handler_p99_ms']:.2f} "
            f"| {r['client_p50_ms']:.2f} / {r['client_p99_ms']:.2f} | {r['calls_per_s']:.0f} |"
        )
    base = {r["sessions"]: r["handler_p50_ms"] for r in rows if r["wire"] == "openai"}
    for sessions, p50 in base.items():
        others = [r for r in rows if r["sessions"] == sessions and r["wire"] != "openai"]
        if others:
            ratios = ", ".join(f"{r['wire']} {r['handler_p50_ms'] / p50:.2f}x" for r in others)
            print(f"handler p50 ratio to openai at {sessions} sessions: {ratios}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
