"""Conformance checks an environment must pass before it is published or trained on.

``check_env`` exercises the contract without a model: fresh instances per episode, ``reset``/``step`` types, rewards
inside the declared range, scalar ``info``, deterministic grading when declared, a reference completion scoring the
top of the range, and a garbage action handled without raising. Each check is reported; none short-circuits the rest.
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from molt_envs.contract import ChatAgent, Env, Result, SamplingParams

GARBAGE_ACTION = "\x00 <|unknown|> ∑∑ \ufffd" + "z" * 200


@dataclass
class Check:
    name: str
    passed: bool
    detail: str = ""


@dataclass
class CheckReport:
    subject: str
    checks: list[Check] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.passed for c in self.checks)

    def add(self, name: str, passed: bool, detail: str = "") -> bool:
        self.checks.append(Check(name, passed, detail))
        return passed

    def assert_passed(self) -> CheckReport:
        """For tests: raise unless every check passed.

        Returns:
            The report itself.

        Raises:
            AssertionError: with the rendered report, if a check failed (or none ran).
        """
        if not self.passed:
            raise AssertionError(self.render())
        return self

    def render(self) -> str:
        lines = [f"conformance report for {self.subject}"]
        lines += [
            f"  {'PASS' if c.passed else 'FAIL'}  {c.name}" + (f": {c.detail}" if c.detail else "") for c in self.checks
        ]
        failed = sum(not c.passed for c in self.checks)
        lines.append(f"{len(self.checks) - failed} passed, {failed} failed")
        return "\n".join(lines)


def check_env(
    factory: Callable[[], Any],
    rows: Sequence[dict[str, Any]],
    *,
    subject: str | None = None,
    kind: str = "env",
    reward_range: tuple[float, float] = (-math.inf, math.inf),
    deterministic: bool = False,
) -> CheckReport:
    """Run every check on the instances a factory makes (``env_registry.check_env`` checks an env ID or spec).

    Args:
        factory: makes a fresh ``Env`` or ``ChatAgent`` per call (an env class is one).
        rows: dataset rows with ``prompt``, ``label`` and optionally ``reference``.
        subject: names the env in the report (default: the factory's name).
        kind: ``"env"`` or ``"chat_agent"``. reward_range: the declared range every reward must lie in.
        deterministic: the env declares that one action always earns one reward (checked twice per action).

    Returns:
        The report: one entry per check, none short-circuiting the rest.
    """
    subject = subject or getattr(factory, "__qualname__", repr(factory))
    return asyncio.run(_check(factory, list(rows), subject, kind, reward_range, deterministic))


async def _check(factory, rows, subject, kind, reward_range, deterministic) -> CheckReport:
    report = CheckReport(subject)
    base = ChatAgent if kind == "chat_agent" else Env
    try:
        first, second = factory(), factory()
    except Exception as exc:
        report.add("instantiate", False, f"constructing the env raised {type(exc).__name__}: {exc}")
        return report
    if not report.add(
        "instantiate",
        isinstance(first, base),
        f"made a {type(first).__name__}, expected a {base.__name__}"
        if not isinstance(first, base)
        else f"{type(first).__name__}",
    ):
        return report
    report.add(
        "fresh instance per episode",
        first is not second,
        ""
        if first is not second
        else "the factory returned the same object twice; envs must not be shared across episodes",
    )
    report.add(
        "dataset rows",
        bool(rows) and all("prompt" in r and "label" in r for r in rows),
        f"{len(rows)} sample rows" if rows else "no dataset rows to check against; declare a dataset split",
    )
    if kind == "chat_agent":
        if report.add(
            "run is async", inspect.iscoroutinefunction(type(first).run), "ChatAgent.run must be `async def`"
        ):
            await _check_chat_rows(report, factory, rows[:2], reward_range, deterministic)
        return report
    for i, row in enumerate(rows[:3]):
        await _check_row(report, factory, row, i, reward_range, deterministic)
    return report


async def _check_row(report, factory, row, i, reward_range, deterministic) -> None:
    lo, hi = reward_range
    env = factory()
    try:
        start = await env.reset(
            {"observation": row["prompt"], "label": row["label"], "images": list(row.get("images", []))}
        )
    except Exception as exc:
        report.add(f"row {i}: reset", False, f"raised {type(exc).__name__}: {exc}")
        return
    finally:
        await env.close()
    ok = isinstance(start, dict) and isinstance(start.get("observation"), str | list)
    report.add(
        f"row {i}: reset",
        ok,
        "" if ok else f"reset must return a dict with an 'observation' str or message list, got {start!r:.120}",
    )
    actions = {"garbage action": GARBAGE_ACTION}
    if row.get("reference"):
        actions = {"reference action": str(row["reference"]), **actions}
    for what, action in actions.items():
        results = [await _step(factory, row, action) for _ in range(2 if deterministic else 1)]
        result = results[0]
        if isinstance(result, Exception):
            report.add(f"row {i}: {what}", False, f"step raised {type(result).__name__}: {result}")
            continue
        problems = []
        if not isinstance(result, Result):
            problems.append(f"step returned {type(result).__name__}, not Result")
        else:
            if not lo <= result.reward <= hi:
                problems.append(f"reward {result.reward} outside the declared reward_range [{lo}, {hi}]")
            bad = {k: v for k, v in result.info.items() if not isinstance(v, int | float | bool)}
            if bad:
                problems.append(f"info values must be scalars for logging, got {bad!r:.120}")
            if what == "reference action" and result.reward != hi:
                problems.append(
                    f"the reference completion scored {result.reward}, expected the top of the range ({hi})"
                )
            if deterministic and isinstance(results[1], Result) and results[1].reward != result.reward:
                problems.append(f"declared deterministic but rewards differ: {result.reward} vs {results[1].reward}")
        report.add(f"row {i}: {what}", not problems, "; ".join(problems) or f"reward={result.reward}")


async def _step(factory, row, action) -> Result | Exception:
    env = factory()
    try:
        await env.reset({"observation": row["prompt"], "label": row["label"], "images": list(row.get("images", []))})
        return await env.step(
            {
                "observation_text": str(row["prompt"]) + action,
                "action_text": action,
                "label": row["label"],
                "sampling_params": SamplingParams(),
                "turn": 0,
                "images": list(row.get("images", [])),
            }
        )
    except Exception as exc:
        return exc
    finally:
        await env.close()


async def _check_chat_rows(report, factory, rows, reward_range, deterministic) -> None:
    """Run the agent for real (its SDK, the session server, token capture) against a replay engine: it answers
    every call with the row's reference completion, then with garbage."""
    from molt_envs.chat_runner import ChatAgentRunner, close_session_servers
    from molt_envs.replay_model import ByteChatTokenizer, ReplayEngine

    lo, hi = reward_range
    tokenizer, runner = ByteChatTokenizer(), ChatAgentRunner(factory)
    params = SamplingParams(max_tokens=4096, temperature=1.0)
    try:
        for i, row in enumerate(rows):
            actions = {"garbage completion": GARBAGE_ACTION}
            if row.get("reference"):
                actions = {"reference completion": str(row["reference"]), **actions}
            for what, text in actions.items():
                runs = []
                for _ in range(2 if deterministic else 1):
                    engine = ReplayEngine(tokenizer, text)
                    runs.append(await runner.execute(row["prompt"], row["label"], params, 65536, tokenizer, engine))
                segments = runs[0]
                problems = [f"episode failed: {s.failure}" for s in segments[:1] if s.failure]
                reward = segments[0].reward
                if not problems:
                    if not lo <= reward <= hi:
                        problems.append(f"reward {reward} outside the declared reward_range [{lo}, {hi}]")
                    bad = {k: v for k, v in segments[0].info.items() if not isinstance(v, int | float | bool)}
                    if bad:
                        problems.append(f"info values must be scalars for logging, got {bad!r:.120}")
                    if what == "reference completion" and reward != hi:
                        problems.append(
                            f"the reference completion scored {reward}, expected the top of the range ({hi})"
                        )
                    if deterministic and runs[1][0].reward != reward:
                        problems.append(f"declared deterministic but rewards differ: {reward} vs {runs[1][0].reward}")
                detail = "; ".join(problems) or (
                    f"reward={reward}, {len(segments)} segment(s), "
                    f"{sum(s.num_action_tokens for s in segments)} action tokens"
                )
                report.add(f"row {i}: {what} (through the session server)", not problems, detail)
    finally:
        await close_session_servers()
