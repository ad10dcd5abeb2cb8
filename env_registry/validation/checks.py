"""The checks ``molt-env validate`` runs on each env ID of an installed package (inside the jail, see ``worker``).

Per env ID: its entry point is discovered from the package's metadata and imported; ``make()`` returns the declared
kind; the existing conformance checks (``env_registry.conformance``); the datasets (each declared split loads with
its declared keys and, for a generator split, the size its ``kwargs`` declare; no exact-duplicate prompts between
train and test); determinism (the same seed gives the same
prompts, the same transcript the same grade); and a smoke eval with scripted policies (an empty answer, garbage, an
over-long answer, and the dataset's reference answer) through the real runners: rewards inside ``reward_range``,
the reference earning the top reward, no grader crash, every episode ending within ``max_turns``.

Each finished check goes to ``emit`` at once, and ``step`` hears what is about to run, so a package that hangs or
crashes the process still leaves every earlier verdict and the name of the step it was in. ``samples`` hears the
first prompts of each split that loaded (what the hub's env card shows: generated here, in the jail, never by the
hub).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from env_registry.conformance import check as conformance_check
from env_registry.datasets import load_split
from env_registry.errors import Error
from env_registry.manifest import EnvSpec
from env_registry.registry import registry
from env_registry.validation.report import Check
from molt_envs import ChatAgent, ChatAgentRunner, Env, SamplingParams, StepEnvRunner
from molt_envs.chat_runner import close_session_servers
from molt_envs.conformance import GARBAGE_ACTION
from molt_envs.replay_model import ByteChatTokenizer, ReplayEngine

OVERLONG = "7 " * 12_000  # far past any sane answer: a grader must still return a reward in range
SCRIPTED = {"empty answer": "", "garbage answer": GARBAGE_ACTION, "over-long answer": OVERLONG}
SMOKE_ROWS = 2
SAMPLE_PROMPTS = 3  # per split, for the env card

Samples = Callable[[str, str, list[Any]], None]  # (env ID, split, prompts)
OVERLAP_ROW_LIMIT = 200_000
EPISODE_TIMEOUT_S = 60.0
MAX_LENGTH = 1 << 16

Emit = Callable[[Check], None]


def run_checks(
    env_ids: list[str],
    package: str | None,
    emit: Emit,
    step: Callable[[str], None],
    samples: Samples = lambda env_id, split, prompts: None,
) -> None:
    """Run every check on each of ``env_ids`` (provided by ``package``, when given)."""
    for env_id in env_ids:
        asyncio.run(_check_one(env_id, package, emit, step, samples))


async def _check_one(
    env_id: str, package: str | None, emit: Emit, step: Callable[[str], None], samples: Samples
) -> None:
    try:
        await _checks(env_id, package, emit, step, samples)
    finally:
        await close_session_servers()


async def _checks(env_id: str, package: str | None, emit: Emit, step: Callable[[str], None], samples: Samples) -> None:
    def add(name: str, passed: bool, detail: str = "") -> bool:
        emit(Check(name, bool(passed), detail[:4000], env_id))
        return bool(passed)

    step(f"{env_id}: resolving its entry point")
    try:
        spec = registry.spec(env_id)
    except Error as exc:
        add("entry point discovered", False, str(exc))
        return
    if not add(
        "entry point discovered",
        package is None or spec.package == package,
        f"{spec.entry_point} from {spec.package} {spec.package_version}",
    ):
        return
    step(f"{env_id}: importing {spec.entry_point}")
    try:
        spec, factory = registry.factory(env_id)
    except Exception as exc:
        add("import through the entry point", False, f"{type(exc).__name__}: {exc}")
        return
    add("import through the entry point", True, spec.entry_point)
    step(f"{env_id}: make()")
    base = ChatAgent if spec.kind == "chat_agent" else Env
    try:
        instance = factory()
        made = isinstance(instance, base)
        detail = f"a {type(instance).__name__}" + ("" if made else f", but the manifest says kind {spec.kind!r}")
    except Exception as exc:
        made, detail = False, f"make() raised {type(exc).__name__}: {exc}"
    if not add(f"make() returns a {base.__name__}", made, detail):
        return
    step(f"{env_id}: conformance checks")
    report = await asyncio.to_thread(conformance_check, env_id)  # it runs its own event loop
    for c in report.checks:
        add(f"conformance: {c.name}", c.passed, c.detail)
    step(f"{env_id}: datasets")
    rows = _check_datasets(spec, add, lambda split, prompts: samples(env_id, split, prompts))
    if not rows:
        add("smoke eval", False, "no dataset rows to play; declare a dataset split")
        return
    step(f"{env_id}: determinism")
    await _check_determinism(spec, factory, rows[0], add)
    for what, text in SCRIPTED.items():
        step(f"{env_id}: smoke eval, {what}")
        await _smoke(spec, factory, rows, what, lambda _row, text=text: text, add)
    if any(r.get("reference") for r in rows):
        step(f"{env_id}: smoke eval, reference answer")
        await _smoke(spec, factory, rows, "reference answer", lambda row: row.get("reference"), add)


def _check_datasets(
    spec: EnvSpec, add: Callable[..., bool], samples: Callable[[str, list[Any]], None]
) -> list[dict[str, Any]]:
    """Each declared split loads with its declared keys; train and test share no prompt; the first prompts of each
    split go to ``samples``. Returns rows to play."""
    loaded: dict[str, list[dict[str, Any]]] = {}
    for split in spec.datasets:
        try:
            loaded[split] = load_split(spec, split, OVERLAP_ROW_LIMIT)
        except Exception as exc:
            add(f"dataset split {split!r} loads", False, f"{type(exc).__name__}: {exc}")
            continue
        add(
            f"dataset split {split!r} loads",
            bool(loaded[split]),
            f"{len(loaded[split])} rows" if loaded[split] else "no rows",
        )
        samples(split, [row["prompt"] for row in loaded[split][:SAMPLE_PROMPTS]])
        declared = spec.datasets[split].kwargs.get("size")
        if spec.datasets[split].generator and isinstance(declared, int) and declared <= OVERLAP_ROW_LIMIT:
            add(
                f"dataset split {split!r} has the declared size",
                len(loaded[split]) == declared,
                f"{len(loaded[split])} rows; the manifest's kwargs say size = {declared}",
            )
    if not spec.datasets:
        add("datasets declared", False, "the manifest declares no dataset split; evals and training need one")
    if "train" in loaded and "test" in loaded:
        train = {_key(r["prompt"]) for r in loaded["train"]}
        shared = [r for r in loaded["test"] if _key(r["prompt"]) in train]
        add(
            "train and test share no prompt",
            not shared,
            f"{len(shared)} of {len(loaded['test'])} test prompts also appear in train"
            + (f", e.g. {json.dumps(shared[0]['prompt'])[:160]}" if shared else ""),
        )
    split = "test" if "test" in loaded else next(iter(loaded), None)
    return loaded.get(split, [])[:SMOKE_ROWS] if split else []


def _key(prompt: Any) -> str:
    return json.dumps(prompt, sort_keys=True, ensure_ascii=False)


async def _check_determinism(spec: EnvSpec, factory: Callable[[], Any], row: dict[str, Any], add) -> None:
    """The same seed gives the same prompts; the same transcript gets the same grade (when declared deterministic)."""
    split = "test" if "test" in spec.datasets else next(iter(spec.datasets))
    try:
        first, again = load_split(spec, split, SMOKE_ROWS), load_split(spec, split, SMOKE_ROWS)
        add("determinism: same prompts from the same seed", _key(first) == _key(again), f"split {split!r}")
    except Exception as exc:
        add("determinism: same prompts from the same seed", False, f"{type(exc).__name__}: {exc}")
    if not spec.deterministic:
        add("determinism: same grade for the same transcript", True, "not required: the manifest says nondeterministic")
        return
    text = str(row.get("reference") or GARBAGE_ACTION)
    grades = [await _episode(spec, factory, row, text) for _ in range(2)]
    failed = next((g.failure for g in grades if g.failure), None)
    same = [(g.reward, json.dumps(g.info, sort_keys=True)) for g in grades]
    if failed:
        detail = f"the episode failed: {failed}"
    elif same[0] != same[1]:
        detail = f"reward {grades[0].reward} then {grades[1].reward}, info {same[0][1]} then {same[1][1]}"
    else:
        detail = f"reward {grades[0].reward}"
    add("determinism: same grade for the same transcript", not failed and same[0] == same[1], detail)


async def _episode(spec: EnvSpec, factory: Callable[[], Any], row: dict[str, Any], text: str) -> Any:
    """One episode against a replay engine answering every model call with ``text``, through the real runner."""
    tokenizer = ByteChatTokenizer()
    engine = ReplayEngine(tokenizer, text)
    if spec.kind == "chat_agent":
        runner: Any = ChatAgentRunner(factory, env_id=spec.id, spec_hash=spec.hash)
    else:
        runner = StepEnvRunner(factory, env_id=spec.id, spec_hash=spec.hash, max_turns=spec.max_turns)
    params = SamplingParams(max_tokens=MAX_LENGTH // 2, temperature=1.0)
    result = await asyncio.wait_for(
        runner.execute(row["prompt"], row["label"], params, MAX_LENGTH, tokenizer, engine), EPISODE_TIMEOUT_S
    )
    segments = result if isinstance(result, list) else [result]
    first = segments[0]
    first.num_turns = engine.calls  # model calls: an Env's turns, a ChatAgent's SDK calls
    return first


async def _smoke(spec: EnvSpec, factory, rows, what: str, answer: Callable[[dict], Any], add) -> None:
    lo, hi = spec.reward_range
    problems, rewards = [], []
    for i, row in enumerate(rows):
        text = answer(row)
        if text is None:
            continue
        try:
            traj = await _episode(spec, factory, row, str(text))
        except TimeoutError:
            problems.append(f"row {i}: the episode did not end within {EPISODE_TIMEOUT_S:g} s (a hung grader?)")
            continue
        if traj.failure:
            problems.append(f"row {i}: {traj.failure}")
            continue
        rewards.append(traj.reward)
        if not lo <= traj.reward <= hi:
            problems.append(f"row {i}: reward {traj.reward} outside the declared reward_range [{lo}, {hi}]")
        if what == "reference answer" and traj.reward < hi:
            problems.append(f"row {i}: the reference answer earned {traj.reward}, not the top reward {hi}")
        if spec.max_turns is not None and traj.num_turns > spec.max_turns:
            problems.append(f"row {i}: {traj.num_turns} model turns, more than the declared max_turns {spec.max_turns}")
    add(f"smoke eval: {what}", not problems, "; ".join(problems) or f"rewards {rewards}")
