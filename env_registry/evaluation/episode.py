"""What a policy hands back for one sample (``Episode``), the ``Policy`` interface, and failure reasons.

A failure is data, not a crash: every sample that could not be completed (or ended on an invalid action) carries a
``Failure`` whose ``reason`` is one of ``REASONS``, counted in the summary; its ``detail`` says what happened.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from typing import Any

from molt_envs import SamplingParams

REASONS = (
    "timeout",  # the sample ran past --timeout
    "endpoint_error",  # the model endpoint refused or failed (after its retries), or could not be reached
    "engine_error",  # the in-process engine failed to generate
    "grader_error",  # Env.step (the grader) raised
    "grader_timeout",  # the grader timed out
    "invalid_action",  # the env ended the episode on an action it could not parse (info["invalid_action"])
    "invalid_result",  # the env or agent returned something that is not a Result
    "env_error",  # making, resetting or closing the env raised
    "agent_error",  # a ChatAgent's run raised
    "prompt_too_long",  # the prompt leaves no room to generate
    "unsupported_observation",  # raw-text observations cannot be sent to a chat endpoint
    "no_generation",  # a ChatAgent finished without calling the model
    "replay_diverged",  # --reverify: the env asked for more model turns than the stored sample holds
)

# exception classes of the stock SDKs and httpx: the endpoint's fault, not the env's
ENDPOINT_EXCEPTIONS = {
    "APIConnectionError",
    "APITimeoutError",
    "APIStatusError",
    "APIError",
    "APIResponseValidationError",
    "RateLimitError",
    "InternalServerError",
    "BadRequestError",
    "AuthenticationError",
    "PermissionDeniedError",
    "NotFoundError",
    "ConflictError",
    "UnprocessableEntityError",
    "OverloadedError",
    "ServiceUnavailableError",
    "ConnectError",
    "ReadTimeout",
    "RemoteProtocolError",
    "EndpointError",
}
_FAILURE = re.compile(r"^(?P<stage>[\w ]+): (?P<exc>\w+): ?(?P<message>.*)$", re.DOTALL)


@dataclass
class Failure:
    reason: str
    detail: str = ""


@dataclass
class Episode:
    """One sample's outcome. ``reward``/``score`` are None when the episode did not complete."""

    reward: float | None = None
    score: float | None = None
    info: dict[str, Any] = field(default_factory=dict)
    transcript: Any = None  # chat messages (endpoints) or the decoded context text (in-process engines)
    actions: list[Any] = field(default_factory=list)  # Env: texts given to step; ChatAgent: the model's replies
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    turns: int = 0
    truncated: bool = False
    failure: Failure | None = None
    request: dict[str, Any] | None = None  # one request with n: {"n", "choice", "seed"} of the reply it got

    @classmethod
    def failed(cls, reason: str, detail: str, **fields: Any) -> Episode:
        return cls(failure=Failure(reason, detail[:2000]), **fields)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def classify(failure: str, generate_reason: str = "engine_error") -> Failure:
    """A runner's ``Trajectory.failure`` text (``"<stage>: <Exception>: <message>"``) as a ``Failure``.

    Args:
        failure: the text the runner recorded.
        generate_reason: what a failure while generating counts as (``engine_error`` in process, ``endpoint_error``
            through an endpoint).
    """
    match = _FAILURE.match(failure)
    if match is None:
        if "nothing was generated" in failure or "without a model call" in failure:
            return Failure("no_generation", failure)
        return Failure("agent_error", failure)
    stage, exc, message = match["stage"], match["exc"], match["message"]
    if exc in ENDPOINT_EXCEPTIONS:
        return Failure("endpoint_error", failure)
    if stage == "step":
        return Failure("grader_timeout" if exc == "TimeoutError" else "grader_error", failure)
    if stage == "generate":
        return Failure(generate_reason, failure)
    if stage == "tokenize" and "leaves no room" in message:
        return Failure("prompt_too_long", failure)
    if exc == "TypeError" and "must return a molt_envs.Result" in message:
        return Failure("invalid_result", failure)
    if stage in ("make", "reset", "close", "tokenize"):
        return Failure("env_error", failure)
    if stage == "start server":
        return Failure(generate_reason, failure)
    if exc == "TimeoutError":
        return Failure("timeout", failure)
    return Failure("agent_error", failure)


def invalid_action(info: dict[str, Any]) -> Failure | None:
    """The env's own verdict that the model's action was invalid (``info["invalid_action"]`` truthy)."""
    return Failure("invalid_action", "the env reported info['invalid_action']") if info.get("invalid_action") else None


class Policy(ABC):
    """What an eval samples from: a local engine, or a model endpoint. One instance serves a whole eval.

    ``name`` identifies the model in the summary (``hf:/path``, ``http://host/v1 model=policy wire=openai``).
    """

    name: str = ""
    generate_reason: str = "engine_error"  # what a failure to generate counts as

    async def start(self) -> None:  # noqa: B027  (optional hook)
        """Called once before the first sample (open clients, probe the endpoint)."""

    async def close(self) -> None:  # noqa: B027  (optional hook)
        """Called once after the last sample."""

    def separate_because(self, task: Any) -> str | None:
        """Why the samples of one prompt of ``task`` go one request each; None: one request with ``n`` may serve
        them all (``run_choices``)."""
        return "an in-process engine batches concurrent samples itself"

    async def run_choices(self, task: Any, row: dict[str, Any], params: list[SamplingParams]) -> list[Episode]:
        """Play ``len(params)`` episodes of one row whose first replies come from one request with ``n``; called
        only where ``separate_because`` is None.

        Args:
            task, row: as for ``run``.
            params: each sample's parameters; the request is sent with the first one's seed.

        Returns:
            One episode per entry of ``params``, in order.
        """
        raise NotImplementedError(f"{type(self).__name__} sends every sample as a request of its own")

    def requests(self, env_id: str) -> dict[str, int]:
        """How many requests served ``env_id``'s samples in this run, by kind (``n_requests``, ``single_requests``)."""
        return {}

    @abstractmethod
    async def run(self, task: Any, row: dict[str, Any], params: SamplingParams) -> Episode:
        """Play one episode of ``task`` (an ``EnvTask``) on dataset ``row``; never raises for the episode's failures.

        Args:
            task: the env (spec, factory) being evaluated.
            row: a normalized dataset row (``prompt``, ``label``, ``reference``).
            params: this sample's sampling parameters (its own seed).

        Returns:
            The episode, with ``failure`` set when it did not complete.
        """
