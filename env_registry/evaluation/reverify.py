"""``molt-env eval --reverify DIR``: re-grade an eval's stored samples with the envs' current graders, no model calls.

Each stored sample is replayed against a fresh instance of its env as installed now: an ``Env`` gets the stored
action texts turn by turn (``chat_driver.drive_env``), a ``ChatAgent`` runs for real against a replay engine that
answers its model calls with the stored replies, in order, through the session server. Samples that never reached
the model (endpoint errors, timeouts before a reply) keep their failure. The results go to
``samples.reverified.jsonl`` and ``summary.reverified.json`` (with how many rewards changed), and every episode whose
reward changed to ``reverify_diff.json`` (old and new reward, failure and spec hash); the original files stay as they
are.

``molt-env eval --reverify DIR ID@VERSION`` re-grades with another version of an env instead of the recorded one
(an ID of the same ``ns/name-vN``: a pinned package version, or an isolated install of it), so the diff says what
the new version changes on the old run's samples.
"""

from __future__ import annotations

import asyncio
import json
import warnings
from pathlib import Path
from typing import Any

from env_registry.errors import Error
from env_registry.evaluation.chat_driver import Reply, drive_env
from env_registry.evaluation.episode import Episode, Failure, classify, invalid_action
from env_registry.evaluation.passk import resolve_ks
from env_registry.evaluation.run import now, upstream_changes
from env_registry.evaluation.samples import SampleStore, key_of
from env_registry.evaluation.summary import summarize
from env_registry.evaluation.tasks import EnvTask, EvalSettings
from env_registry.ids import parse_env_id, split_kwargs
from env_registry.registry import registry
from env_registry.sources import for_scheme
from molt_envs import ChatAgentRunner, SamplingParams
from molt_envs.replay_model import ByteChatTokenizer, ReplayEngine

REPLAY_MAX_LENGTH = 1 << 22


class Diverged(LookupError):
    failure_reason = "replay_diverged"


DIFF_FILE = "reverify_diff.json"


def _base(env_id: str) -> str:
    """What two versions of one env share: ``ns/name`` (an ID's module form and pin dropped), or a scheme ID as is."""
    if for_scheme(env_id) is not None:
        return split_kwargs(env_id)[0]
    return parse_env_id(env_id.rpartition(":")[2]).base


def _replacements(recorded: list[str], given: list[str]) -> dict[str, str]:
    """recorded env ID -> the ID to re-grade it with, from ``given`` (each must name one recorded env by its base)."""
    by_base = {_base(r): r for r in recorded}
    out = {}
    for env_id in given:
        if _base(env_id) not in by_base:
            raise Error(
                f"{env_id!r} replaces none of the eval's envs ({', '.join(recorded)}); give another version of one"
            )
        out[by_base[_base(env_id)]] = env_id
    return out


async def reverify(root: str | Path, concurrency: int = 16, env_ids: list[str] | None = None) -> dict[str, Any]:
    """Re-grade ``root``'s samples, with ``env_ids`` in place of the recorded envs of the same base ID; returns the
    re-graded summary (``reverify_diff.json`` lists the episodes whose reward changed).

    Raises:
        Error: ``root`` holds no eval, an env of it is no longer installed, or an ID of ``env_ids`` replaces none.
    """
    store = SampleStore(root)
    if store.header is None or not store.records:
        raise Error(f"{root} holds no eval (no eval.json and samples.jsonl); point --reverify at an eval's --out")
    old = json.loads((Path(root) / "summary.json").read_text()) if (Path(root) / "summary.json").is_file() else {}
    tasks: dict[str, EnvTask] = {}
    replace = _replacements(list(store.header["specs"]), env_ids or [])
    for env_id in store.header["specs"]:
        try:
            spec, factory = registry.factory(
                replace.get(env_id) or store.header.get("given_ids", {}).get(env_id, env_id)
            )
        except Error as exc:
            raise Error(f"cannot re-grade {env_id!r}: {exc}") from None
        tasks[env_id] = EnvTask(env_id, spec, factory, [], 1.0)
    for message in upstream_changes(store.header, {env_id: task.spec for env_id, task in tasks.items()}):
        warnings.warn(f"re-grading {root}: {message}", stacklevel=2)
    records = sorted(store.records.values(), key=key_of)
    semaphore = asyncio.Semaphore(concurrency)

    async def one(record: dict[str, Any]) -> dict[str, Any]:
        async with semaphore:
            return await regrade(tasks[record["env_id"]], record)

    try:
        regraded = await asyncio.gather(*(one(r) for r in records))
    finally:
        from molt_envs.chat_runner import close_session_servers

        await close_session_servers()
    store.rewrite(regraded, "samples.reverified.jsonl")
    # where `molt-env view ROOT` (and the hub's copy of an uploaded eval) shows each episode: /episodes/<n>, in the
    # viewer's order (the summary's envs first, then prompt and sample)
    rank = {e: i for i, e in enumerate(old.get("envs") or {})}
    order = sorted(records, key=lambda r: (rank.get(r["env_id"], len(rank)), *key_of(r)))
    position = {key_of(r): n for n, r in enumerate(order)}
    changed = [
        {
            "episode": f"/episodes/{position[key_of(old_)]}",
            "env_id": new["env_id"],
            "prompt_id": new["prompt_id"],
            "sample": new["sample"],
            "reward": [old_["reward"], new["reward"]],
            "delta": None if None in (old_["reward"], new["reward"]) else new["reward"] - old_["reward"],
            "failure": [old_.get("failure"), new.get("failure")],
            "spec_hash": [old_.get("spec_hash"), new.get("spec_hash")],
        }
        for new, old_ in zip(regraded, records, strict=True)
        if new["reward"] != old_["reward"]
    ]
    diff = {"eval": str(root), "regraded_with": {e: tasks[e].spec.hash for e in tasks}, "replaced": replace}
    (Path(root) / DIFF_FILE).write_text(json.dumps({**diff, "changed": changed}, indent=1, default=str) + "\n")
    settings = settings_of(store.header, old)
    for env_id, task in tasks.items():  # the rows this eval covered, for the summary's per-prompt grouping
        task.rows = [None] * (1 + max(r["prompt_id"] for r in regraded if r["env_id"] == env_id))
        task.weight = (old.get("weights") or {}).get(env_id, 1.0 / len(tasks))
    by_key = {key_of(r): r for r in regraded}
    run = {
        "model": store.header["model"],
        "started": store.header.get("started"),
        "finished": old.get("finished"),
        "reverified": now(),
        "reverified_changed": len(changed),
        "reverified_with": replace,
        "spec_hash_at_eval": store.header["specs"],
    }
    summary = summarize(list(tasks.values()), by_key, settings, resolve_ks(settings.ks, settings.n), run)
    (Path(root) / "summary.reverified.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    return summary


def settings_of(header: dict[str, Any], old_summary: dict[str, Any]) -> EvalSettings:
    sampling = dict(header["sampling"])
    n = int(old_summary.get("n") or 1)
    ks = sorted(int(k.split("@")[1]) for k in old_summary if k.startswith("pass@")) or None
    return EvalSettings(n=n, ks=ks, **sampling)


async def regrade(task: EnvTask, record: dict[str, Any]) -> dict[str, Any]:
    """One stored sample, graded again by ``task``'s env as installed now."""
    actions = record.get("actions") or []
    if not actions or any(a is None for a in actions):
        return {**record, "reverified": False}  # nothing (or nothing replayable) reached the env
    row = {"prompt": record["prompt"], "label": record["label"]}
    if task.spec.kind == "chat_agent":
        episode = await _replay_agent(task, row, actions)
    else:
        episode = await drive_env(task.factory(), row, _replay(actions), SamplingParams(), None, allow_raw=True)
    if episode.failure is None:
        episode.failure = invalid_action(episode.info)
    failure = episode.failure
    return {
        **record,
        "spec_hash": task.spec.hash,
        "package_version": task.spec.package_version,
        "completed": episode.reward is not None,
        "reward": episode.reward,
        "score": episode.score,
        "info": episode.info,
        "failure": None if failure is None else {"reason": failure.reason, "detail": failure.detail},
        "reverified": True,
    }


def _replay(actions: list[str]):
    replies = iter(actions)

    async def generate(messages, tools, params) -> Reply:
        action = next(replies, None)
        if action is None:
            raise Diverged(f"the stored sample has {len(actions)} model turn(s); the env asked for another")
        return Reply(content=action)

    return generate


async def _replay_agent(task: EnvTask, row: dict[str, Any], actions: list[str]) -> Episode:
    tokenizer = ByteChatTokenizer()
    runner = ChatAgentRunner(task.factory, env_id=task.env_id, spec_hash=task.spec.hash)
    params = SamplingParams(max_tokens=REPLAY_MAX_LENGTH // 2, temperature=1.0)
    segments = await runner.execute(
        row["prompt"], row["label"], params, REPLAY_MAX_LENGTH, tokenizer, ReplayEngine(tokenizer, actions)
    )
    first = segments[0]
    if first.failure is not None:
        failure = classify(first.failure)
        if "the replayed episode has" in first.failure:
            failure = Failure("replay_diverged", first.failure)
        return Episode(failure=failure, info=dict(first.info))
    return Episode(reward=first.reward, score=first.score, info=dict(first.info), truncated=first.truncated)
