"""``EndpointPolicy``: any OpenAI- or Anthropic-compatible endpoint, through the stock SDKs.

- ``Env`` IDs: ``chat_driver.drive_env`` sends the conversation with ``openai.AsyncOpenAI`` (``--wire openai``) or
  ``anthropic.AsyncAnthropic`` (``--wire anthropic``), one request per turn.
- ``game`` IDs: the model plays one seat (``OneSeatEnv``: the label's ``model_seat``, else the first), the others
  their scripted policies, driven like an ``Env``.
- ``ChatAgent`` IDs: the agent's own SDK calls go to the endpoint, through the ``RecordingProxy`` (transcripts,
  token counts, ``--reverify``).
- A ``molt-train serve`` endpoint (a molt session server, recognized by its ``/health``) gets one session per
  sample (``POST /sessions`` with the sample's sampling parameters, seed included; deleted after the sample), since
  its chat routes live under ``/s/<session>/``.

``-n`` samples of a single-turn ``Env`` ID (``max_turns = 1``) on the OpenAI wire go as **one request with ``n``** per
prompt (``run_choices``): each sample takes one choice, with its own token counts where the endpoint reports them
per choice (``molt-train serve`` does; an endpoint that reports only the request's summed usage leaves a sample's
``completion_tokens`` unknown). An endpoint that answers ``n`` with a 400 (while the same conversation without
``n`` succeeds) or with fewer choices is marked as refusing ``n``: that prompt's samples, and every later one's, go
as separate requests. Multi-turn envs, games, ChatAgents and the Anthropic wire always send one request per sample.

The SDKs retry 429, 5xx and connection failures with exponential back-off (``max_retries``); what still fails is
counted as ``endpoint_error``. The endpoint is probed once at start, so an unreachable one is a clear error before
any sample.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections import Counter
from typing import Any

from env_registry.errors import Error
from env_registry.evaluation.chat_driver import Reply, action_text, drive_env
from env_registry.evaluation.episode import Episode, Failure, Policy, classify
from env_registry.evaluation.tasks import EnvTask
from molt_envs import ChatContext, Result, SamplingParams
from molt_envs.seats import Game, OneSeatEnv

WIRES = ("openai", "anthropic")
PROBE_TIMEOUT_S = 10.0


class EndpointError(Error):
    """The model endpoint cannot be reached, or refuses the eval's requests."""


def split_base(base_url: str, wire: str) -> tuple[str, str]:
    """``(openai_base, anthropic_root)`` from ``--base-url``: the OpenAI SDK's base ends in ``/v1``, the Anthropic
    SDK's root does not (it appends ``/v1/messages`` itself)."""
    base = base_url.rstrip("/")
    root = base[: -len("/v1")] if base.endswith("/v1") else base
    if wire == "openai":
        return base, root
    return root + "/v1", root


class EndpointPolicy(Policy):
    """Sample from a model endpoint.

    Args:
        base_url: what the wire's SDK takes (``http://host:8000/v1`` for OpenAI, ``http://host:8000`` for Anthropic).
        model_name: the ``model`` field of every request.
        wire: ``openai`` or ``anthropic`` (the SDK ``Env`` IDs are driven with).
        api_key: sent as the SDK's key (``EMPTY`` for local servers).
        max_retries: SDK retries of 429/5xx/connection failures, with exponential back-off.
        request_timeout_s: one request's timeout.
        max_length: the context budget a ChatAgent is told (``ChatContext.max_length``).
        use_n: send a single-turn env's samples of one prompt as one request with ``n`` (False: one request each).
    """

    generate_reason = "endpoint_error"

    def __init__(
        self,
        base_url: str,
        model_name: str,
        wire: str = "openai",
        api_key: str = "EMPTY",
        max_retries: int = 4,
        request_timeout_s: float = 600.0,
        max_length: int = 32768,
        use_n: bool = True,
    ) -> None:
        if wire not in WIRES:
            raise Error(f"--wire {wire!r} is not supported; choose one of {', '.join(WIRES)}")
        if not base_url.startswith(("http://", "https://")):
            raise Error(f"--base-url {base_url!r} must be an http(s):// URL, e.g. http://127.0.0.1:8000/v1")
        self.base_url, self.model_name, self.wire = base_url.rstrip("/"), model_name, wire
        self.api_key, self.max_retries, self.timeout = api_key, max_retries, request_timeout_s
        self.max_length = max_length
        self.name = f"{self.base_url} model={model_name} wire={wire}"
        self.openai_base, self.root = split_base(self.base_url, wire)
        self.sessions = False  # a molt session server: one session per sample
        self.n_refused: str | None = None if use_n else "use_n=False"  # why n is not sent
        self.counts: dict[str, Counter] = {}  # env id -> requests sent, by kind
        self.http: Any = None
        self.client: Any = None
        self.proxy: Any = None

    async def start(self) -> None:
        import httpx

        limits = httpx.Limits(max_connections=None, max_keepalive_connections=1024)
        self.http = httpx.AsyncClient(timeout=httpx.Timeout(self.timeout, connect=PROBE_TIMEOUT_S), limits=limits)
        await self._probe()
        self.client = self._sdk_client()

    def _sdk_client(self) -> Any:
        try:
            if self.wire == "openai":
                from openai import AsyncOpenAI

                return AsyncOpenAI(
                    base_url=self.openai_base, api_key=self.api_key, max_retries=self.max_retries, timeout=self.timeout
                )
            from anthropic import AsyncAnthropic

            return AsyncAnthropic(
                base_url=self.root, api_key=self.api_key, max_retries=self.max_retries, timeout=self.timeout
            )
        except ImportError as exc:
            raise Error(f"--wire {self.wire} needs the {exc.name!r} SDK; pip install 'molt-ecosystem[eval]'") from None

    async def _probe(self) -> None:
        """Is it reachable, and is it a molt session server (``GET /health`` with a ``sessions`` count)?"""
        import httpx

        try:
            response = await self.http.get(f"{self.root}/health", timeout=PROBE_TIMEOUT_S)
        except httpx.HTTPError as exc:
            raise EndpointError(
                f"cannot reach the endpoint --base-url {self.base_url}: {type(exc).__name__}: {exc or 'no answer'}; "
                "is the server running, and is the URL right (e.g. http://127.0.0.1:8000/v1)?"
            ) from None
        try:
            health = response.json() if response.status_code == 200 else {}
        except ValueError:
            health = {}
        self.sessions = isinstance(health, dict) and "sessions" in health and health.get("status") == "ok"

    async def close(self) -> None:
        if self.proxy is not None:
            await self.proxy.stop()
        if self.client is not None:
            await self.client.close()
        if self.http is not None:
            await self.http.aclose()

    # -- one sample --
    async def run(self, task: EnvTask, row: dict[str, Any], params: SamplingParams) -> Episode:
        session = await self._open_session(params) if self.sessions else None
        try:
            if task.spec.kind == "chat_agent":
                return await self._run_agent(task, row, params, session)
            client = self.client if session is None else self._session_client(session)
            return await self._episode(task, row, self._generator(client, task.env_id), params)
        finally:
            if session is not None:
                await self._call_server("DELETE", f"/sessions/{session['session_id']}", ok_missing=True)

    # -- the samples of one prompt, one request with n --
    def separate_because(self, task: EnvTask) -> str | None:
        if self.wire != "openai":
            return "the anthropic wire has no n"
        if task.spec.kind != "env":
            return f"a {task.spec.kind} ID: each sample's calls are its own"
        if task.spec.max_turns != 1:
            return "a multi-turn env (max_turns is not 1): each sample's conversation takes its own turns"
        return self.n_refused

    def requests(self, env_id: str) -> dict[str, int]:
        return dict(self.counts.get(env_id, {}))

    async def run_choices(self, task: EnvTask, row: dict[str, Any], params: list[SamplingParams]) -> list[Episode]:
        """The episodes of one prompt; the first to ask for a reply sends one request with ``n = len(params)`` and
        each episode takes one choice, in the order they ask (a refusal of ``n``: each asks on its own instead)."""
        session = await self._open_session(params[0]) if self.sessions else None
        try:
            client = self.client if session is None else self._session_client(session)
            single = self._generator(client, task.env_id)
            shared: dict[str, Any] = {}
            order = itertools.count()
            n = len(params)

            def generator(request: dict[str, Any]) -> Any:
                async def generate(messages, tools, sample: SamplingParams) -> Reply:
                    choice, asked = next(order), json.dumps([messages, tools], sort_keys=True, default=str)
                    if "replies" not in shared:
                        shared["asked"] = asked
                        shared["replies"] = asyncio.ensure_future(
                            self._n_request(client, task.env_id, messages, tools, params[0], n, shared)
                        )
                    replies = await shared["replies"]
                    if choice < len(replies) and shared["asked"] == asked:
                        request.update(n=n, choice=choice, seed=params[0].seed)
                        return replies[choice]
                    reply = await single(messages, tools, sample)
                    if shared.get("refused") and not self.n_refused:  # the same conversation works without n
                        self.n_refused = shared["refused"]
                    return reply

                return generate

            requests = [{} for _ in params]
            episodes = await asyncio.gather(
                *(self._episode(task, row, generator(r), p) for r, p in zip(requests, params, strict=True))
            )
            for episode, request in zip(episodes, requests, strict=True):
                episode.request = request or None
            return list(episodes)
        finally:
            if session is not None:
                await self._call_server("DELETE", f"/sessions/{session['session_id']}", ok_missing=True)

    async def _n_request(
        self, client: Any, env_id: str, messages, tools, params: SamplingParams, n: int, shared: dict[str, Any]
    ) -> list[Reply]:
        """One request with ``n``: its choices, or none where the endpoint refused ``n`` (why: ``shared["refused"]``)."""
        from openai import BadRequestError

        self.counts.setdefault(env_id, Counter())["n_requests"] += 1
        try:
            response = await client.chat.completions.create(**self._request(messages, tools, params), n=n)
        except BadRequestError as exc:
            shared["refused"] = f"the endpoint answered n={n} with HTTP 400 ({str(exc.message)[:200]})"
            return []
        replies = openai_replies(response.model_dump())
        if len(replies) < n:
            shared["refused"] = self.n_refused = f"the endpoint answered n={n} with {len(replies)} choice(s)"
        return replies

    def _request(self, messages, tools, params: SamplingParams) -> dict[str, Any]:
        return {
            "model": self.model_name,
            "messages": messages,
            **({"tools": tools} if tools else {}),
            "temperature": params.temperature,
            "top_p": params.top_p,
            "max_tokens": params.max_tokens,
            **({"seed": params.seed} if params.seed is not None else {}),
        }

    async def _episode(self, task: EnvTask, row: dict[str, Any], generate: Any, params: SamplingParams) -> Episode:
        """One ``Env`` (or game seat) episode on ``row`` through ``generate``."""
        try:
            env = task.factory()
            if isinstance(env, Game):  # the model plays one seat, the others their scripted policies
                env = OneSeatEnv(env)
        except Exception as exc:
            return Episode.failed("env_error", f"make: {type(exc).__name__}: {exc}")
        return await drive_env(env, row, generate, params, task.spec.max_turns)

    def _session_client(self, session: dict[str, Any]) -> Any:
        base = session["base_url"] if self.wire == "openai" else session["session_url"]
        return self.client.with_options(base_url=base)

    async def _open_session(self, params: SamplingParams) -> dict[str, Any]:
        body = {
            "sampling_params": {
                "temperature": params.temperature,
                "top_p": params.top_p,
                "max_tokens": params.max_tokens,
                "seed": params.seed,
            }
        }
        return await self._call_server("POST", "/sessions", json=body)

    async def _call_server(self, method: str, path: str, ok_missing: bool = False, **kwargs: Any) -> Any:
        """A session-server call with the SDKs' retry policy: 429/5xx/connection failures, exponential back-off."""
        import httpx

        attempt = 0
        while True:
            try:
                response = await self.http.request(method, f"{self.root}{path}", **kwargs)
                if response.status_code < 400 or (ok_missing and response.status_code == 404):
                    return response.json()
                problem = f"HTTP {response.status_code}: {response.text[:300]}"
                retry = response.status_code == 429 or response.status_code >= 500
            except httpx.HTTPError as exc:
                problem, retry = f"{type(exc).__name__}: {exc}", True
            if not retry or attempt == self.max_retries:
                raise EndpointError(f"{method} {self.root}{path} failed after {attempt + 1} attempt(s): {problem}")
            await asyncio.sleep(min(8.0, 0.5 * 2**attempt))
            attempt += 1

    def _generator(self, client: Any, env_id: str) -> Any:
        counts = self.counts.setdefault(env_id, Counter())
        if self.wire == "openai":

            async def generate(messages, tools, params: SamplingParams) -> Reply:
                counts["single_requests"] += 1
                response = await client.chat.completions.create(**self._request(messages, tools, params))
                return openai_replies(response.model_dump())[0]

        else:

            async def generate(messages, tools, params: SamplingParams) -> Reply:
                counts["single_requests"] += 1
                system, converted = to_anthropic(messages)
                sampling = {} if self.sessions else {"temperature": params.temperature, "top_p": params.top_p}
                response = await client.messages.create(
                    model=self.model_name,
                    messages=converted,
                    max_tokens=params.max_tokens,
                    **({"extra_body": sampling} if sampling else {}),  # a session already holds them
                    **({"system": system} if system else {}),
                    **({"tools": anthropic_tools(tools)} if tools else {}),
                )
                return anthropic_reply(response.model_dump())

        return generate

    async def _run_agent(
        self, task: EnvTask, row: dict[str, Any], params: SamplingParams, session: dict[str, Any] | None
    ) -> Episode:
        from env_registry.evaluation.proxy import RecordingProxy, Route

        if self.proxy is None:
            self.proxy = RecordingProxy(self.http)
            await self.proxy.start()
        route = Route(self.openai_base, self.root, seed=params.seed)
        if session is not None:
            route = Route(session["base_url"], session["session_url"], seed=params.seed)
        rid, base_url, anthropic_url = self.proxy.open(route)
        messages = [dict(m) for m in row["prompt"]] if isinstance(row["prompt"], list) else []
        if not messages:
            messages = [{"role": "user", "content": str(row["prompt"])}]
        ctx = ChatContext(
            messages=messages,
            tools=None,
            prompt=next((str(m.get("content")) for m in reversed(messages) if m["role"] == "user"), ""),
            label=row["label"],
            images=None,
            base_url=base_url,
            session_url=anthropic_url,
            model_name=self.model_name,
            api_key=self.api_key,
            session_id=session["session_id"] if session else rid,
            sampling_params=params,
            max_length=self.max_length,
        )
        episode = Episode()
        try:
            agent = task.factory()
            result = await agent.run(ctx)
            if not isinstance(result, Result):
                episode.failure = Failure("invalid_result", f"ChatAgent.run returned {type(result).__name__}")
            else:
                episode.reward, episode.score, episode.info = result.reward, result.score, dict(result.info)
                episode.truncated = result.truncated
        except Exception as exc:
            episode.failure = classify(f"run: {type(exc).__name__}: {exc}", self.generate_reason)
        finally:
            calls = self.proxy.close(rid)
        _record_calls(episode, calls)
        if episode.failure is None and not calls:
            episode.failure = Failure("no_generation", "the agent finished without a model call")
            episode.reward = episode.score = None
        return episode


def _record_calls(episode: Episode, calls: list[dict[str, Any]]) -> None:
    episode.transcript = calls
    episode.turns = len(calls)
    prompt = completion = 0
    counted = True
    for call in calls:
        response = call.get("response")
        reply = None
        if isinstance(response, dict) and call["status"] < 400:
            reply = openai_replies(response)[0] if call["wire"] == "openai" else anthropic_reply(response)
        episode.actions.append(None if reply is None else action_text(reply))
        if reply is None or reply.prompt_tokens is None:
            counted = False
            continue
        prompt = prompt or reply.prompt_tokens
        completion += reply.completion_tokens or 0
    episode.prompt_tokens, episode.completion_tokens = (prompt, completion) if counted and calls else (None, None)


def openai_replies(response: dict[str, Any]) -> list[Reply]:
    """Every choice of a Chat Completions response. A choice's token counts are its own ``usage`` (what
    ``molt-train serve`` sends with ``n``), else the response's when it has one choice; with several choices and only
    the summed usage, the prompt count is the response's and a choice's completion count is unknown (None)."""
    choices = response.get("choices") or [{}]
    usage = response.get("usage") or {}
    replies = []
    for choice in sorted(choices, key=lambda c: c.get("index") or 0):
        message = choice.get("message") or {}
        own = choice.get("usage") or (usage if len(choices) == 1 else {"prompt_tokens": usage.get("prompt_tokens")})
        calls = [
            {"id": c.get("id"), "type": "function", "function": dict(c.get("function") or {})}
            for c in message.get("tool_calls") or []
        ]
        replies.append(
            Reply(
                content=message.get("content") or "",
                tool_calls=calls,
                finish_reason="length" if choice.get("finish_reason") == "length" else "stop",
                prompt_tokens=own.get("prompt_tokens"),
                completion_tokens=own.get("completion_tokens"),
            )
        )
    return replies


def anthropic_reply(response: dict[str, Any]) -> Reply:
    text, calls = [], []
    for block in response.get("content") or []:
        if block.get("type") == "text":
            text.append(block.get("text") or "")
        elif block.get("type") == "tool_use":
            arguments = json.dumps(block.get("input") or {})
            calls.append(
                {
                    "id": block.get("id"),
                    "type": "function",
                    "function": {"name": block.get("name"), "arguments": arguments},
                }
            )
    usage = response.get("usage") or {}
    return Reply(
        content="".join(text),
        tool_calls=calls,
        finish_reason="length" if response.get("stop_reason") == "max_tokens" else "stop",
        prompt_tokens=usage.get("input_tokens"),
        completion_tokens=usage.get("output_tokens"),
    )


def to_anthropic(messages: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """OpenAI-shaped chat messages as ``(system, messages)`` of the Anthropic Messages API."""
    system = "\n\n".join(str(m.get("content") or "") for m in messages if m["role"] in ("system", "developer"))
    out: list[dict[str, Any]] = []
    for m in messages:
        role = m["role"]
        if role in ("system", "developer"):
            continue
        if role == "tool":
            block = {
                "type": "tool_result",
                "tool_use_id": m.get("tool_call_id"),
                "content": str(m.get("content") or ""),
            }
            if out and out[-1]["role"] == "user" and isinstance(out[-1]["content"], list):
                out[-1]["content"].append(block)
            else:
                out.append({"role": "user", "content": [block]})
        elif role == "assistant" and m.get("tool_calls"):
            blocks: list[dict[str, Any]] = [{"type": "text", "text": m["content"]}] if m.get("content") else []
            for call in m["tool_calls"]:
                fn = call.get("function", {})
                try:
                    arguments = json.loads(fn.get("arguments") or "{}")
                except ValueError:
                    arguments = {}
                blocks.append({"type": "tool_use", "id": call.get("id"), "name": fn.get("name"), "input": arguments})
            out.append({"role": "assistant", "content": blocks})
        else:
            out.append({"role": role, "content": str(m.get("content") or "")})
    return system, out


def anthropic_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI function tools as Anthropic tools."""
    out = []
    for tool in tools:
        fn = tool.get("function", tool)
        out.append(
            {
                "name": fn["name"],
                "description": fn.get("description", ""),
                "input_schema": fn.get("parameters") or {"type": "object", "properties": {}},
            }
        )
    return out
