"""Drive an ``Env`` turn by turn at the chat level: messages to a model, its reply to ``Env.step``.

This is how an ``Env`` ID is evaluated against an endpoint (and how ``--reverify`` replays stored actions). The
conversation is a list of OpenAI-shaped chat messages: the env's first observation, then per turn the model's reply
(an assistant message, tool calls included) and the env's observation messages. The text ``Env.step`` receives as
``action_text`` is the reply's content followed by its tool calls written back as Hermes/Qwen
``<tool_call>{json}</tool_call>`` blocks (the format ``molt_envs.tool_calls`` parses), since an endpoint returns them
parsed. ``observation_text`` is the conversation as plain ``role: content`` lines: an endpoint does not say how its
template renders it.

An env whose observation is raw text (a ``str`` in the model's own chat format) cannot be sent to a chat endpoint:
that episode ends with the ``unsupported_observation`` failure (evaluate such envs in process: ``molt-train eval``).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from env_registry.evaluation.episode import Episode, Failure
from molt_envs import Env, Result, SamplingParams

TURN_CAP = 64  # turns of an env that declares no max_turns; the sample's timeout bounds it too


@dataclass
class Reply:
    """A model's answer to one chat request, wire-neutral."""

    content: str
    tool_calls: list[dict[str, Any]] = field(
        default_factory=list
    )  # OpenAI shape: {id, type, function{name, arguments}}
    finish_reason: str = "stop"
    prompt_tokens: int | None = None
    completion_tokens: int | None = None

    def message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        return message


Generate = Callable[[list[dict[str, Any]], list[dict[str, Any]] | None, SamplingParams], Awaitable[Reply]]


def action_text(reply: Reply) -> str:
    """The reply as ``Env.step`` reads it: content, then each tool call as a ``<tool_call>`` block."""
    blocks = []
    for call in reply.tool_calls:
        fn = call.get("function", {})
        try:
            arguments = json.loads(fn.get("arguments") or "{}")
        except ValueError:
            arguments = fn.get("arguments")
        blocks.append("<tool_call>\n" + json.dumps({"name": fn.get("name"), "arguments": arguments}) + "\n</tool_call>")
    return "\n".join([reply.content, *blocks]) if blocks else reply.content


def as_text(messages: list[dict[str, Any]]) -> str:
    return "\n".join(f"{m['role']}: {m.get('content') or ''}" for m in messages)


def answer_tool_calls(observation: list[dict[str, Any]], reply: Reply) -> list[dict[str, Any]]:
    """Tool messages without a ``tool_call_id`` answer the reply's calls in order (endpoints require the id)."""
    ids = iter(call.get("id") for call in reply.tool_calls)
    out = []
    for message in observation:
        message = dict(message)
        if message.get("role") == "tool" and not message.get("tool_call_id"):
            message["tool_call_id"] = next(ids, None) or f"call_{uuid.uuid4().hex[:12]}"
        out.append(message)
    return out


async def drive_env(
    env: Env,
    row: dict[str, Any],
    generate: Generate,
    params: SamplingParams,
    max_turns: int | None,
    allow_raw: bool = False,
) -> Episode:
    """Play one episode of ``env`` on ``row``; failures end it with a reason, never an exception.

    Args:
        env: a fresh env instance (closed here, however the episode ends).
        row: the dataset row (``prompt``, ``label``).
        generate: asks the model for one reply to the conversation so far.
        params: sampling parameters of this sample (``Result.sampling_params`` may replace them for later turns).
        max_turns: the spec's turn cap (None: ``TURN_CAP``).
        allow_raw: keep raw-text observations (as ``{"role": "observation"}`` entries) instead of failing: for
            replays, which send nothing to a model.
    """
    episode = Episode(prompt_tokens=0, completion_tokens=0)
    stage = "reset"
    messages: list[dict[str, Any]] = []
    reward = 0.0
    try:
        start = await env.reset({"observation": row["prompt"], "label": row["label"], "images": []})
        observation, tools = start["observation"], start.get("tools")
        if isinstance(observation, str):
            if not allow_raw:
                episode.failure = _raw_text("reset")
                return episode
            observation = [{"role": "observation", "content": observation}]
        messages = [dict(m) for m in observation]
        for turn in range(max_turns or TURN_CAP):
            stage = "generate"
            reply = await generate(messages, tools, params)
            _count(episode, reply)
            action = action_text(reply)
            episode.actions.append(action)
            messages.append(reply.message())
            stage = "step"
            result = await env.step(
                {
                    "observation_text": as_text(messages),
                    "action_text": action,
                    "label": row["label"],
                    "sampling_params": params.updated(),
                    "turn": turn,
                    "images": [],
                }
            )
            if not isinstance(result, Result):
                episode.failure = Failure("invalid_result", f"Env.step returned {type(result).__name__}, not a Result")
                return episode
            episode.turns = turn + 1
            reward += result.reward
            episode.score, episode.info = result.score, dict(result.info)
            episode.truncated |= result.truncated or reply.finish_reason == "length"
            if result.observation:
                if isinstance(result.observation, str):
                    if not allow_raw:
                        episode.failure = _raw_text("step")
                        return episode
                    messages.append({"role": "observation", "content": result.observation})
                else:
                    messages += answer_tool_calls(result.observation, reply)
            params = SamplingParams.coerce(result.sampling_params, params)
            if result.terminated or episode.truncated:
                break
        else:
            episode.truncated = True  # the turn cap ended it
        episode.reward = reward
        if episode.score is None:
            episode.score = reward
        return episode
    except Exception as exc:  # failure isolation: the sample records why
        reason = (
            getattr(exc, "failure_reason", None)
            or {
                "generate": "endpoint_error",
                "step": "grader_error",
                "reset": "env_error",
            }[stage]
        )
        if stage == "step" and isinstance(exc, TimeoutError):
            reason = "grader_timeout"
        episode.failure = Failure(reason, f"{stage}: {type(exc).__name__}: {exc}"[:2000])
        return episode
    finally:
        episode.transcript = messages
        try:
            await env.close()
        except Exception as exc:
            if episode.failure is None:
                episode.failure = Failure("env_error", f"close: {type(exc).__name__}: {exc}"[:2000])
                episode.reward = episode.score = None


def _count(episode: Episode, reply: Reply) -> None:
    for name in ("prompt_tokens", "completion_tokens"):
        value = getattr(reply, name)
        if value is None or getattr(episode, name) is None:
            setattr(episode, name, None)
        elif name == "completion_tokens":
            episode.completion_tokens += value
        elif episode.prompt_tokens == 0:
            episode.prompt_tokens = value  # the first request's prompt, as in-process runners count it


def _raw_text(where: str) -> Failure:
    return Failure(
        "unsupported_observation",
        f"Env.{where} returned a raw-text observation (a str in the model's own chat format), which a chat endpoint "
        "cannot take; return chat messages, or evaluate this env in process with `molt-train eval`",
    )
