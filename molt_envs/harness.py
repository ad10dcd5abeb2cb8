"""``HarnessAgent``: a ChatAgent that runs an agent harness's own CLI (Claude Code, Codex, ...) against its session.

Per episode, a fresh ``sandboxes`` local jail (a persistent session: one dedicated worker, destroyed when the episode
ends, so nothing of one episode is left for the next) gets:

- the harness's install, read-only at ``/opt/harness`` (npm packages, installed by ``make harnesses``);
- the session server's unix socket, read-only at ``/run/molt`` (``ChatContext.session_socket``), and
  ``network="loopback"``: the jail's own network namespace, with a loopback device and nothing else;
- ``jail_bridge.py``, which forwards ``127.0.0.1:PORT`` in the jail to that socket and runs the CLI with its base URL
  at ``http://127.0.0.1:PORT/s/<session_id>``. Every model call the harness makes lands in the episode's session
  and is captured token-exactly; the harness can reach nothing else on any network.

The jail's ``/tmp/work`` holds ``task/`` (the harness's working directory, graded afterwards), ``home/`` (its HOME
and config) and ``logs/``. A harness that ends by itself is graded whatever its exit code (a CLI that gives up, past
its turn or output-token limits, exits 1: that is the policy's doing, and ``info["exit_code"]`` says so). One that is
killed by a signal, cannot be started or takes its jail down is a ``harness_crash``, one that runs past ``timeout_s``
(a harness looping forever) a ``harness_timeout``, one that is not installed ``harness_missing``: the episode is
dropped and counted under that reason (``rollout/dropped/failure_<reason>``), never trained on as reward 0.
"""

from __future__ import annotations

import json
import os
from abc import abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sandboxes
from molt_envs.contract import ChatAgent, ChatContext, Result

INSTALL_DIR_ENV = "MOLT_HARNESS_DIR"
DEFAULT_INSTALL_DIR = Path(__file__).resolve().parents[1] / ".harnesses"  # the checkout's (ignored) folder
INSTALL_COMMAND = "make harnesses  (npm install --prefix .harnesses, pinned versions in the Makefile)"
JAIL_HARNESS, JAIL_SOCKET_DIR, JAIL_WORK = "/opt/harness", "/run/molt", "/tmp/work"
BRIDGE_PORT = 8080
BRIDGE_SOURCE = (Path(__file__).parent / "jail_bridge.py").read_text()


class HarnessFailure(RuntimeError):
    """The harness crashed, timed out or is not installed; ``stage`` is the drop reason the episode counts under."""

    def __init__(self, stage: str, message: str) -> None:
        super().__init__(message)
        self.stage = stage


@dataclass
class HarnessRun:
    """What one harness run left: its exit code, output, final answer and the files the grader reads."""

    exit_code: int
    stdout: str
    stderr: str
    final_text: str
    files: dict[str, str | None]  # task-relative path -> content (None: the file does not exist)
    leftovers: list[str]  # what /tmp/work held before the run (empty: the jail started clean)


class HarnessAgent(ChatAgent):
    """Runs a harness CLI in a jail per episode; subclasses say how to call it and how to grade what it left.

    Args:
        install_dir: the npm prefix holding the harness (default ``$MOLT_HARNESS_DIR`` or the checkout's
            ``.harnesses``).
        timeout_s: wall-clock limit of one harness run (the jail is killed at it: ``harness_timeout``).
        memory_mb: address-space limit of each process in the jail (the harness binaries reserve a lot).
    """

    graded_files: tuple[str, ...] = ()

    def __init__(self, install_dir: str | None = None, timeout_s: float = 300.0, memory_mb: int = 8192) -> None:
        self.install_dir = Path(install_dir or os.environ.get(INSTALL_DIR_ENV) or DEFAULT_INSTALL_DIR)
        self.timeout_s = timeout_s
        self.memory_mb = memory_mb

    @abstractmethod
    def command(self, ctx: ChatContext, base_url: str) -> tuple[list[str], dict[str, str], dict[str, str]]:
        """``(argv, env, files)``: the CLI call (paths in the jail), its environment, and files (work-relative) to
        write first. ``base_url`` is the session's URL as the harness reaches it (no ``/v1``)."""

    @abstractmethod
    def final_text(self, run: HarnessRun) -> str:
        """The harness's final answer, from its output or logs."""

    @abstractmethod
    def grade(self, ctx: ChatContext, run: HarnessRun) -> Result:
        """The episode's reward from the final workspace or answer."""

    def executable(self, *parts: str) -> str:
        """A file of the install as the jail sees it; ``harness_missing`` when it is not installed here."""
        host = self.install_dir.joinpath("node_modules", *parts)
        if not host.is_file():
            raise HarnessFailure(
                "harness_missing", f"{type(self).__name__} needs {host}; install the harnesses with {INSTALL_COMMAND}"
            )
        return "/".join([JAIL_HARNESS, "node_modules", *parts])

    async def run(self, ctx: ChatContext) -> Result:
        if ctx.session_socket is None:
            raise RuntimeError(
                "a HarnessAgent needs ChatContext.session_socket (the session server in this process, as "
                "ChatAgentRunner runs it)"
            )
        base_url = f"http://127.0.0.1:{BRIDGE_PORT}/s/{ctx.session_id}"
        argv, env, files = self.command(ctx, base_url)
        sandbox = sandboxes.open(
            "local",
            persistent=True,
            wall_s=self.timeout_s,
            memory_mb=self.memory_mb,
            max_output_bytes=1 << 20,
            binds=((str(self.install_dir), JAIL_HARNESS), (os.path.dirname(ctx.session_socket), JAIL_SOCKET_DIR)),
            network="loopback",
            workers=1,
        )
        async with sandbox:
            listed = await sandbox.exec(["ls", "-A", JAIL_WORK], wall_s=10)
            bridge = {
                "socket": f"{JAIL_SOCKET_DIR}/{os.path.basename(ctx.session_socket)}",
                "port": BRIDGE_PORT,
                "argv": argv,
                "env": {"HOME": f"{JAIL_WORK}/home", **env},
                "cwd": f"{JAIL_WORK}/task",
                "log_dir": f"{JAIL_WORK}/logs",
            }
            files = {"task/.keep": "", "home/.keep": "", **files}
            result = await sandbox.exec(["python3", "-I", "-c", BRIDGE_SOURCE, json.dumps(bridge)], files=files)
            run = await self._collect(sandbox, result, listed.stdout.split())
        return self.grade(ctx, run)

    async def _collect(self, sandbox: sandboxes.Sandbox, result: sandboxes.Result, leftovers: list[str]) -> HarnessRun:
        name = type(self).__name__
        if result.status == "timeout":
            raise HarnessFailure("harness_timeout", f"{name} ran past timeout_s={self.timeout_s:g} and was killed")
        lines = result.stdout.strip().splitlines()
        try:
            report: dict[str, Any] = json.loads(lines[-1])
        except (IndexError, ValueError):
            raise HarnessFailure(
                "harness_crash", f"{name}'s jail ended with status {result.status}: {result.stderr[-800:]}"
            ) from None
        code = report["exit_code"]
        if code < 0 or code >= 126:  # a signal (subprocess reports -N), or 126/127: it could not be executed
            how = f"was killed by signal {-code}" if code < 0 else f"could not be executed ({code})"
            raise HarnessFailure("harness_crash", f"{name} {how}: {report['stderr_tail'][-800:]}")
        stdout = await _read(sandbox, "logs/stdout") or ""
        files = {path: await _read(sandbox, f"task/{path}") for path in self.graded_files}
        run = HarnessRun(code, stdout, report["stderr_tail"], "", files, leftovers)
        run.final_text = self.final_text(run)
        return run


async def _read(sandbox: sandboxes.Sandbox, path: str) -> str | None:
    try:
        return (await sandbox.download(path)).decode(errors="replace")
    except sandboxes.SandboxError:
        return None
