"""The agent contract: what an environment author writes against.

Two shapes, one result type:

- ``Env``: the framework owns the LLM loop. Each turn the runner generates an action and calls
  ``await env.step(state)``; the env answers with a ``Result`` (Gymnasium's step tuple plus extras).
- ``ChatAgent``: the author owns the loop and talks to the policy through a stock OpenAI or Anthropic SDK
  pointed at ``ctx.base_url`` / ``ctx.session_url``; ``run(ctx)`` returns the final ``Result``.

A fresh ``Env``/``ChatAgent`` instance lives for exactly one episode.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from typing import Any, NotRequired, TypedDict

from molt_envs.judge import JudgeClient


@dataclass
class SamplingParams:
    """Sampling parameters pinned on every generate call (engines never fill them from model defaults).

    Attributes:
        temperature: >= 0; 0 is greedy (log-probs then at temperature 1).
        top_p: nucleus mass in (0, 1]. top_k: -1 (off) or >= 1.
        max_tokens: most tokens to generate. min_tokens: fewest before a stop token may end the turn.
        stop_token_ids: tokens that end a turn (None: the tokenizer's end-of-sequence tokens).
        seed: per-request sampling seed (None: unseeded).

    Raises:
        ValueError: for a value out of range (the message names the field and the value).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: no top-k filtering
    max_tokens: int = 256
    min_tokens: int = 0
    stop_token_ids: list[int] | None = None  # None: the tokenizer's end-of-sequence tokens
    seed: int | None = None

    def __post_init__(self) -> None:
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (off) or >= 1, got {self.top_k!r}")
        if self.max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {self.max_tokens!r}")

    def updated(self, **changes: Any) -> SamplingParams:
        """A copy with ``changes`` applied (validated again).

        Raises:
            ValueError: for a value out of range. TypeError: for an unknown field.
        """
        return replace(self, **changes)

    @classmethod
    def coerce(cls, value: SamplingParams | dict | None, base: SamplingParams | None = None) -> SamplingParams:
        """Accept a SamplingParams, a dict of overrides on ``base``, or None (keep ``base``).

        Args:
            value: what an env or a caller handed over.
            base: the params the overrides apply to (default: ``SamplingParams()``).

        Returns:
            The params to use.

        Raises:
            TypeError: if ``value`` is none of those (or a dict names an unknown field).
            ValueError: for an override out of range.
        """
        base = base or cls()
        if value is None:
            return base
        if isinstance(value, SamplingParams):
            return value
        if isinstance(value, dict):
            return replace(base, **value)
        raise TypeError(f"sampling_params must be SamplingParams, dict or None, got {type(value).__name__}")


@dataclass
class Result:
    """What ``Env.step`` and ``ChatAgent.run`` return: Gymnasium's step tuple plus extras.

    ``observation`` is the next turn's input. A list of chat messages (``[{"role": "user", "content": ...}]``, or
    ``"tool"`` messages) is rendered by the model's own chat template as the turn that follows the model's action,
    so an env works with any model; a ``str`` is raw text appended as is (it must already be in the model's chat
    format). Either way the runner appends it as masked tokens.

    Attributes:
        reward: this turn's reward (a number or a one-element tensor/array; summed over an episode's turns).
        observation: the next turn's input, as above (masked: not trained on).
        terminated: the episode is over. truncated: it was cut short (recorded on the trajectory).
        info: anything JSON-like to keep with the trajectory.
        score: for dynamic filtering and dashboards (default: ``reward``).
        images: images for the next turn (PIL images), added to the context.
        sampling_params: replaces (``SamplingParams``) or overrides (dict) the params of later turns.

    Raises:
        TypeError: for a reward/score that is not a number, an observation that is neither a str nor a list of
            messages with a ``"role"``, or info that is not a dict.
        ValueError: for a non-finite reward or score, or an empty tensor.
    """

    reward: float = 0.0
    observation: str | list[dict[str, Any]] = ""  # raw text, or chat messages the runner renders (see below)
    terminated: bool = True
    truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    score: float | None = None  # dynamic filtering / dashboards; defaults to reward
    images: list[Any] | None = None  # next-turn images (PIL images)
    sampling_params: SamplingParams | dict | None = None  # replaces the params of later turns

    def __post_init__(self) -> None:
        self.reward = _scalar("reward", self.reward)
        self.score = self.reward if self.score is None else _scalar("score", self.score)
        if isinstance(self.observation, list):
            for message in self.observation:
                if not (isinstance(message, dict) and isinstance(message.get("role"), str)):
                    raise TypeError(f"Result.observation messages must be dicts with a 'role', got {message!r}")
        elif not isinstance(self.observation, str):
            raise TypeError(
                f"Result.observation must be a str or a list of chat messages, got {type(self.observation).__name__}"
            )
        if not isinstance(self.info, dict):
            raise TypeError(f"Result.info must be a dict, got {type(self.info).__name__}")


def _scalar(name: str, value: Any) -> float:
    """Reduce a number or a one-element tensor/array to a finite float."""
    if value is None:
        raise TypeError(f"Result.{name} must be a number, got None")
    if hasattr(value, "reshape") and hasattr(value, "tolist"):  # torch tensor / numpy array, without importing them
        flat = value.reshape(-1).tolist()
        if not flat:
            raise ValueError(f"Result.{name} is an empty tensor")
        value = flat[0]
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"Result.{name} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise ValueError(f"Result.{name} must be finite, got {number!r}")
    return number


class StepState(TypedDict):
    """What ``Env.step`` receives each turn: ``observation_text`` (the whole context so far, as text),
    ``action_text`` (the model's latest generation, special tokens kept), ``label``, ``sampling_params`` (a copy of
    this turn's params), ``turn`` (0-based), ``images`` (every image in the context so far) and ``judge`` (the run's
    ``JudgeClient`` for LLM-as-judge rewards, or None)."""

    observation_text: str  # the whole context so far, as text
    action_text: str  # the model's latest generation (special tokens kept)
    label: Any
    sampling_params: SamplingParams  # a copy of this turn's params
    turn: int  # 0-based turn index
    images: list[Any]  # every image in the context so far
    judge: NotRequired[JudgeClient | None]  # LLM-as-judge endpoint of the run (None: the run has no judge)


class Env(ABC):
    """Gymnasium-style environment whose LLM loop the framework drives.

    ``reset`` is optional: it receives ``{"observation": prompt, "label": label, "images": images}`` and returns
    the same shape; its ``"observation"`` becomes the first model input (a ``"tools"`` list of OpenAI function
    schemas, if present, is rendered into the prompt by the chat template). ``step`` grades/advances one turn.
    ``close`` runs once when the episode ends, however it ends: release sandboxes and other resources there.
    """

    spec: Any = None  # the registry stamps the EnvSpec it was made from

    async def reset(self, state: dict[str, Any]) -> dict[str, Any]:
        """Start the episode.

        Args:
            state: ``{"observation": prompt, "label": label, "images": images}`` from the dataset row.

        Returns:
            The same shape; its ``"observation"`` (a string, or chat messages for the template) is the first model
            input, and an optional ``"tools"`` list of OpenAI function schemas is rendered into it.
        """
        return state

    async def close(self) -> None:
        """Release what the episode holds (sandboxes, files); runs once however the episode ended."""
        return None

    @abstractmethod
    async def step(self, state: StepState) -> Result:
        """Grade or advance one turn.

        Args:
            state: this turn's ``StepState``.

        Returns:
            The turn's ``Result``; ``terminated`` ends the episode. An exception ends only this episode, recorded
            in ``Trajectory.failure``.
        """


@dataclass
class ChatContext:
    """Everything a ``ChatAgent`` gets for one rollout.

    Attributes:
        messages: the prompt as chat messages. tools: OpenAI function schemas of the row, or None.
        prompt: the last user turn's text. label: the row's label. images: the row's images, or None.
        base_url: for ``openai.AsyncOpenAI(base_url=...)``. session_url: for ``anthropic.AsyncAnthropic(base_url=...)``.
        model_name, api_key: what to pass to the SDK (the session's own key: checked on ``session_socket`` only).
        session_id: this rollout's session. sampling_params: the run's params (requests may override some).
        max_length: the token budget of the whole conversation.
        judge: the run's ``JudgeClient`` for LLM-as-judge rewards, or None.
    """

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    prompt: str  # the last user turn's text
    label: Any
    images: list[Any] | None
    base_url: str  # OpenAI client: http://host:port/s/<sid>/v1
    session_url: str  # Anthropic client (it appends /v1/messages itself): http://host:port/s/<sid>
    model_name: str
    api_key: str
    session_id: str
    sampling_params: SamplingParams
    max_length: int
    # a unix socket serving this session's routes, for clients in a sandbox (bind its directory in; see
    # molt_envs.harness); None where the session server is not in this process
    session_socket: str | None = None
    # the run's LLM-as-judge endpoint (molt_envs.judge), not a rollout session: its calls are never captured
    judge: JudgeClient | None = None


class ChatAgent(ABC):
    """An agent that owns its loop and calls the policy through the OpenAI or Anthropic wire."""

    spec: Any = None

    @abstractmethod
    async def run(self, ctx: ChatContext) -> Result:
        """Run one rollout: talk to the policy through a stock SDK pointed at ``ctx``'s URLs, then grade.

        Args:
            ctx: the rollout's ``ChatContext``.

        Returns:
            The final ``Result`` (its reward goes on every captured segment). An exception ends only this
            rollout, recorded in ``Trajectory.failure``.
        """
