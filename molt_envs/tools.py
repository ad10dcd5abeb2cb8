"""Sandboxed tools for environments: ``python_executor(code)`` and ``shell(command)``.

Each tool is an OpenAI function schema plus an async callable. A ``ToolBox`` holds one sandbox session for one
episode (optionally a persistent REPL, so variables survive between calls) and formats what the code printed for
the model, cutting long output with a visible marker. Nothing here blocks the event loop.

What the model did wrong (an error, a timeout, a limit) comes back as text for the model. A failure of the sandbox
itself (``infra_error``: a worker died, twice) is not the model's doing and is never shown to it: the call raises
``ToolInfraError``, which ends the episode as a failure the runners record (stage ``sandbox``), so it is counted
and dropped, never turned into reward.
"""

from __future__ import annotations

import json
from typing import Any

import sandboxes

PYTHON_EXECUTOR: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "python_executor",
        "description": "Run Python 3 code in a sandbox (no network, no host files) and return what it printed.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "Python source; use print() to see values."}},
            "required": ["code"],
        },
    },
}

SHELL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "shell",
        "description": "Run a POSIX shell command in a sandbox (no network, no host files) and return its output.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "A command line for /bin/sh -c."}},
            "required": ["command"],
        },
    },
}


class ToolInfraError(sandboxes.SandboxError):
    """Raised by a ``ToolBox`` tool when the sandbox itself failed (status ``infra_error``), instead of an answer."""

    failure_stage = "sandbox"  # the runners record the episode's failure under this stage, wherever it happened


def truncate_for_model(text: str, max_chars: int) -> str:
    """Keep the head and the tail; the middle becomes a marker saying how much was cut."""
    if len(text) <= max_chars:
        return text
    keep = max(max_chars - 40, 2) // 2
    return f"{text[:keep]}\n...[{len(text) - 2 * keep} characters truncated]...\n{text[-keep:]}"


def format_result(result: sandboxes.Result, max_chars: int) -> str:
    """What the model sees: stdout, then stderr, then a status line when the run did not finish cleanly.

    Raises:
        ToolInfraError: the sandbox failed (``infra_error``); there is nothing the model should see.
    """
    if result.infra_error:
        raise ToolInfraError(f"the {result.provider or 'sandbox'} sandbox failed: {result.stderr.strip()[:500]}")
    parts = [result.stdout.rstrip("\n")] if result.stdout else []
    if result.stderr:
        parts.append(result.stderr.rstrip("\n"))
    if result.status != "ok":
        parts.append(f"[status: {result.status}, exit code {result.exit_code}]")
    return truncate_for_model("\n".join(parts) or "(no output)", max_chars)


class ToolBox:
    """The tools of one episode, backed by one sandbox session. Use ``async with`` or call ``close()``."""

    schemas = [PYTHON_EXECUTOR, SHELL]

    def __init__(
        self,
        provider: str = "auto",
        *,
        persistent: bool = False,
        max_chars: int = 4096,
        wall_s: float = 10.0,
        memory_mb: int = 1024,
        **sandbox_options: Any,
    ) -> None:
        self.max_chars = max_chars
        self._sandbox = sandboxes.open(
            provider, wall_s=wall_s, memory_mb=memory_mb, persistent=persistent, **sandbox_options
        )
        self._started = False
        self.calls = 0

    async def __aenter__(self) -> ToolBox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _open(self) -> sandboxes.Sandbox:
        if not self._started:
            await self._sandbox.start()
            self._started = True
        return self._sandbox

    async def python_executor(self, code: str) -> str:
        sandbox = await self._open()
        self.calls += 1
        return format_result(await sandbox.run_python(code), self.max_chars)

    async def shell(self, command: str) -> str:
        sandbox = await self._open()
        self.calls += 1
        return format_result(await sandbox.exec(["sh", "-c", command]), self.max_chars)

    async def call(self, name: str, arguments: dict[str, Any] | str) -> str:
        """Dispatch a model's tool call; a bad call comes back as an error message for the model, never raised.

        Raises:
            ToolInfraError: the sandbox itself failed.
        """
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                return f"error: arguments for {name!r} are not valid JSON: {arguments[:200]!r}"
        tools = {"python_executor": ("code", self.python_executor), "shell": ("command", self.shell)}
        if name not in tools:
            return f"error: unknown tool {name!r}; available: {', '.join(tools)}"
        key, fn = tools[name]
        if not isinstance(arguments, dict) or not isinstance(arguments.get(key), str):
            return f"error: {name} needs a string argument {key!r}, got {arguments!r:.200}"
        return await fn(arguments[key])

    async def close(self) -> None:
        if self._started:
            await self._sandbox.close()
            self._started = False
