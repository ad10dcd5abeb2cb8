"""``molt-train serve``: the OpenAI/Anthropic session server in front of a model, for evaluators and external harnesses.

    molt-train serve --model DIR [--engine hf|vllm] [--host 127.0.0.1] [--port 8000]

Open a session with ``POST /sessions`` (→ ``session_id``, ``base_url`` for the OpenAI SDK, ``session_url`` for the
Anthropic SDK), talk to it on either wire, read its token-exact segments from ``GET /sessions/{id}/trajectory`` and
drop it with ``DELETE /sessions/{id}``.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Sequence
from typing import Any

from molt_envs import SamplingParams
from molt_envs.sessions.server import SessionServer

ENGINES = ("hf", "vllm")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="molt-train serve", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a transformers model directory (weights + tokenizer)")
    parser.add_argument("--engine", default="hf", choices=ENGINES)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port (printed at start)")
    parser.add_argument("--device", default="cpu", help="hf engine: torch device")
    parser.add_argument(
        "--gpu-memory-utilization", type=float, default=0.9, help="vllm engine: share of the GPU it may take"
    )
    parser.add_argument(
        "--max-length", type=int, default=None, help="context limit per session (default: the model's max positions)"
    )
    parser.add_argument("--temperature", type=float, default=1.0, help="default when a request sets none")
    parser.add_argument("--max-tokens", type=int, default=256, help="default when a request sets none")
    parser.add_argument("--model-name", default="policy", help="the model name replies carry")
    parser.add_argument(
        "--session-ttl",
        type=float,
        default=3600.0,
        help="seconds an unused session (and its trajectory) is kept before it is dropped",
    )
    args = parser.parse_args(argv)
    try:
        params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens)
    except ValueError as exc:
        parser.error(str(exc))
    return asyncio.run(_serve(args, params))


def _engine(args: argparse.Namespace) -> Any:
    """The engine over ``--model``; vLLM is built on the serving loop (its engine lives on that loop)."""
    if args.engine == "vllm":
        from molt_train.config.engine import VLLMConfig
        from molt_train.engines.vllm import VLLMEngine

        return VLLMEngine(args.model, VLLMConfig(gpu_memory_utilization=args.gpu_memory_utilization))
    from molt_train.engines.hf import HFEngine

    return HFEngine.from_pretrained(args.model, device=args.device)


async def _serve(args: argparse.Namespace, params: SamplingParams) -> int:
    try:
        engine = _engine(args)
    except (OSError, ValueError, ImportError) as exc:
        print(f"molt-train serve: cannot load a model from --model {args.model!r}: {exc}", file=sys.stderr)
        return 2
    server = SessionServer(
        engine,
        engine.processor,  # the tokenizer, or a vision model's processor (image parts are then served)
        host=args.host,
        port=args.port,
        model_name=args.model_name,
        params=params,
        max_length=args.max_length,
        session_ttl_s=args.session_ttl,
    )
    try:
        return await _run(server, args.model)
    finally:
        if hasattr(engine, "shutdown"):  # vllm: its engine-core process
            engine.shutdown()


async def _run(server: SessionServer, model: str) -> int:
    try:
        url = await server.start()
    except OSError as exc:
        print(f"molt-train serve: {exc}", file=sys.stderr)
        return 2
    print(f"molt session server on {url} serving {model}; open a session with POST {url}/sessions", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop()
    return 0
