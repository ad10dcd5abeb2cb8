"""Any registered env ID as a verifiers 0.4 taskset:
``vf-eval molt_verifiers --env.taskset.env-id molt/sort-v1``.

The other direction of ``env_registry/ecosystems/verifiers.py`` (which runs verifiers tasksets from here). Install it
with ``pip install 'molt-ecosystem[verifiers]'`` into the venv verifiers runs in (``molt-env ecosystem install
verifiers`` makes one that already has it); verifiers' own loader (``verifiers.v1.utils.loaders``) imports this module
as taskset ``molt_verifiers`` (the wheel ships this file under that top-level name too: pyproject.toml) and finds
``MoltTaskset`` and ``MoltEnv`` through ``__all__``.

Why two processes. verifiers 0.4 pins ``openai``/``mcp`` versions this project's dev venv cannot take, and a registered
env may need anything (reasoning-gym, gymnasium, an isolated install's own venv...). So this module, which runs in
verifiers' process, imports no env at all: only the env protocol's client (``molt_envs.remote.client``: pydantic and
websockets, which install next to verifiers' pins). The env, its dataset and its grader run in an env server,
``molt-env serve-env ID``, under the python that has the env installed (``env_url`` names a running one; else
``molt_env``, the ``molt-env`` command of your project's venv, is started once per process and ends with it).

What it does (``--env.taskset.*``: ``env_id``, ``split``, ``num_tasks``, ``env_url``, ``molt_env``):

- ``MoltTaskset.load``: the split's dataset rows as served (``GET /ID/datasets/SPLIT``), one task each: its prompt the
  row's chat messages, its label the row's.
- ``MoltEnv.run``: one episode as ``molt-env eval`` plays it (``env_registry.evaluation.chat_driver.drive_env``):
  ``Env.reset`` with the row, the model's reply through verifiers' own agent (its harness, runtime, client and
  limits), ``Env.step`` with the reply's text as the action: the env's own grader. A multi-turn env's next chat
  observation goes back as the next user turn until the env terminates. The trace gets reward ``molt`` (the sum of the
  steps' rewards, as ``molt-env eval``'s sample reward), metric ``molt_score`` (the last ``Result.score``, else the
  reward) and the last step's numeric info as metrics.
- The agent seat defaults to verifiers' tool-less chat loop (harness ``null``) in a local subprocess runtime: override
  with ``--env.agent.*``.

Not supported: ``chat_agent`` and ``game`` IDs (their agent calls the model itself; ``molt-env eval`` them instead),
raw-text observations (a chat endpoint cannot take them), tool calls in observations.
"""

from __future__ import annotations

import atexit
import collections
import json
import re
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import verifiers.v1 as vf
from pydantic import Field

from molt_envs.remote.client import Endpoint, RemoteEnv

START_TIMEOUT_S = 300.0  # a first serve-env may import a heavy env
_READY = re.compile(r"serving (\S+) at (\S+) \(")
_SERVERS: dict[tuple[str, str], tuple[str, str]] = {}  # (molt_env, env_id) -> (base_url, served ID)
_LOCK = threading.Lock()


class MoltEnvError(ValueError):
    """The env ID cannot be served or read (the message names it and says why)."""


class MoltData(vf.TaskData):
    env_id: str
    """The served ID (``spec.id``)."""
    base_url: str
    """The env server's ``http://host:port``."""
    label: Any = None
    messages: list[dict[str, Any]]
    """The row's prompt as chat messages (also ``prompt``), what ``Env.reset`` gets."""


class MoltTasksetConfig(vf.TasksetConfig):
    env_id: str = ""
    """A registered env ID (``molt/sort-v1``, ``rg/countdown-v1``, ``ns/name-v1?key=value``...)."""
    split: str = "test"
    """The dataset split whose rows are the tasks (``molt-env eval``'s default: test)."""
    num_tasks: int | None = Field(None, ge=1)
    """Read only the split's first rows (None: all of them)."""
    env_url: str | None = None
    """An env server already serving the ID (``molt-env serve-env ID``'s ``http://host:port``); None: start one."""
    molt_env: str = "molt-env"
    """The ``molt-env`` command that serves the ID when ``env_url`` is unset: your project's venv's, where the env
    and its dependencies are installed (e.g. ``~/proj/.venv/bin/molt-env``)."""


class MoltTask(vf.Task[MoltData]):
    pass


class MoltTaskset(vf.Taskset[MoltTask, MoltTasksetConfig]):
    def load(self) -> Iterator[MoltTask]:
        config = self.config
        if not config.env_id:
            raise MoltEnvError("this taskset needs the env ID to load: --env.taskset.env-id ns/name-v1")
        base_url, env_id = (config.env_url.rstrip("/"), config.env_id) if config.env_url else serve(config)
        kind = _get_json(f"{base_url}/{quote(env_id)}/metadata", env_id, base_url).get("kind")
        if kind != "env":
            raise MoltEnvError(
                f"{env_id} is a {kind}: its agent calls the model itself, which verifiers' agent cannot play; "
                f"evaluate it with `molt-env eval {env_id}`"
            )
        for i, row in enumerate(read_rows(base_url, env_id, config.split, config.num_tasks)):
            prompt = row["prompt"]
            if isinstance(prompt, str):
                raise MoltEnvError(f"{env_id} {config.split} row {i}: a raw-text prompt cannot go to a chat model")
            data = MoltData(
                name=f"{env_id}#{i}",
                prompt=prompt,
                messages=prompt,
                label=row["label"],
                env_id=env_id,
                base_url=base_url,
            )
            yield MoltTask(data, config.task)


class MoltEnvConfig(vf.EnvConfig):
    agent: vf.AgentConfig = vf.AgentConfig(harness={"id": "null"}, runtime={"type": "subprocess"})
    """The seat the model under evaluation plays: verifiers' tool-less chat loop, locally (``--env.agent.*``)."""


class MoltEnv(vf.Env[MoltEnvConfig]):
    async def run(self, task: MoltTask, agents: vf.Agents) -> None:
        data = task.data
        env = RemoteEnv(Endpoint(data.base_url, data.env_id))
        reward, score, info, interaction = 0.0, None, {}, None
        try:
            start = await env.reset({"observation": data.messages, "label": data.label, "images": []})
            observation = start["observation"]
            if isinstance(observation, str):
                raise MoltEnvError(
                    f"{data.env_id}: Env.reset returned a raw-text observation, which no chat model takes"
                )
            messages = [dict(m) for m in observation]
            if messages != data.messages:  # the env rewrote its prompt: the model sees what the env says
                task = MoltTask(data.model_copy(update={"prompt": messages}), self.config.taskset.task)
            async with agents.agent.interaction(task) as interaction:
                segment = await interaction.turn()
                turn = 0
                while not segment.terminated:
                    action = _reply_text(segment)
                    messages.append({"role": "assistant", "content": action})
                    result = await env.step(
                        {
                            "observation_text": "\n".join(f"{m['role']}: {m.get('content') or ''}" for m in messages),
                            "action_text": action,
                            "label": data.label,
                            "sampling_params": {},
                            "turn": turn,
                            "images": [],
                        }
                    )
                    reward += result.reward
                    score, info, turn = result.score, dict(result.info), turn + 1
                    if result.terminated or result.truncated or not result.observation:
                        break
                    if isinstance(result.observation, str):
                        raise MoltEnvError(f"{data.env_id}: Env.step returned a raw-text observation")
                    messages += [dict(m) for m in result.observation]
                    segment = await interaction.turn(result.observation)
        finally:
            await env.close()
        trace = interaction.trace
        trace.record_reward("molt", reward)
        trace.record_metric("molt_score", reward if score is None else score)
        trace.record_metrics({k: float(v) for k, v in info.items() if isinstance(v, int | float)})


def _reply_text(segment: Any) -> str:
    """The segment's last assistant text, unstripped (``Segment.last_reply`` strips): the action ``molt-env eval``
    sends the grader."""
    for message in reversed(segment.messages):
        if getattr(message, "role", None) == "assistant":
            content = message.content
            return content if isinstance(content, str) else "".join(getattr(p, "text", "") or "" for p in content or [])
    return ""


def serve(config: MoltTasksetConfig) -> tuple[str, str]:
    """``(base_url, served ID)`` of ``molt-env serve-env ENV_ID``, started once per (command, ID) and process; it
    exits when this process does (its stdin closes)."""
    key = (config.molt_env, config.env_id)
    with _LOCK:
        if key not in _SERVERS:
            _SERVERS[key] = _start(*key)
    return _SERVERS[key]


def _start(molt_env: str, env_id: str) -> tuple[str, str]:
    cmd = [molt_env, "serve-env", env_id, "--port", "0", "--exit-on-stdin-eof"]
    try:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
        )
    except OSError as exc:
        raise MoltEnvError(
            f"cannot serve {env_id}: `{molt_env}` does not run ({exc}); set --env.taskset.molt-env to your project's "
            "molt-env, or --env.taskset.env-url to a running `molt-env serve-env` server"
        ) from None
    tail: collections.deque[str] = collections.deque(maxlen=40)
    ready: list[tuple[str, str]] = []
    seen = threading.Event()

    def drain() -> None:  # the server's output, read for its whole life (a full pipe would block it)
        for line in proc.stdout:
            tail.append(line)
            if not ready and (m := _READY.search(line)):
                served, url = m.groups()
                ready.append((url[: -len(served) - 1], served))
                seen.set()
        seen.set()

    threading.Thread(target=drain, daemon=True, name=f"molt-env serve-env {env_id}").start()
    if not seen.wait(START_TIMEOUT_S) or not ready:
        proc.kill()
        proc.wait()
        said = "".join(tail).strip()[-2000:] or f"nothing (exit {proc.returncode})"
        raise MoltEnvError(f"cannot serve env ID {env_id!r}: `{' '.join(cmd)}` said: {said}")
    atexit.register(_stop, proc)
    return ready[0]


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


def _get_json(url: str, env_id: str, base_url: str) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(url, timeout=START_TIMEOUT_S) as response:  # noqa: S310 (an http URL of ours)
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise MoltEnvError(f"env {env_id} at {base_url}: {exc.read().decode(errors='replace')[:500]}") from None
    except OSError as exc:
        raise MoltEnvError(f"no env server serves {env_id} at {base_url}: {exc}") from None


def read_rows(base_url: str, env_id: str, split: str, limit: int | None) -> Iterator[dict[str, Any]]:
    """The split's rows as the env server streams them (``{"row"}`` lines, then ``{"end"}`` or ``{"error"}``)."""
    url = f"{base_url}/{quote(env_id)}/datasets/{quote(split)}" + (f"?limit={limit}" if limit else "")
    try:
        response = urllib.request.urlopen(url, timeout=START_TIMEOUT_S)  # noqa: S310 (an http URL of ours)
    except urllib.error.HTTPError as exc:
        raise MoltEnvError(f"env {env_id} at {base_url}: {exc.read().decode(errors='replace')[:500]}") from None
    except OSError as exc:
        raise MoltEnvError(f"no env server serves {env_id} at {base_url}: {exc}") from None
    with response:
        for line in response:
            item = json.loads(line)
            if "error" in item:
                raise MoltEnvError(f"env {env_id} at {base_url} failed reading split {split!r}: {item['error']}")
            if "end" in item:
                return
            yield item["row"]
    raise MoltEnvError(f"env {env_id} at {base_url}: split {split!r} was cut off")


__all__ = ["MoltData", "MoltEnv", "MoltEnvConfig", "MoltTask", "MoltTaskset", "MoltTasksetConfig"]
