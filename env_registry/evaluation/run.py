"""The one eval loop that ``molt-env eval``, ``molt-train eval`` and the trainer's periodic eval share.

``evaluate`` plays ``n`` samples of every row of every env through a ``Policy``, at most ``concurrency`` at a time,
each under its own ``timeout_s``; stores each sample as it finishes (durably, with an output directory); skips the
samples a previous run already stored; then writes ``summary.json``, ``report.md`` and ``report.png``.
"""

from __future__ import annotations

import asyncio
import datetime
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from env_registry.evaluation.episode import Episode, Failure, Policy, invalid_action
from env_registry.evaluation.passk import resolve_ks
from env_registry.evaluation.samples import SampleStore
from env_registry.evaluation.summary import summarize
from env_registry.evaluation.tasks import EnvTask, EvalSettings, sample_seed

RESUME_MUST_MATCH = ("model", "sampling", "specs")


def now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


async def evaluate(
    tasks: Sequence[EnvTask],
    policy: Policy,
    settings: EvalSettings,
    out: str | Path | None = None,
    on_sample: Callable[[dict[str, Any]], None] | None = None,
    report: bool = True,
) -> dict[str, Any]:
    """Run (or resume) an eval; returns its summary (also written to ``out/summary.json``).

    Args:
        tasks: the envs and their rows (``load_tasks``).
        policy: what generates (``EnginePolicy``, ``EndpointPolicy``).
        settings: sampling, pass@k, concurrency and timeout.
        out: the eval directory; None keeps everything in memory (the trainer's periodic eval).
        on_sample: called with each new sample record as it is stored (progress output).
        report: write ``report.md``/``report.png`` next to the summary.

    Raises:
        Error: a ``k > n``, or ``out`` holding a different eval.
    """
    ks = resolve_ks(settings.ks, settings.n)
    store = SampleStore(out)
    header = {
        "model": policy.name,
        "sampling": settings.sampling(),
        "specs": {t.env_id: t.spec.hash for t in tasks},
        "given_ids": {t.env_id: t.given_id or t.env_id for t in tasks},
        "started": now(),
    }
    store.begin(header, RESUME_MUST_MATCH)
    todo = [job for job in _jobs(tasks, settings.n) if not store.has((job[0].env_id, job[1], job[2]))]
    wall = time.perf_counter()
    await policy.start()
    try:
        jobs = iter(todo)
        await asyncio.gather(*(_worker(jobs, policy, settings, store, on_sample) for _ in range(settings.concurrency)))
    finally:
        await policy.close()
        store.close()
    wall = time.perf_counter() - wall
    run = {
        "model": policy.name,
        "started": store.header["started"],
        "finished": now(),
        "samples_this_run": len(todo),
        "wall_s_this_run": wall,
        "samples_per_s_this_run": len(todo) / wall if wall > 0 and todo else None,
        "concurrency": settings.concurrency,
        **settings.extra,
    }
    summary = summarize(tasks, store.records, settings, ks, run)
    if out is not None:
        from env_registry.evaluation.report import write_outputs

        write_outputs(Path(out), summary, tasks, store.records, settings, ks, report=report)
    return summary


def _jobs(tasks: Sequence[EnvTask], n: int) -> Iterator[tuple[EnvTask, int, int]]:
    for task in tasks:
        for prompt_id in range(len(task.rows)):
            for sample in range(n):
                yield task, prompt_id, sample


async def _worker(jobs, policy: Policy, settings: EvalSettings, store: SampleStore, on_sample) -> None:
    for task, prompt_id, sample in jobs:
        record = await play(task, prompt_id, sample, policy, settings)
        await store.add(record)
        if on_sample is not None:
            on_sample(record)


async def play(task: EnvTask, prompt_id: int, sample: int, policy: Policy, settings: EvalSettings) -> dict[str, Any]:
    """One sample, as the record ``samples.jsonl`` stores; never raises for the sample's own failure."""
    row = task.rows[prompt_id]
    seed = sample_seed(settings.seed, task.env_id, prompt_id, sample)
    params = settings.base_params().updated(seed=seed)
    start = time.perf_counter()
    try:
        episode = await asyncio.wait_for(policy.run(task, row, params), settings.timeout_s)
    except TimeoutError:
        episode = Episode.failed("timeout", f"the sample ran past --timeout {settings.timeout_s:g} s")
    except Exception as exc:  # a policy bug must not lose the sample: it is recorded like any failure
        episode = Episode.failed(policy.generate_reason, f"{type(exc).__name__}: {exc}")
    latency = time.perf_counter() - start
    if episode.failure is None:
        episode.failure = invalid_action(episode.info)
    return record_of(task, prompt_id, sample, seed, row, episode, latency)


def record_of(
    task: EnvTask, prompt_id: int, sample: int, seed: int, row: dict[str, Any], episode: Episode, latency: float
) -> dict[str, Any]:
    failure: Failure | None = episode.failure
    completed = episode.reward is not None
    return {
        "env_id": task.env_id,
        "spec_hash": task.spec.hash,
        "package_version": task.spec.package_version,
        "prompt_id": prompt_id,
        "sample": sample,
        "seed": seed,
        "prompt": row["prompt"],
        "label": row["label"],
        "transcript": episode.transcript,
        "actions": episode.actions,
        "prompt_tokens": episode.prompt_tokens,
        "completion_tokens": episode.completion_tokens,
        "turns": episode.turns,
        "truncated": episode.truncated,
        "completed": completed,
        "reward": episode.reward,
        "score": episode.score,
        "info": episode.info,
        "failure": None if failure is None else {"reason": failure.reason, "detail": failure.detail},
        "latency_s": latency,
        "finished": now(),
    }
