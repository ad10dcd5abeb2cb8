"""LLM-as-judge: the client an ``Env.step`` or a ``ChatAgent.run`` grades with, and the error a failed call raises.

A run hands every episode one ``JudgeClient`` (``StepState["judge"]``, ``ChatContext.judge``; None when the run has
no judge) that points at an OpenAI-compatible chat endpoint: during training the trainer's judge server, in front of
the rollout engine itself (the current policy) or of a frozen judge model on an engine of its own
(``molt-train rl --judge.*``); elsewhere any endpoint (a runner's ``judge`` attribute). The endpoint is not a rollout
session, so a judge call is never captured as policy tokens.

A call that errors, answers nothing or runs past ``timeout_s`` raises ``JudgeError``, which ends the episode as
``failure_judge`` (counted in ``rollout/dropped/failure_judge``, never a silent reward 0). ``JudgeClient.stats``
counts calls, failures, timeouts and seconds for the metrics (``judge/*``).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any


class JudgeError(RuntimeError):
    """Raised when a judge call fails (error, timeout, empty or unusable reply): the episode ends as
    ``failure_judge``."""

    failure_stage = "judge"  # runners.failure_reason names the drop reason after it


@dataclass
class JudgeStats:
    """What the judge calls of one client did so far (the trainer logs the differences per batch)."""

    calls: int = 0
    failures: int = 0
    timeouts: int = 0
    seconds: float = 0.0
    completion_tokens: int = 0

    def snapshot(self) -> dict[str, float]:
        return {k: float(v) for k, v in vars(self).items()}


@dataclass
class JudgeClient:
    """An OpenAI-compatible chat endpoint an env grades with.

    Attributes:
        base_url: for ``openai.AsyncOpenAI(base_url=...)`` (``http://host:port/judge/v1`` for the trainer's).
        model, api_key: what the SDK sends (the trainer's judge server checks neither).
        timeout_s: a call running longer raises ``JudgeError`` (``--judge.timeout_s``).
        max_tokens: the reply's budget unless a call asks for another. temperature: 0 is greedy.
        stats: counters shared by every episode handed this client.
    """

    base_url: str
    model: str = "judge"
    api_key: str = "EMPTY"
    timeout_s: float = 60.0
    max_tokens: int = 32
    temperature: float = 0.0
    stats: JudgeStats = field(default_factory=JudgeStats)

    async def complete(
        self, messages: list[dict[str, Any]], *, max_tokens: int | None = None, temperature: float | None = None
    ) -> str:
        """The judge's reply to ``messages``.

        Args:
            messages: OpenAI chat messages (the rubric and what to grade).
            max_tokens, temperature: this call's, instead of the client's.

        Returns:
            The reply's text (never empty).

        Raises:
            JudgeError: the call failed, timed out or the reply was empty.
        """
        try:
            from openai import AsyncOpenAI
        except ImportError:
            raise JudgeError("the judge client needs the openai package: pip install openai") from None
        self.stats.calls += 1
        start = time.perf_counter()
        try:
            async with AsyncOpenAI(base_url=self.base_url, api_key=self.api_key, max_retries=0) as client:
                reply = await asyncio.wait_for(
                    client.chat.completions.create(
                        model=self.model,
                        messages=messages,
                        max_tokens=max_tokens or self.max_tokens,
                        temperature=self.temperature if temperature is None else temperature,
                    ),
                    self.timeout_s,
                )
        except TimeoutError:
            self.stats.failures += 1
            self.stats.timeouts += 1
            raise JudgeError(f"the judge at {self.base_url} did not answer within {self.timeout_s:g} s") from None
        except Exception as exc:
            self.stats.failures += 1
            raise JudgeError(f"the judge call to {self.base_url} failed: {type(exc).__name__}: {exc}") from exc
        finally:
            self.stats.seconds += time.perf_counter() - start
        text = reply.choices[0].message.content if reply.choices else None
        if reply.usage is not None:
            self.stats.completion_tokens += reply.usage.completion_tokens
        if not text:
            self.stats.failures += 1
            raise JudgeError(f"the judge at {self.base_url} answered nothing")
        return text
