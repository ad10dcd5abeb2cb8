"""The one eval loop that ``molt-env eval``, ``molt-train eval`` and the trainer's periodic eval share.

``evaluate`` plays ``n`` samples of every row of every env through a ``Policy``, at most ``concurrency`` requests
(a sample, or a prompt's samples sent as one request with ``n``) at a time, each sample under its own ``timeout_s``;
stores each sample as it finishes (durably, with an output directory); skips the samples a previous run already
stored (of a prompt partly stored, only the missing ones are requested); then writes ``summary.json`` (with
``env_lock``), ``molt_env_lock.json`` (``env_registry.mix.env_lock``), ``report.md`` and ``report.png``.
``summary.json``'s ``requests`` says, per env, whether one request with ``n`` per prompt or one request per sample
was used, and why.
"""

from __future__ import annotations

import asyncio
import datetime
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from env_registry.errors import Error
from env_registry.evaluation.episode import Episode, Failure, Policy, invalid_action
from env_registry.evaluation.passk import resolve_ks
from env_registry.evaluation.samples import SampleStore
from env_registry.evaluation.summary import summarize
from env_registry.evaluation.tasks import EnvTask, EvalSettings, sample_seed
from env_registry.mix import lock_from, write_lock

RESUME_MUST_MATCH = ("model", "sampling", "specs")


def upstream_changes(header: dict[str, Any], specs: dict[str, Any]) -> list[str]:
    """For each env of another ecosystem whose library is installed in another version than ``header`` (an
    ``eval.json``) recorded, a sentence naming both versions."""
    changes = []
    for env_id, was in header.get("upstream", {}).items():
        now_ = getattr(specs.get(env_id), "upstream", None) or {}
        if now_ and was.get("version") != now_.get("version"):
            changes.append(
                f"{env_id} was evaluated with {was.get('library')} {was.get('version')}, and "
                f"{now_.get('library')} {now_.get('version')} is installed now"
            )
    return changes


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
    if store.header is not None:
        for message in upstream_changes(store.header, {t.env_id: t.spec for t in tasks}):
            raise Error(f"{out}: {message}; install that version to resume this eval, or use another --out")
    header = {
        "model": policy.name,
        "sampling": settings.sampling(),
        "specs": {t.env_id: t.spec.hash for t in tasks},
        "given_ids": {t.env_id: t.given_id or t.env_id for t in tasks},
        "upstream": {t.env_id: t.spec.upstream for t in tasks if t.spec.upstream},
        "started": now(),
    }
    store.begin(header, RESUME_MUST_MATCH)
    if out is not None and report:  # matplotlib's import overlaps the sampling (Python's import lock orders it)
        from env_registry.evaluation.report import load_pyplot

        threading.Thread(target=load_pyplot, name="eval-report-import", daemon=True).start()
    todo = [
        (task, prompt_id, [s for s in range(settings.n) if not store.has((task.env_id, prompt_id, s))])
        for task in tasks
        for prompt_id in range(len(task.rows))
    ]
    todo = [job for job in todo if job[2]]
    wall = time.perf_counter()
    await policy.start()
    try:
        jobs = _jobs(todo, policy)
        await asyncio.gather(*(_worker(jobs, policy, settings, store, on_sample) for _ in range(settings.concurrency)))
    finally:
        await policy.close()
        store.close()
    wall = time.perf_counter() - wall
    run = {
        "model": policy.name,
        "started": store.header["started"],
        "finished": now(),
        "samples_this_run": (done := sum(len(job[2]) for job in todo)),
        "wall_s_this_run": wall,
        "samples_per_s_this_run": done / wall if wall > 0 and done else None,
        "concurrency": settings.concurrency,
        "requests": {t.env_id: _requests(t, policy, settings.n) for t in tasks},
        **settings.extra,
    }
    summary = summarize(tasks, store.records, settings, ks, run)
    summary["env_lock"] = lock_from((t.given_id or t.env_id, t.spec, t.weight) for t in tasks)
    if out is not None:
        from env_registry.evaluation.report import write_outputs

        write_lock(out, summary["env_lock"])
        write_outputs(Path(out), summary, tasks, store.records, settings, ks, report=report)
    return summary


def _jobs(todo, policy: Policy) -> Iterator[tuple[EnvTask, int, list[int]]]:
    """A prompt's missing samples as one job (one request with ``n``) where the policy allows it, else one job each;
    decided as each prompt comes up, so a refusal of ``n`` applies to every prompt after it."""
    for task, prompt_id, missing in todo:
        if len(missing) > 1 and policy.separate_because(task) is None:
            yield task, prompt_id, missing
        else:
            for sample in missing:
                yield task, prompt_id, [sample]


def _requests(task: EnvTask, policy: Policy, n: int) -> dict[str, Any]:
    """How this run requested ``task``'s samples: ``mode`` n / separate / mixed, the counts, and why separate."""
    counts = policy.requests(task.env_id)
    why = "n is 1" if n == 1 else policy.separate_because(task)
    several, single = counts.get("n_requests", 0), counts.get("single_requests", 0)
    mode = "mixed" if several and single else "n" if several or why is None else "separate"
    return {"mode": mode, "n_requests": several, "single_requests": single, "why_separate": why}


async def _worker(jobs, policy: Policy, settings: EvalSettings, store: SampleStore, on_sample) -> None:
    for task, prompt_id, samples in jobs:
        if len(samples) == 1:
            records = [await play(task, prompt_id, samples[0], policy, settings)]
        else:
            records = await play_choices(task, prompt_id, samples, policy, settings)
        for record in records:
            store.add(record)
            if on_sample is not None:
                on_sample(record)


async def play_choices(
    task: EnvTask, prompt_id: int, samples: list[int], policy: Policy, settings: EvalSettings
) -> list[dict[str, Any]]:
    """Samples of one prompt whose replies come from one request with ``n`` (``Policy.run_choices``), as records."""
    row = task.rows[prompt_id]
    seeds = [sample_seed(settings.seed, task.env_id, prompt_id, s) for s in samples]
    params = [settings.base_params().updated(seed=seed) for seed in seeds]
    start = time.perf_counter()
    try:
        episodes = await asyncio.wait_for(policy.run_choices(task, row, params), settings.timeout_s)
    except TimeoutError:
        episodes = [
            Episode.failed("timeout", f"the samples ran past --timeout {settings.timeout_s:g} s") for _ in samples
        ]
    except Exception as exc:  # a policy bug must not lose the samples: each is recorded like any failure
        episodes = [Episode.failed(policy.generate_reason, f"{type(exc).__name__}: {exc}") for _ in samples]
    latency = time.perf_counter() - start
    records = []
    for sample, seed, episode in zip(samples, seeds, episodes, strict=True):
        if episode.failure is None:
            episode.failure = invalid_action(episode.info)
        records.append(record_of(task, prompt_id, sample, seed, row, episode, latency))
    return records


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
        **({"request": episode.request} if episode.request else {}),
    }
