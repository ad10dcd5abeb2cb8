"""``molt-env eval``: flags, the policy they pick, progress, and the result files.

molt-env eval molt/arith-v1 --model runs/rl/hf -n 8 --k 1,4,8 --split test --out runs/eval-arith
molt-env eval rg/countdown-v1 --base-url http://127.0.0.1:8000/v1 --model-name policy -n 4 --concurrency 64
molt-env eval molt/chat-gsm8k-anthropic-v1 --base-url http://host:port --wire anthropic ...
molt-env eval --env molt/arith-v1:3 --env molt/gsm8k-v1:1 --base-url ... --out DIR   # a weighted mix
molt-env eval --reverify DIR [ns/name-v1@2.0.0]      # re-grade DIR's samples (with another version of an env)
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from env_registry.errors import Error

DEFAULT_CONCURRENCY = 16
THREAD_PREFIX = "molt-eval-worker"


def add_parser(sub: Any) -> None:
    """The ``eval`` subcommand of ``molt-env``."""
    p = sub.add_parser(
        "eval",
        help="pass@k of env IDs against a local checkpoint or any OpenAI/Anthropic-compatible endpoint",
        description="pass@k, rewards, lengths and failures of env IDs against a local checkpoint or any "
        "OpenAI/Anthropic-compatible endpoint; resumable output in --out.",
    )
    p.add_argument("env_ids", nargs="*", metavar="ENV_ID", help="env IDs to evaluate (same as --env ID)")
    p.add_argument("--env", action="append", default=[], metavar="ID[:WEIGHT]", help="an env of the mix (repeat)")
    model = p.add_argument_group("policy (one of --model, --base-url)")
    model.add_argument("--model", metavar="DIR", help="a local transformers checkpoint, served by `molt-train serve`")
    model.add_argument("--engine", choices=["hf", "vllm"], default="hf", help="engine serving --model (vllm: GPU)")
    model.add_argument("--device", help="device of the hf engine serving --model (default: the server's)")
    model.add_argument("--base-url", help="an OpenAI (…/v1) or Anthropic (root) endpoint, e.g. molt-train serve")
    model.add_argument("--model-name", default="policy", help="the model name sent in every request")
    model.add_argument("--wire", choices=["openai", "anthropic"], default="openai", help="SDK that drives Env IDs")
    model.add_argument("--api-key", help="endpoint key (default: $OPENAI_API_KEY / $ANTHROPIC_API_KEY, else EMPTY)")
    model.add_argument("--max-retries", type=int, default=4, help="retries of 429/5xx/connection errors (back-off)")
    rows = p.add_argument_group("rows and sampling")
    rows.add_argument("--split", default="test")
    rows.add_argument("--max-samples", type=int, metavar="N", help="the first N rows of the split, in order")
    rows.add_argument("-n", type=int, default=1, help="samples per prompt")
    rows.add_argument("--k", metavar="K[,K...]", help="pass@k for these k (default: every k from 1 to n)")
    rows.add_argument("--temperature", type=float, help="default: 0 (greedy) when -n 1, else 1.0")
    rows.add_argument("--top-p", type=float, default=1.0)
    rows.add_argument("--max-new-tokens", type=int, default=256, help="per model call")
    rows.add_argument("--seed", type=int, default=0, help="every sample's seed derives from it")
    rows.add_argument("--pass-threshold", type=float, help="reward that counts as a pass (default: top of range)")
    run = p.add_argument_group("running")
    run.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY, help="samples in flight at once")
    run.add_argument("--timeout", type=float, default=600.0, help="seconds one sample may take")
    run.add_argument("--max-length", type=int, default=32768, help="context budget told to ChatAgents")
    run.add_argument("--out", metavar="DIR", help="eval directory (samples.jsonl, summary.json, report.md/png)")
    run.add_argument(
        "--reverify",
        metavar="DIR",
        help="re-grade DIR's samples with the current graders, no model; env IDs given (ns/name-vN@VERSION) replace "
        "the recorded env of the same ID; the episodes whose reward changed go to DIR/reverify_diff.json",
    )
    run.add_argument("--quiet", action="store_true", help="no progress lines")
    pub = p.add_argument_group("publishing")
    pub.add_argument(
        "--publish-results", action="store_true", help="upload summary.json (with --out, its episodes) to a registry"
    )
    pub.add_argument("--registry", help="registry server URL (default: $MOLT_REGISTRY)")
    pub.add_argument("--token", default=os.environ.get("MOLT_TOKEN"), help="registry token (default: $MOLT_TOKEN)")
    p.set_defaults(fn=cmd_eval)


def parse_ks(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(k) for k in text.split(",") if k.strip()]
    except ValueError:
        raise Error(f"--k {text!r} must be comma-separated integers, e.g. --k 1,4,8") from None


def cmd_eval(args: argparse.Namespace) -> int:
    try:
        rc = _eval(args)
    except Error as exc:
        print(f"molt-env eval: {exc}", file=sys.stderr)
        rc = 2
    leave_stuck_threads(rc)
    return rc


def _eval(args: argparse.Namespace) -> int:
    if args.reverify:
        from env_registry.evaluation.reverify import reverify

        summary = run_async(reverify(args.reverify, args.concurrency, [*args.env_ids, *args.env]))
        print(f"re-graded {summary['num_samples']} samples ({summary['reverified_changed']} rewards changed)")
        if summary["reverified_changed"]:
            print(f"see them with `molt-env view {args.reverify}`: reverify_diff.json gives each one's /episodes/<n>")
        _print_headline(summary)
        print(f"wrote {os.path.join(args.reverify, 'summary.reverified.json')} and reverify_diff.json")
        return 0
    from env_registry.evaluation.tasks import EvalSettings, load_tasks
    from env_registry.mix import parse_env_mix
    from env_registry.registry import registry

    if bool(args.model) == bool(args.base_url):
        raise Error("give exactly one policy: --model DIR (a local checkpoint) or --base-url URL (an endpoint)")
    if args.publish_results and not (args.registry or os.environ.get("MOLT_REGISTRY", "")).startswith("http"):
        raise Error("--publish-results needs a registry server: --registry http(s)://host:port (or $MOLT_REGISTRY)")
    settings = EvalSettings(
        split=args.split,
        max_samples=args.max_samples,
        n=args.n,
        ks=parse_ks(args.k),
        temperature=args.temperature,
        top_p=args.top_p,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
        concurrency=args.concurrency,
        timeout_s=args.timeout,
        pass_threshold=args.pass_threshold,
    )
    from env_registry.evaluation.passk import resolve_ks

    resolve_ks(settings.ks, settings.n)  # k > n fails here, before anything starts
    if args.model:
        from env_registry.evaluation.local_model import check_checkpoint

        check_checkpoint(args.model)
    entries = parse_env_mix([*args.env_ids, *args.env], resolve=registry.spec)
    tasks = load_tasks(entries, settings.split, settings.max_samples)
    summary = run_async(_run(args, tasks, settings))
    _print_headline(summary)
    if args.out:
        print(f"wrote {args.out}/summary.json, samples.jsonl, report.md, report.png")
    else:
        print(json.dumps(summary, indent=2, default=str))
    if args.publish_results:
        _publish(args, summary)
    return 0


async def _run(args: argparse.Namespace, tasks: list, settings: Any) -> dict[str, Any]:
    from env_registry.evaluation.endpoint import EndpointPolicy
    from env_registry.evaluation.run import evaluate

    api_key = args.api_key or os.environ.get("OPENAI_API_KEY" if args.wire == "openai" else "ANTHROPIC_API_KEY")
    progress = None if args.quiet else Progress(sum(len(t.rows) for t in tasks) * settings.n)

    def policy_for(base_url: str, name: str | None = None) -> EndpointPolicy:
        policy = EndpointPolicy(
            base_url,
            args.model_name,
            wire=args.wire,
            api_key=api_key or "EMPTY",
            max_retries=args.max_retries,
            request_timeout_s=args.timeout,
            max_length=args.max_length,
        )
        if name:
            policy.name = name
        return policy

    if args.base_url:
        return await evaluate(tasks, policy_for(args.base_url), settings, args.out, progress)
    from env_registry.evaluation.local_model import served

    extra = ["--model-name", args.model_name, "--max-tokens", str(settings.max_new_tokens)]
    if args.device:
        extra += ["--device", args.device]
    async with served(args.model, args.engine, extra) as url:
        name = f"{args.engine}:{os.path.abspath(args.model)}"
        return await evaluate(tasks, policy_for(url, name), settings, args.out, progress)


class Progress:
    """A progress line on stderr at most every 5 s (and at the end)."""

    def __init__(self, total: int) -> None:
        self.total, self.done, self.failed = total, 0, 0
        self.start = self.last = time.monotonic()

    def __call__(self, record: dict[str, Any]) -> None:
        self.done += 1
        self.failed += record["failure"] is not None and not record["completed"]
        now = time.monotonic()
        if now - self.last >= 5 or self.done == self.total:
            self.last = now
            rate = self.done / max(now - self.start, 1e-9)
            print(
                f"eval: {self.done}/{self.total} new samples, {self.failed} failed, {rate:.2f} samples/s",
                file=sys.stderr,
                flush=True,
            )


def _print_headline(summary: dict[str, Any]) -> None:
    passes = "  ".join(f"{k}={v:.4f}" for k, v in summary.items() if k.startswith("pass@"))
    failures = ", ".join(f"{r}: {c}" for r, c in summary["failures"].items()) or "none"
    envs = summary["env_id"] if isinstance(summary["env_id"], str) else " + ".join(summary["env_id"])
    print(
        f"{envs}: {summary['num_prompts']} prompts x n={summary['n']}  {passes}  mean_reward={summary['mean_reward']:.4f}"
    )
    print(f"failures: {failures}")


def _publish(args: argparse.Namespace, summary: dict[str, Any]) -> None:
    from env_registry.evaluation.summary import env_summaries
    from env_registry.store.client import RegistryClient

    client = RegistryClient(args.registry or os.environ["MOLT_REGISTRY"], args.token)
    for one in env_summaries(summary):
        if not (one.get("package") and one.get("package_version")):
            raise Error(
                f"{one['env_id']} is registered at run time, not by a package: a registry stores eval results per "
                "package release, so there is nothing to publish them to"
            )
        record = client.publish_eval(one["package"], one["package_version"], one)
        print(f"published the eval of {one['env_id']} to {client.url} ({one['package']} {one['package_version']})")
        samples = os.path.join(args.out, "samples.jsonl") if args.out else None
        if samples and os.path.isfile(samples):
            with _env_samples(samples, one["env_id"], isinstance(summary["env_id"], str)) as path:
                client.publish_eval_samples(one["package"], one["package_version"], record.id, path)
            print(f"published its episodes: {client.url}/evals/{record.id}/")


@contextlib.contextmanager
def _env_samples(samples: str, env_id: str, alone: bool) -> Iterator[Path]:
    """The eval's ``samples.jsonl`` as is when it evaluated one env; else a temporary file of ``env_id``'s lines."""
    if alone:
        yield Path(samples)
        return
    with tempfile.TemporaryDirectory(prefix="molt-eval-samples-") as tmp:
        path = Path(tmp) / "samples.jsonl"
        with open(samples, "rb") as src, path.open("wb") as out:
            for line in src:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if isinstance(record, dict) and record.get("env_id") == env_id:
                    out.write(line if line.endswith(b"\n") else line + b"\n")
        yield path


def run_async(coro: Any) -> Any:
    """``asyncio.run``, except that a worker thread still stuck at the end (a grader that hung in
    ``asyncio.to_thread``: its sample was timed out and recorded) is not waited for: after everything is written,
    the process exits without joining it (``asyncio.run`` and the interpreter's exit would wait forever)."""
    loop = asyncio.new_event_loop()
    executor = ThreadPoolExecutor(thread_name_prefix=THREAD_PREFIX)
    loop.set_default_executor(executor)
    try:
        return loop.run_until_complete(coro)
    finally:
        try:
            for task in asyncio.all_tasks(loop):
                task.cancel()
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()
            executor.shutdown(wait=False, cancel_futures=True)


def leave_stuck_threads(rc: int, grace_s: float = 2.0) -> None:
    deadline = time.monotonic() + grace_s
    for thread in [t for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX)]:
        thread.join(max(0.0, deadline - time.monotonic()))
    stuck = [t.name for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX) and t.is_alive()]
    if stuck:
        print(
            f"molt-env eval: {len(stuck)} worker thread(s) still stuck (a hung grader); exiting without them",
            file=sys.stderr,
        )
        sys.stdout.flush()
        sys.stderr.flush()
        atexit._run_exitfuncs()
        os._exit(rc)
