"""``summary.json``: an eval's samples reduced to pass@k, rewards, lengths, turns, latency and failures, per env and
(for a mix) weighted over envs.

A sample *passes* when it completed and its reward reaches the pass threshold (the top of the env's
``reward_range`` unless ``--pass-threshold``). ``mean_reward`` counts a sample that did not complete at the bottom
of the ``reward_range`` (its failure is counted too); ``mean_reward_completed`` leaves those out.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

from env_registry.evaluation.passk import mean_pass_at_k
from env_registry.evaluation.tasks import EnvTask, EvalSettings, pass_threshold

EPSILON = 1e-9


def passed(record: dict[str, Any], threshold: float) -> bool:
    return record.get("completed", False) and record["reward"] is not None and record["reward"] >= threshold - EPSILON


def env_records(task: EnvTask, records: dict, n: int) -> list[dict[str, Any]]:
    """The samples of ``task`` this eval covers (its rows, samples ``0..n-1``), in (prompt, sample) order."""
    out = [records.get((task.env_id, p, s)) for p in range(len(task.rows)) for s in range(n)]
    return [r for r in out if r is not None]


def summarize_env(task: EnvTask, records: Sequence[dict[str, Any]], settings: EvalSettings, ks: list[int]) -> dict:
    """The summary of one env's samples."""
    threshold = pass_threshold(task, settings)
    low = task.spec.reward_range[0]
    by_prompt: dict[int, list[bool]] = defaultdict(list)
    for r in records:
        by_prompt[r["prompt_id"]].append(passed(r, threshold))
    counts = [(len(v), sum(v)) for v in by_prompt.values()]
    completed = [r for r in records if r.get("completed")]
    failures = Counter(r["failure"]["reason"] for r in records if r.get("failure"))
    summary: dict[str, Any] = {
        "env_id": task.env_id,
        "package": task.spec.package,
        "package_version": task.spec.package_version,
        "spec_hash": task.spec.hash,
        "kind": task.spec.kind,
        "split": settings.split,
        "num_prompts": len(by_prompt),
        "n": settings.n,
        "num_samples": len(records),
    }
    summary.update({f"pass@{k}": mean_pass_at_k(counts, k) for k in ks})
    summary.update(
        {
            "pass_threshold": threshold,
            "reward_range": list(task.spec.reward_range),
            "mean_reward": _mean([r["reward"] if r.get("completed") else low for r in records]),
            "mean_reward_completed": _mean([r["reward"] for r in completed]),
            "mean_score": _mean([r["score"] for r in completed if r.get("score") is not None]),
            "failures": dict(sorted(failures.items())),
            "num_completed": len(completed),
            "prompt_tokens_mean": _mean([r["prompt_tokens"] for r in records if r.get("prompt_tokens") is not None]),
            "completion_tokens_mean": _mean(
                [r["completion_tokens"] for r in records if r.get("completion_tokens") is not None]
            ),
            "turns_mean": _mean([r["turns"] for r in records]),
            "truncated_fraction": _mean([float(bool(r.get("truncated"))) for r in records]),
            "latency_s": _latency([r["latency_s"] for r in records if r.get("latency_s") is not None]),
        }
    )
    return summary


def summarize(
    tasks: Sequence[EnvTask], records: dict, settings: EvalSettings, ks: list[int], run: dict[str, Any]
) -> dict[str, Any]:
    """The whole summary: one env's keys at the top level, or for a mix the weighted means with ``envs`` per env.

    Args:
        tasks: the envs evaluated.
        records: every stored sample by key.
        settings: how it sampled.
        ks: the k of pass@k.
        run: ``model``, ``started``, ``finished`` and timing, merged in.
    """
    per_env = {t.env_id: summarize_env(t, env_records(t, records, settings.n), settings, ks) for t in tasks}
    common = {"seed": settings.seed, "sampling": settings.sampling(), **run}
    if len(tasks) == 1:
        return {**per_env[tasks[0].env_id], **common}
    weights = {t.env_id: t.weight for t in tasks}
    mixed: dict[str, Any] = {
        "env_id": [t.env_id for t in tasks],
        "weights": weights,
        "split": settings.split,
        "num_prompts": sum(s["num_prompts"] for s in per_env.values()),
        "n": settings.n,
        "num_samples": sum(s["num_samples"] for s in per_env.values()),
    }
    for key in [f"pass@{k}" for k in ks] + ["mean_reward", "mean_reward_completed", "mean_score"]:
        mixed[key] = sum(weights[e] * (s[key] or 0.0) for e, s in per_env.items())
    failures: Counter = Counter()
    for s in per_env.values():
        failures.update(s["failures"])
    mixed["failures"] = dict(sorted(failures.items()))
    return {**mixed, **common, "envs": per_env}


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _latency(values: Sequence[float]) -> dict[str, float] | None:
    if not values:
        return None
    ordered = sorted(values)
    cuts = statistics.quantiles(ordered, n=10, method="inclusive") if len(ordered) > 1 else [ordered[0]] * 9
    return {"mean": statistics.fmean(ordered), "p50": statistics.median(ordered), "p90": cuts[8], "max": ordered[-1]}


def env_summaries(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """One summary per env (what a registry stores per package release): ``envs`` of a mix, else the summary."""
    if "envs" not in summary:
        return [summary]
    shared = {k: summary[k] for k in ("model", "seed", "started", "finished", "sampling") if k in summary}
    return [{**s, **shared} for s in summary["envs"].values()]
