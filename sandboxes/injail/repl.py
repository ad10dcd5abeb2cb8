"""The persistent REPL: one long-lived child per persistent session that keeps its globals between cells.

A cell's code runs inside the REPL process itself, so that process holds nothing but its stdio and its two cell
pipes (fds 5 and 6; the zygote's channel to the host is closed there), and whatever comes back on its report pipe
is checked before it is believed: anything but the loop's own report ends the REPL. A cell that times out or
crashes ends it too; the next request starts a fresh one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import resource
import sys
import time

import frames
import landlock
from capture import Pipes
from child import apply_limits, die_with, exit_code_of, print_exception, take_stdio
from outcome import classify
from reaper import kill


class Repl:
    """A child that keeps its globals between cells. A cell that times out or crashes ends it."""

    def __init__(self, zygote, limits: dict) -> None:
        self.to_repl_r, self.to_repl_w = os.pipe()
        self.from_repl_r, self.from_repl_w = os.pipe()
        self.pipes = Pipes()
        os.makedirs(zygote.work, exist_ok=True)
        self.pid = os.fork()
        if self.pid == 0:
            try:
                die_with(zygote.pid)
                os.setsid()
                if zygote.scope_fd is not None:
                    landlock.restrict_self(zygote.scope_fd)
                rx = fcntl.fcntl(self.to_repl_r, fcntl.F_DUPFD, 100)
                tx = fcntl.fcntl(self.from_repl_w, fcntl.F_DUPFD, 100)
                self.pipes.become_child()
                os.dup2(rx, 5)
                os.dup2(tx, 6)
                os.closerange(3, 5)  # the zygote's own channel to the host: never in reach of a cell's code
                os.closerange(7, 1 << 16)
                apply_limits(limits, cpu_limit=False)  # per cell instead, see repl_loop
                os.chdir(zygote.work)
                repl_loop(5, 6, zygote.stdio)
            except BaseException:
                print_exception()
            finally:
                os._exit(126)
        self.pipes.close_child_ends()
        os.close(self.to_repl_r)
        os.close(self.from_repl_w)

    def alive(self) -> bool:
        try:
            return self.pid > 0 and os.waitpid(self.pid, os.WNOHANG) == (0, 0)
        except ChildProcessError:
            return False

    def close(self) -> None:
        self.pipes.close()
        for fd in (self.to_repl_w, self.from_repl_r):
            os.close(fd)

    def run(self, request: dict) -> dict:
        """Run one cell (`request["code"]`) under the request's limits; the reply's status says how it ended and
        `repl_reset` that the REPL ended with it."""
        limits = request["limits"]
        start = time.monotonic()
        self.pipes.out, self.pipes.err, self.pipes.truncated = bytearray(), bytearray(), False
        frames.write_fd(self.to_repl_w, {"code": request["code"], "cpu_s": limits["cpu_s"]})
        outcome = self.pipes.pump(
            self.pid,
            start + limits["wall_s"],
            limits["max_output_bytes"],
            done_fd=self.from_repl_r,
            on_kill=lambda: kill(self.pid),
        )
        cell = None
        if outcome == "done":
            try:
                cell = frames.read_fd(self.from_repl_r)
            except frames.FrameError:  # the REPL closed its end: it is exiting
                outcome = "exited"
            # the cell's own code can write this pipe: anything but the loop's report ends the REPL
            if cell is not None and not (
                type(cell.get("exit_code")) is int
                and 0 <= cell["exit_code"] <= 255
                and type(cell.get("memory_error")) is bool
                and len(cell) == 2
            ):
                cell, outcome = None, "exited"
        if cell is not None:
            reply = classify("done", cell, None, limits)
        else:
            kill(self.pid)
            try:
                reaped = os.wait4(self.pid, 0)
            except ChildProcessError:  # already reaped by a sweep
                reaped = None
            self.pid = -1
            self.close()
            reply = classify(outcome, None, reaped, limits)
            self.pipes.err += b"\n[sandbox] the REPL process ended; its state was lost\n"
            reply["repl_reset"] = True
        reply.update(truncated=self.pipes.truncated, wall_ms=(time.monotonic() - start) * 1000)
        return reply


def repl_loop(rx: int, tx: int, stdio: tuple) -> None:
    """The REPL child's life: read a cell, run it in the session's namespace (a final expression's repr printed, as
    in a notebook) under a per-cell CPU limit, report {"exit_code", "memory_error"}; exit when the zygote hangs up."""
    import ast

    namespace = take_stdio(stdio)
    while True:
        try:
            cell = frames.read_fd(rx)
        except frames.FrameError:
            os._exit(0)
        used = sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
        soft = int(used + cell["cpu_s"]) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (soft, resource.RLIM_INFINITY))
        exit_code, memory_error = 0, False
        try:
            tree = ast.parse(cell["code"], "<cell>", "exec")
            last = tree.body[-1] if tree.body and isinstance(tree.body[-1], ast.Expr) else None
            if last is not None:
                tree.body.pop()
            exec(compile(tree, "<cell>", "exec"), namespace)
            if last is not None:
                value = eval(compile(ast.Expression(last.value), "<cell>", "eval"), namespace)
                if value is not None:
                    print(repr(value))
        except SystemExit as exc:
            exit_code = exit_code_of(exc)
        except MemoryError:
            memory_error, exit_code = True, 1
            print_exception()
        except BaseException:
            exit_code = 1
            print_exception()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        frames.write_fd(tx, {"exit_code": exit_code, "memory_error": memory_error})
