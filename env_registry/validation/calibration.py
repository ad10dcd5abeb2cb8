"""Difficulty calibration at publish: the publish gate's reference eval of each env of a package.

The registry operator fixes a reference policy (``molt-env serve --validate --reference-endpoint URL
--reference-model-name NAME --reference-n N --reference-prompts P``): an OpenAI-compatible endpoint, or a checkpoint
(``--reference-checkpoint PATH``, served by the operator's process as ``molt-train serve``, see ``checkpoint``; the
figures are then stamped with its path and content hash, not the endpoint's address). After an env's
jailed checks all passed, the same jailed worker plays its first ``P`` prompts (of ``test``, else its first split) ``N``
times each through ``env_registry.evaluation.evaluate`` (the very loop of ``molt-env eval``, with the same seeds), and
reports pass@k for k = 1..N, the mean reward, a reward histogram, each prompt's passes and mean reward (by prompt
ID: the hub's diff between versions compares them), and the cost per episode
(turns, tokens, seconds, sandbox calls where the env reports them in ``info``), stamped with the reference policy
and the env's spec hash.

Where it runs, and why: the package's code is untrusted, so its episodes run only in the jail, inside the eval loop
there. The jail's network namespace is its own (loopback only): it cannot reach the endpoint, even one on the host's
loopback. So the host (``HostForwarder``) listens on a unix socket in a directory bound read-only into the jail, and
pipes each connection to the endpoint's host and port, nothing else; in the jail (``JailForwarder``) a listener on
the jail's own loopback pipes to that socket, and the eval's ``EndpointPolicy`` talks to it. The jail reaches exactly
one host service, the operator's endpoint; the eval's model calls are ordinary HTTP through that pipe. (Running the
eval on the host against an env served from the jail would need a session protocol for every env kind; a ChatAgent
already makes its own SDK calls from inside the env, so only a pipe works for all kinds alike.)

A hostile package runs in the worker's process and can forge its own figures (as it can its own checks): the host
keeps only bounded numbers (``ValidationReport.add_calibration``), and the figures calibrate honest envs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import tempfile
import threading
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import urlsplit

from env_registry.errors import Error

JAIL_SOCKET_DIR = "/run/molt-reference"
SOCKET_NAME = "endpoint.sock"
HISTOGRAM_BINS = 10
CHUNK = 1 << 16


@dataclass
class Reference:
    """The operator's reference policy and how much of each env it plays."""

    endpoint: str  # an OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1
    model_name: str = "default"
    n: int = 4
    prompts: int = 8
    max_new_tokens: int = 256
    timeout_s: float = 120.0
    checkpoint: str = ""  # served from a checkpoint: "<path> sha256:<hex>" (``checkpoint.checkpoint_stamp``)

    def __post_init__(self) -> None:
        parts = urlsplit(self.endpoint)
        if parts.scheme != "http" or not parts.hostname:
            raise Error(f"--reference-endpoint {self.endpoint!r} must be an http:// URL, e.g. http://127.0.0.1:8000/v1")
        if self.n < 1 or self.prompts < 1:
            raise Error("--reference-n and --reference-prompts must be >= 1")

    @property
    def label(self) -> str:
        """What the card is stamped with: the checkpoint's path and hash, else the endpoint and model name."""
        if self.checkpoint:
            return f"checkpoint {self.checkpoint}"
        return f"{self.endpoint.rstrip('/')} model={self.model_name}"

    def address(self) -> tuple[str, int]:
        parts = urlsplit(self.endpoint)
        return parts.hostname or "", parts.port or 80

    def jail_url(self, port: int) -> str:
        """The endpoint's base URL as the jail reaches it (its own loopback, through the forwarders)."""
        return f"http://127.0.0.1:{port}{urlsplit(self.endpoint).path}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def _splice(local: tuple[asyncio.StreamReader, asyncio.StreamWriter], connect) -> None:
    reader, writer = local
    try:
        up_reader, up_writer = await connect()
    except OSError:
        writer.close()
        return
    await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))


class HostForwarder:
    """On the host: a unix socket (in a fresh directory, to bind into the jail) piped to the endpoint's address."""

    def __init__(self, reference: Reference) -> None:
        self.host, self.port = reference.address()
        self.directory = tempfile.mkdtemp(prefix="molt-reference-")
        os.chmod(self.directory, 0o755)
        self.path = os.path.join(self.directory, SOCKET_NAME)
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="reference-forwarder", daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def handle(reader, writer) -> None:
            await _splice((reader, writer), lambda: asyncio.open_connection(self.host, self.port))

        self._server = self._loop.run_until_complete(asyncio.start_unix_server(handle, self.path))
        os.chmod(self.path, 0o666)  # the jail's unprivileged uid connects
        self._ready.set()
        self._loop.run_forever()

    def __enter__(self) -> HostForwarder:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        def stop() -> None:
            self._server.close()
            self._loop.stop()

        self._loop.call_soon_threadsafe(stop)
        self._thread.join(10)
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        with contextlib.suppress(OSError):
            os.rmdir(self.directory)


@contextlib.asynccontextmanager
async def jail_forwarder(socket_path: str):
    """In the jail: a listener on the jail's own loopback piped to the host's unix socket; yields its port."""

    async def handle(reader, writer) -> None:
        await _splice((reader, writer), lambda: asyncio.open_unix_connection(socket_path))

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


async def reference_eval(env_id: str, reference: Reference, base_url: str) -> dict[str, Any]:
    """The reference eval of one env (in the jail): its calibration figures."""
    from env_registry.evaluation.endpoint import EndpointPolicy
    from env_registry.evaluation.run import evaluate
    from env_registry.evaluation.tasks import EvalSettings, load_tasks
    from env_registry.mix import parse_env_mix
    from env_registry.registry import registry

    spec = registry.spec(env_id)
    split = "test" if "test" in spec.datasets else next(iter(spec.datasets))
    settings = EvalSettings(
        split=split,
        max_samples=reference.prompts,
        n=reference.n,
        max_new_tokens=reference.max_new_tokens,
        concurrency=4,
        timeout_s=reference.timeout_s,
    )
    tasks = load_tasks(parse_env_mix([env_id], resolve=registry.spec), split, reference.prompts)
    policy = EndpointPolicy(base_url, reference.model_name, request_timeout_s=reference.timeout_s, max_retries=1)
    records: list[dict[str, Any]] = []
    summary = await evaluate(tasks, policy, settings, None, records.append, report=False)
    return calibration_of(summary, records, reference.label)


def calibration_of(summary: dict[str, Any], records: list[dict[str, Any]], policy: str) -> dict[str, Any]:
    """An eval of one env (its ``summary.json`` and samples) as the figures the env card shows.

    ``badge``: ``already solved`` when every prompt passed on every sample, ``nothing to learn`` when none did,
    ``all or nothing`` when each prompt did one or the other (no prompt gives a learning signal within its group).
    """
    n = summary["n"]
    lo, hi = summary["reward_range"]
    threshold = summary["pass_threshold"]
    passes: dict[int, int] = defaultdict(int)
    for r in records:
        passes[r["prompt_id"]] += bool(
            r.get("completed") and r["reward"] is not None and r["reward"] >= threshold - 1e-9
        )
    prompt_ids = sorted({r["prompt_id"] for r in records})
    per_prompt = [passes[p] for p in prompt_ids]
    rewards_of: dict[int, list[float]] = defaultdict(list)  # an episode that did not complete counts as the floor
    for r in records:
        rewards_of[r["prompt_id"]].append(r["reward"] if r.get("completed") and r["reward"] is not None else lo)
    badge = None
    if per_prompt and all(c == n for c in per_prompt):
        badge = "already solved"
    elif per_prompt and all(c == 0 for c in per_prompt):
        badge = "nothing to learn"
    elif per_prompt and all(c in (0, n) for c in per_prompt):
        badge = "all or nothing"
    rewards = [r["reward"] if r.get("completed") and r["reward"] is not None else lo for r in records]
    width = (hi - lo) / HISTOGRAM_BINS if hi > lo else 1.0
    counts = [0] * HISTOGRAM_BINS
    for value in rewards:
        counts[min(HISTOGRAM_BINS - 1, max(0, int((value - lo) / width)))] += 1
    sandbox = [
        r["info"]["sandbox_calls"] for r in records if isinstance((r.get("info") or {}).get("sandbox_calls"), int)
    ]
    latency = summary.get("latency_s") or {}
    return {
        "policy": policy,
        "spec_hash": summary["spec_hash"],
        "package_version": summary["package_version"],
        "split": summary["split"],
        "n": n,
        "num_prompts": summary["num_prompts"],
        "num_samples": summary["num_samples"],
        "pass_at_k": [summary[f"pass@{k}"] for k in range(1, n + 1)],
        "mean_reward": summary["mean_reward"],
        "reward_range": [lo, hi],
        "reward_histogram": counts,
        "passes_per_prompt": per_prompt,
        "prompt_ids": prompt_ids,
        "reward_per_prompt": [sum(rewards_of[p]) / len(rewards_of[p]) for p in prompt_ids],
        "badge": badge,
        "failures": summary["failures"],
        "turns_mean": summary["turns_mean"],
        "prompt_tokens_mean": summary["prompt_tokens_mean"],
        "completion_tokens_mean": summary["completion_tokens_mean"],
        "seconds_mean": latency.get("mean"),
        "sandbox_calls_mean": sum(sandbox) / len(sandbox) if sandbox else None,
        "finished": summary.get("finished"),
    }


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _short(value: Any, limit: int = 300) -> str | None:
    return value[:limit] if isinstance(value, str) else None


def sanitize(data: Any) -> dict[str, Any] | None:
    """The calibration as the jailed worker sent it, reduced to bounded numbers and short strings (None: unusable)."""
    if not isinstance(data, dict):
        return None
    if isinstance(data.get("error"), str):
        return {"error": data["error"][:2000], "policy": _short(data.get("policy"))}
    n = data.get("n")
    if not isinstance(n, int) or not 1 <= n <= 1024:
        return None

    def numbers(key: str, length: int) -> list[float | None]:
        values = data.get(key)
        return [_number(v) for v in values[:length]] if isinstance(values, list) else []

    kept: dict[str, Any] = {
        "policy": _short(data.get("policy")),
        "spec_hash": _short(data.get("spec_hash"), 128),
        "package_version": _short(data.get("package_version"), 128),
        "split": _short(data.get("split"), 64),
        "n": n,
        "pass_at_k": numbers("pass_at_k", n),
        "reward_range": numbers("reward_range", 2),
        "reward_histogram": [int(v) for v in numbers("reward_histogram", HISTOGRAM_BINS) if v is not None],
        "passes_per_prompt": [int(v) for v in numbers("passes_per_prompt", 4096) if v is not None],
        "prompt_ids": [int(v) for v in numbers("prompt_ids", 4096) if v is not None],
        "reward_per_prompt": numbers("reward_per_prompt", 4096),
        "badge": data.get("badge")
        if data.get("badge") in ("already solved", "nothing to learn", "all or nothing")
        else None,
        "failures": {
            str(k)[:64]: int(v)
            for k, v in list((data.get("failures") or {}).items())[:32]
            if isinstance(v, int) and not isinstance(v, bool)
        }
        if isinstance(data.get("failures"), dict)
        else {},
        "finished": _short(data.get("finished"), 64),
    }
    for key in ("num_prompts", "num_samples"):
        kept[key] = int(data[key]) if isinstance(data.get(key), int) and not isinstance(data[key], bool) else None
    for key in (
        "mean_reward",
        "turns_mean",
        "prompt_tokens_mean",
        "completion_tokens_mean",
        "seconds_mean",
        "sandbox_calls_mean",
    ):
        kept[key] = _number(data.get(key))
    return kept


def curve_points(pass_at_k: list[Any], width: int = 240, height: int = 120, pad: int = 24) -> list[tuple[float, float]]:
    """The pass@k curve's points in an SVG box (k on x from 1 to n, pass@k on y from 0 at the bottom to 1)."""
    n = len(pass_at_k)
    points = []
    for i, value in enumerate(pass_at_k):
        x = pad + (width - 2 * pad) * (i / (n - 1) if n > 1 else 0.5)
        y = height - pad - (height - 2 * pad) * (value if isinstance(value, int | float) else 0.0)
        points.append((round(x, 1), round(y, 1)))
    return points


@contextlib.contextmanager
def host_side(reference: Reference | None) -> Iterator[HostForwarder | None]:
    """The host forwarder while the jail runs (None without a reference policy)."""
    if reference is None:
        yield None
        return
    with HostForwarder(reference) as forwarder:
        yield forwarder


def add_reference_flags(parser: argparse.ArgumentParser, gate: bool = False) -> None:
    """The reference policy's flags (``molt-env serve --validate`` passes them on to the gate; ``gate``: the gate's
    own parser, which also takes the stamp of a checkpoint its server serves)."""
    policy = parser.add_mutually_exclusive_group()
    policy.add_argument(
        "--reference-endpoint",
        metavar="URL",
        help="difficulty calibration: an OpenAI-compatible endpoint (e.g. http://127.0.0.1:8000/v1) that plays each "
        "env whose checks passed, in the jail; its pass@k etc. are stored with the release and shown on the card",
    )
    policy.add_argument(
        "--reference-checkpoint",
        metavar="PATH",
        help="difficulty calibration by a Hugging Face checkpoint directory instead of an endpoint: this process "
        "serves it (molt-train serve) while it runs; the figures are stamped with its path and content hash",
    )
    parser.add_argument("--reference-model-name", help="the reference endpoint's model name (default: default)")
    parser.add_argument(
        "--reference-n", type=int, help=f"reference samples per prompt (pass@1..n; default {DEFAULTS['n']})"
    )
    parser.add_argument(
        "--reference-prompts", type=int, help=f"prompts the reference policy plays (default {DEFAULTS['prompts']})"
    )
    parser.add_argument(
        "--reference-max-new-tokens",
        type=int,
        help=f"the reference's max new tokens (default {DEFAULTS['max_new_tokens']})",
    )
    if gate:
        parser.add_argument("--reference-stamp", default="", help=argparse.SUPPRESS)  # a served checkpoint's


REFERENCE_FLAGS = ("endpoint", "model_name", "n", "prompts", "max_new_tokens")
DEFAULTS: dict[str, Any] = {"model_name": "default", "n": 4, "prompts": 8, "max_new_tokens": 256}


def _flag(name: str) -> str:
    return f"--reference-{name.replace('_', '-')}"


def given_reference_flags(args: argparse.Namespace) -> list[str]:
    """The reference flags given on the command line (a policy or its settings)."""
    names = ("endpoint", "checkpoint", "model_name", "n", "prompts", "max_new_tokens")
    return [_flag(name) for name in names if getattr(args, f"reference_{name}", None) is not None]


def reference_of(args: argparse.Namespace, endpoint: str | None = None, stamp: str = "") -> Reference | None:
    """The reference policy the flags name (None without ``--reference-endpoint`` or ``--reference-checkpoint``).

    Args:
        args: the parsed flags.
        endpoint: the URL a served ``--reference-checkpoint`` answers at (``reference_policy`` passes it).
        stamp: that checkpoint's stamp (``checkpoint.checkpoint_stamp``).

    Raises:
        Error: both policies, a setting without a policy (it would have no effect), ``--reference-model-name``
            with a checkpoint (its server serves any name), or a bad value; the message names the flag.
    """
    endpoint = endpoint or args.reference_endpoint
    checkpoint = getattr(args, "reference_checkpoint", None)
    stamp = stamp or getattr(args, "reference_stamp", "")
    if args.reference_endpoint and checkpoint:
        raise Error("give --reference-endpoint URL or --reference-checkpoint PATH, not both")
    if not endpoint and not checkpoint:
        settings = given_reference_flags(args)
        if settings:
            raise Error(
                f"{', '.join(settings)} set the reference policy's eval, but no policy is given: add "
                "--reference-endpoint URL or --reference-checkpoint PATH, or drop them"
            )
        return None
    if (checkpoint or stamp) and args.reference_model_name is not None:
        raise Error(
            f"--reference-model-name {args.reference_model_name!r} has no effect with a checkpoint (its server "
            "answers any model name); drop it"
        )
    if checkpoint and not endpoint:
        raise Error(f"--reference-checkpoint {checkpoint!r} is not served yet (reference_policy serves it)")
    given = {name: getattr(args, f"reference_{name}") for name in REFERENCE_FLAGS if name != "endpoint"}
    values = {name: DEFAULTS[name] if value is None else value for name, value in given.items()}
    return Reference(endpoint=endpoint, checkpoint=stamp, **values)


def check_reference_flags(args: argparse.Namespace) -> str:
    """Check the reference flags before anything starts; returns a ``--reference-checkpoint``'s stamp (else "").

    Raises:
        Error: as ``reference_of``, or the checkpoint path is no Hugging Face checkpoint (naming it).
    """
    checkpoint = getattr(args, "reference_checkpoint", None)
    if not checkpoint or args.reference_endpoint:
        reference_of(args)
        return ""
    from env_registry.validation.checkpoint import checkpoint_stamp

    stamp = checkpoint_stamp(checkpoint)
    reference_of(args, "http://127.0.0.1/v1", stamp)
    return stamp


@contextlib.contextmanager
def reference_policy(args: argparse.Namespace, stamp: str | None = None) -> Iterator[Reference | None]:
    """The reference policy of the flags while the block runs: with ``--reference-checkpoint``, this process serves
    the checkpoint (``checkpoint.ServedCheckpoint``) and stops it when the block ends. Bad flags, a path that is no
    checkpoint, or one that does not load are an ``Error`` naming them, before the block starts. ``stamp``: what
    ``check_reference_flags(args)`` returned, where the caller checked first (the checkpoint is hashed once)."""
    if stamp is None:
        stamp = check_reference_flags(args)
    if not stamp:
        yield reference_of(args)
        return
    from env_registry.validation.checkpoint import ServedCheckpoint

    max_new_tokens = args.reference_max_new_tokens or DEFAULTS["max_new_tokens"]
    with ServedCheckpoint(args.reference_checkpoint, max_new_tokens, stamp=stamp) as served:
        yield reference_of(args, served.url, served.stamp)


def reference_argv(reference: Reference | None) -> list[str]:
    """A reference policy as flags again, for the gate's command line (a served checkpoint as its URL and stamp)."""
    if reference is None:
        return []
    argv = [f"{_flag(name)}={getattr(reference, name)}" for name in REFERENCE_FLAGS]
    if reference.checkpoint:
        argv = [a for a in argv if not a.startswith("--reference-model-name=")]
        argv.append(f"--reference-stamp={reference.checkpoint}")
    return argv
