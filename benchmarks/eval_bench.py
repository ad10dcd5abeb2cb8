"""What ``molt-env eval`` costs beyond the model calls it makes: samples/s against ``molt-train serve`` on a tiny
model, next to a plain loop of SDK calls doing the same requests, at 1, 16 and 64 concurrent samples.

One ``molt-train serve`` process (hf engine, CPU, the tiny Qwen2 model of the tests, built from scratch) serves both.
Per sample both sides make the same three requests: ``POST /sessions`` (the sample's sampling parameters and seed),
one OpenAI chat completion through ``openai.AsyncOpenAI`` on the session's URL, ``DELETE`` the session. The eval side
is the real ``evaluate()`` with ``EndpointPolicy`` on ``molt/arith-v1`` (grading, the record, its append to
``samples.jsonl``, the summary and report at the end); the plain side only makes the calls, with an
``asyncio.Semaphore`` for the concurrency. Each side's clock starts before it makes its HTTP clients. Before the
timed runs, one untimed run of each side per level (the warm-up: connections, first calls, matplotlib's import) is
recorded request by request, and the bench stops unless both sent the same requests (method, path, JSON body: the
same sessions, messages, sampling parameters, seeds and ``n``), the eval's one ``GET /health`` probe aside. The two
then alternate, ``--repeats`` times per level; the table keeps each side's best run, the lines above it print every
run and the load average. Overhead ratio = plain samples/s / eval samples/s (goal <= 1.1).

``molt/arith-v1`` is single-turn, so ``molt-env eval`` would send a prompt's 4 samples as one request with ``n=4``;
by default the eval side is held to one request per sample (``EndpointPolicy(use_n=False)``) so both sides make the
same requests. ``--use-n`` measures the ``n`` design instead: the eval with one request with ``n`` per prompt, and the
plain loop making that same request (one session, one completion with ``n=4``, one delete per prompt).

    .venv/bin/python benchmarks/eval_bench.py [--levels 1 16 64] [--samples 128] [--repeats 2] [--use-n]

``--smoke`` (what ``make test`` runs, tests/test_benchmarks_smoke.py): 8 samples at 1 and 4 concurrent, one repeat, 2
new tokens: the request check, both sides and the ratio in seconds, figures meaningless.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GSM8K = ROOT / "molt_envs" / "envs" / "data" / "gsm8k" / "train.jsonl"
ENV_ID = "molt/arith-v1"


def build_model(out: Path) -> Path:
    from molt_train.models.tiny import build_tiny_model, save_tiny, train_tokenizer

    with GSM8K.open() as f:
        rows = [json.loads(line) for _, line in zip(range(1500), f, strict=False)]
    tokenizer = train_tokenizer([r["question"] + "\n" + r["answer"] for r in rows], vocab_size=1024)
    return save_tiny(build_tiny_model(tokenizer, seed=0), tokenizer, out)


def serve(model: Path) -> tuple[str, subprocess.Popen]:
    molt_train = str(Path(sys.executable).with_name("molt-train"))
    proc = subprocess.Popen(
        [molt_train, "serve", "--model", str(model), "--port", "0"], stdout=subprocess.PIPE, text=True
    )
    for line in proc.stdout:
        match = re.search(r"session server on (http://\S+) ", line)
        if match:
            return match[1], proc
    raise RuntimeError("molt-train serve exited before serving")


async def plain_loop(url: str, tasks, settings, concurrency: int, use_n: bool = False) -> float:
    """The same requests as the eval's, with nothing around them; returns the wall seconds."""
    import httpx
    from openai import AsyncOpenAI

    from env_registry.evaluation.tasks import sample_seed

    task = tasks[0]
    jobs = [(p, s) for p in range(len(task.rows)) for s in ([0] if use_n else range(settings.n))]
    semaphore = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=1024)
    start = time.perf_counter()  # the clients' making counts, as the eval's policy.start() does
    async with (
        httpx.AsyncClient(base_url=url, limits=limits, timeout=600) as http,
        AsyncOpenAI(base_url=f"{url}/v1", api_key="EMPTY", max_retries=4, timeout=600) as client,
    ):

        async def one(prompt_id: int, sample: int) -> None:
            async with semaphore:
                seed = sample_seed(settings.seed, task.env_id, prompt_id, sample)
                params = {"temperature": settings.temperature, "top_p": settings.top_p,
                          "max_tokens": settings.max_new_tokens, "seed": seed}  # fmt: skip
                session = (await http.post("/sessions", json={"sampling_params": params})).json()
                await client.with_options(base_url=session["base_url"]).chat.completions.create(
                    model="policy",
                    messages=task.rows[prompt_id]["prompt"],
                    temperature=settings.temperature,
                    top_p=settings.top_p,
                    max_tokens=settings.max_new_tokens,
                    seed=seed,
                    **({"n": settings.n} if use_n else {}),
                )
                await http.delete(f"/sessions/{session['session_id']}")

        await asyncio.gather(*(one(p, s) for p, s in jobs))
    return time.perf_counter() - start


async def eval_run(url: str, tasks, settings, use_n: bool = False) -> tuple[float, float]:
    """One ``evaluate()`` into a fresh directory; returns its wall seconds and, of those, the sampling's (the rest:
    the store's set-up and close, ``summary.json``, ``report.md`` and ``report.png``)."""
    from env_registry.evaluation import evaluate
    from env_registry.evaluation.endpoint import EndpointPolicy

    with tempfile.TemporaryDirectory(prefix="eval-bench-") as out:
        start = time.perf_counter()
        summary = await evaluate(tasks, EndpointPolicy(f"{url}/v1", "policy", use_n=use_n), settings, out)
        wall = time.perf_counter() - start
    if summary["failures"]:
        raise RuntimeError(f"the eval had failures: {summary['failures']}")
    return wall, summary["wall_s_this_run"]


@contextlib.contextmanager
def recording() -> Iterator[Counter]:
    """Every HTTP request sent in this process, as ``(method, path, JSON body)`` with session IDs blanked, counted:
    ``httpx.AsyncClient.send`` wrapped, and ``httpx2``'s, which the openai SDK sends with from its 3.x releases."""
    import httpx

    classes = [httpx.AsyncClient]
    with contextlib.suppress(ImportError):
        import httpx2

        classes.append(httpx2.AsyncClient)
    sent: Counter = Counter()

    def wrap(original):
        async def send(self, request, **kwargs):
            path = re.sub(r"/(sessions|s)/[^/]+", r"/\1/ID", request.url.path)
            body = json.dumps(json.loads(request.content), sort_keys=True) if request.content else ""
            sent[(request.method, path, body)] += 1
            return await original(self, request, **kwargs)

        return send

    originals = [(cls, cls.send) for cls in classes]
    for cls, original in originals:
        cls.send = wrap(original)
    try:
        yield sent
    finally:
        for cls, original in originals:
            cls.send = original


def check_same_requests(url: str, tasks, settings, level: int, use_n: bool) -> None:
    """One untimed run of each side (also the warm-up: connections, first calls, the report's imports), recorded;
    the eval may add only its one ``GET /health`` probe.

    Raises:
        RuntimeError: the two sides sent different requests, naming the first few that differ.
    """
    with recording() as plain:
        asyncio.run(plain_loop(url, tasks, settings, level, use_n))
    with recording() as evals:
        asyncio.run(eval_run(url, tasks, settings, use_n))
    evals.pop(("GET", "/health", ""), None)
    if plain != evals:
        only_plain, only_eval = list((plain - evals).items())[:3], list((evals - plain).items())[:3]
        raise RuntimeError(f"the two sides sent different requests: plain only {only_plain}, eval only {only_eval}")
    print(f"concurrency {level}: both sides sent the same {sum(plain.values())} requests", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--samples", type=int, default=128, help="samples per run (prompts x 4)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--use-n", action="store_true", help="both sides: one request with n per prompt")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, seconds: the code path, not the figures")
    args = parser.parse_args()
    if args.smoke:
        args.levels, args.samples, args.repeats, args.max_new_tokens = [1, 4], 8, 1, 2

    from env_registry.evaluation import EvalSettings, load_tasks
    from env_registry.mix import parse_env_mix

    with tempfile.TemporaryDirectory(prefix="eval-bench-model-") as tmp:
        url, proc = serve(build_model(Path(tmp) / "hf"))
        try:
            tasks = load_tasks(parse_env_mix([ENV_ID]), "test", args.samples // 4)
            rows = []
            for level in args.levels:
                settings = EvalSettings(n=4, max_new_tokens=args.max_new_tokens, concurrency=level, temperature=1.0)
                check_same_requests(url, tasks, settings, level, args.use_n)
                plain, evals = [], []
                for _ in range(args.repeats):
                    plain.append(asyncio.run(plain_loop(url, tasks, settings, level, args.use_n)))
                    evals.append(asyncio.run(eval_run(url, tasks, settings, args.use_n)))
                n = len(tasks[0].rows) * settings.n
                best = min(evals)
                row = (level, n, n / min(plain), n / best[0], best[0] / min(plain))
                rows.append(row)
                runs = ", ".join(f"{p:.2f}/{e:.2f}" for p, (e, _) in zip(plain, evals, strict=True))
                print(
                    f"concurrency {level}: plain {row[2]:.1f}/s, eval {row[3]:.1f}/s, ratio {row[4]:.3f}; best eval "
                    f"{best[0]:.2f} s = sampling {best[1]:.2f} + outputs {best[0] - best[1]:.2f} (runs plain/eval s: "
                    f"{runs}; load average {' '.join(f'{x:.1f}' for x in os.getloadavg())})",
                    flush=True,
                )
        finally:
            proc.terminate()
            proc.wait(30)
    print("\n| concurrency | samples | plain SDK loop (samples/s) | molt-env eval (samples/s) | overhead ratio |")
    print("|---|---|---|---|---|")
    for level, n, plain_rate, eval_rate, ratio in rows:
        print(f"| {level} | {n} | {plain_rate:.1f} | {eval_rate:.1f} | {ratio:.3f} |")


if __name__ == "__main__":
    main()
