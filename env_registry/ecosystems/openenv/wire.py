"""OpenEnv's wire as the ``openenv:`` scheme reads it: a server's answers (``probe``), actions parsed from a
reply by the action schema (``parse_action``), observations rendered for the model, and the errors of an episode."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from typing import Any

from env_registry.errors import EnvServerUnavailable

ENTRY_POINT = "env_registry.ecosystems.openenv.env:OpenEnvEnv"
GENERATOR = "env_registry.ecosystems.openenv.source:seed_rows"
SPLITS = {"train": {"start": 0, "size": 1000}, "test": {"start": 1_000_000, "size": 200}}
ENV_KEYS = ("timeout_s", "invalid_reward", "max_invalid_actions", "python")
SPEC_KEYS = ("reward_range", "max_turns", "seeds")
KWARG_TYPES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "timeout_s": (lambda v: isinstance(v, int | float) and v > 0, "a number of seconds > 0"),
    "invalid_reward": (lambda v: isinstance(v, int | float), "a number"),
    "max_invalid_actions": (lambda v: isinstance(v, int) and v >= 0, "an int >= 0"),
    "python": (lambda v: isinstance(v, str) and bool(v), "the path of a python interpreter"),
    "seeds": (
        lambda v: isinstance(v, list) and v and all(isinstance(s, int) and s >= 0 for s in v),
        "a list of ints >= 0, e.g. [1,2,3]",
    ),
}
PROBE_TIMEOUT_S = 10.0
DEFAULT_TIMEOUT_S = 120.0
CLOSE_TIMEOUT_S = 10.0
MCP_ACTIONS = ("Action", "CallToolAction", "ListToolsAction")  # action schema titles OpenEnv routes as MCP
_FENCED = re.compile(r"```(?:json)?[ \t]*\n?(.*?)```", re.DOTALL)
_MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
_CODE = re.compile(r"\(code: (\w+)\)\s*$")
_PROBED: dict[str, dict[str, Any]] = {}  # URL -> the server's answers, checked once per process
_PROBED_LOCK = threading.Lock()


class OpenEnvServerError(Exception):
    """The OpenEnv server failed the episode; ``failure_stage`` (None: the runner's stage) names how."""

    def __init__(self, message: str, failure_stage: str | None) -> None:
        super().__init__(message)
        self.failure_stage = failure_stage


class ActionRejected(OpenEnvServerError):
    """The server refused the action as not matching its schema (``VALIDATION_ERROR``)."""


# -- the server's answers --
def probe(base_url: str) -> dict[str, Any]:
    """``/health``, ``/schema`` and ``/metadata`` of the OpenEnv server at ``base_url``, checked.

    Returns:
        ``{"schema": {action, observation, ...}, "metadata": {name, description, version, ...}}``.

    Raises:
        EnvServerUnavailable: nothing answers there, or it is not an OpenEnv server (the message names the URL).
    """
    import httpx

    answers: dict[str, Any] = {}
    for path in ("/health", "/schema", "/metadata"):
        try:
            response = httpx.get(base_url + path, timeout=PROBE_TIMEOUT_S)
        except httpx.HTTPError as exc:
            raise EnvServerUnavailable(
                f"nothing answers at {base_url} ({type(exc).__name__}: {exc or 'no answer'}); start the OpenEnv "
                "server there, or fix the URL (openenv:http://host:port)"
            ) from None
        try:
            answers[path] = response.json() if response.status_code == 200 else None
        except ValueError:
            answers[path] = None
        if not isinstance(answers[path], dict):
            raise EnvServerUnavailable(
                f"{base_url} is not an OpenEnv server: GET {path} answered {response.status_code} "
                f"{response.text[:120]!r}, not an OpenEnv {path[1:]} object"
            )
    schema, meta = answers["/schema"], answers["/metadata"]
    problems = []
    if answers["/health"].get("status") not in ("healthy", "degraded"):
        problems.append(f"/health says {answers['/health']!r:.120}")
    if not isinstance(schema.get("action"), dict) or not isinstance(schema.get("observation"), dict):
        problems.append(f"/schema has no action and observation JSON schemas ({sorted(schema)[:8]})")
    if not isinstance(meta.get("name"), str):
        problems.append(f"/metadata has no name ({sorted(meta)[:8]})")
    if problems:
        raise EnvServerUnavailable(f"{base_url} is not an OpenEnv server: {'; '.join(problems)}")
    return {"schema": schema, "metadata": meta}


def probed(base_url: str) -> dict[str, Any]:
    """``probe(base_url)``, once per process."""
    with _PROBED_LOCK:
        if base_url not in _PROBED:
            _PROBED[base_url] = probe(base_url)
        return _PROBED[base_url]


# -- actions and observations as text --
def shown_schema(action_schema: dict[str, Any]) -> dict[str, Any]:
    """The action schema as the model is shown it: without OpenEnv's ``metadata`` field (never sent)."""
    schema = dict(action_schema)
    schema["properties"] = {k: v for k, v in schema.get("properties", {}).items() if k != "metadata"}
    if "required" in schema:
        schema["required"] = [k for k in schema["required"] if k != "metadata"]
    return schema


def raw_field(action_schema: dict[str, Any]) -> str | None:
    """The string field a raw reply fills: the action's one required field when it is a string, or, when it requires
    none, its only string field; else None."""
    properties = {k: v for k, v in action_schema.get("properties", {}).items() if k != "metadata"}
    required = [k for k in action_schema.get("required", []) if k != "metadata"]
    strings = [k for k, v in properties.items() if isinstance(v, dict) and v.get("type") == "string"]
    candidates = required if required else strings
    if len(candidates) == 1 and candidates[0] in strings:
        return candidates[0]
    return None


def parse_action(text: str, action_schema: dict[str, Any]) -> dict[str, Any]:
    """The action a reply states: a JSON object (the whole reply, its last ```json fenced block, or the text from its
    first ``{`` to its last ``}``), else, for a schema with one required string field, the raw text as that field.

    Raises:
        ValueError: the reply states no action (the message says what was expected).
    """
    blocks = _FENCED.findall(text)
    candidate = (blocks[-1] if blocks else text).strip()
    tries = [candidate]
    if "{" in candidate:
        tries.append(candidate[candidate.index("{") : candidate.rindex("}") + 1] if "}" in candidate else "")
    for attempt in tries:
        try:
            value = json.loads(attempt)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    field = raw_field(action_schema)
    if field is not None and candidate:
        return {field: candidate}
    raise ValueError(
        "the reply holds no JSON object; reply with one action as a JSON object matching the action schema"
        + (f" (or the text of {field!r})" if field else "")
    )


def render(observation: dict[str, Any]) -> str:
    """An observation as text: each field as ``name: value`` (OpenEnv's ``metadata`` and empty fields left out)."""
    lines = []
    for key, value in observation.items():
        if key == "metadata" or value is None or value in ("", [], {}):
            continue
        lines.append(f"{key}: {value if isinstance(value, str) else json.dumps(value, default=str)}")
    return "\n".join(lines) or "(empty observation)"


def render_tool_result(observation: dict[str, Any]) -> str:
    """A ``call_tool`` observation as the tool message's text: the error, the result's text contents, or its JSON."""
    error, result = observation.get("error"), observation.get("result")
    if isinstance(error, dict):
        return f"error ({error.get('error_type', 'error')}): {error.get('message', error)}"
    if error:
        return f"error: {error}"
    if isinstance(result, dict) and isinstance(result.get("content"), list):
        texts = [c.get("text", "") for c in result["content"] if isinstance(c, dict) and c.get("type") == "text"]
        text = "\n".join(texts)
        return f"error: {text}" if result.get("is_error") or result.get("isError") else text
    return result if isinstance(result, str) else json.dumps(result, default=str)


def instructions(name: str, description: str, action_schema: dict[str, Any], mcp: bool) -> str:
    """The system message of an episode: what the env is and how to act in it."""
    about = f"You are acting in the OpenEnv environment {name}"
    about += f": {description.rstrip('.')}." if description else "."
    if mcp:
        return f"{about} Act by calling its tools; each tool call is one step (a reply without one is invalid)."
    field = raw_field(action_schema)
    return (
        f"{about}\nEach turn, reply with exactly one action: a JSON object (optionally in a ```json block) matching "
        f"this JSON schema:\n```json\n{json.dumps(shown_schema(action_schema))}\n```"
        + (f"\nOr reply with just the value of {field!r} as plain text." if field else "")
    )


# -- tasks --


def _server_error(message: str) -> OpenEnvServerError:
    """The exception for an OpenEnv ``error`` answer, by its code."""
    match = _CODE.search(message)
    code = match[1] if match else "UNKNOWN"
    if code == "VALIDATION_ERROR":
        return ActionRejected(f"the server refused it: {message}", None)
    stage = {"CAPACITY_REACHED": "remote_capacity", "FACTORY_ERROR": "make", "EXECUTION_ERROR": None}
    return OpenEnvServerError(message, stage.get(code, "remote_protocol"))
