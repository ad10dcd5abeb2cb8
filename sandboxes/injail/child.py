"""What a forked child of the zygote does to become a clean `python -c`: tie its life to the zygote, take the
ready-made stdio and `__main__`, apply the request's rlimits, run the code and report how it ended.

Shared by the one-shot spares (`spare.py`) and the persistent REPL (`repl.py`). Every page a child writes that it
still shares with the zygote is a copy-on-write fault on the caller's clock, so what can be built once is built
here in the zygote, before any fork (`spare_stdio`), and the per-child functions touch as little as they can.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import resource
import signal
import sys
import types

# One CDLL for the whole zygote (its `prctl` looked up once, before any fork, in `Zygote.harden`): a child that
# looked a function up on a CDLL of its own would write the lookup's cache into its pages on every call.
libc = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG = 1
SIGKILL = int(signal.SIGKILL)  # a plain int: using the enum member writes to its pages in every child


def die_with(parent: int) -> None:
    """SIGKILL us when the zygote dies, so no child outlives its worker (even without a PID namespace)."""
    libc.prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(0)


def spare_stdio() -> tuple:
    """sys.stdin/stdout/stderr on fds 0-2 as `python -c` has them and a `__main__` module (so pickling
    a snippet's functions works), made once in the zygote for all its children (building them after
    each fork cost ~45 copy-on-write faults per execution). The wrappers cache what their file is like
    (seekable, a tty?) when made, so meanwhile fds 0-2 point at files like a child's: a memfd for
    stdin, a pipe for stdout/stderr. The zygote never writes to them nor runs code in `__main__`, so
    every child starts from the same pristine, empty copies."""
    saved = [os.dup(fd) for fd in (0, 1, 2)]
    memfd = os.memfd_create("stdin", 0)
    pipe_r, pipe_w = os.pipe()
    try:
        for src, dst in ((memfd, 0), (pipe_w, 1), (pipe_w, 2)):
            os.dup2(src, dst)
        streams = (
            open(0, closefd=False),  # noqa: SIM115
            open(1, "w", encoding="utf-8", errors="surrogateescape", closefd=False),  # noqa: SIM115
            open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False, buffering=1),  # noqa: SIM115
        )
    finally:
        for fd, old in enumerate(saved):
            os.dup2(old, fd)
        for fd in (*saved, memfd, pipe_r, pipe_w):
            os.close(fd)
    main = types.ModuleType("__main__")
    main.__builtins__ = __builtins__
    return (*streams, main)


def take_stdio(stdio: tuple) -> dict:
    """In a child: become `python -c` with the zygote's ready-made streams and `__main__` (see
    `spare_stdio`); returns the namespace to run code in."""
    sys.argv = [""]
    sys.stdin, sys.stdout, sys.stderr, main = stdio
    sys.modules["__main__"] = main
    return vars(main)


def apply_limits(limits: dict, cpu_limit: bool = True) -> None:
    mib = 1024 * 1024
    cpu = max(1, math.ceil(limits["cpu_s"]))
    for name, soft, hard in (
        (resource.RLIMIT_CPU, cpu if cpu_limit else None, cpu + 1),
        (resource.RLIMIT_AS, limits["memory_mb"] * mib, limits["memory_mb"] * mib),
        (resource.RLIMIT_FSIZE, limits["file_size_mb"] * mib, limits["file_size_mb"] * mib),
        (resource.RLIMIT_NOFILE, limits["open_files"], limits["open_files"]),
        (resource.RLIMIT_NPROC, limits["processes"], limits["processes"]),
        (resource.RLIMIT_CORE, 0, 0),
    ):
        if soft is not None:
            resource.setrlimit(name, (soft, hard))


def child_python(code: str, namespace: dict, finish: bool = True) -> tuple[int, bool]:
    """Run `code` in `namespace` as `python -c` would; returns (exit code, died of MemoryError).
    `finish`: then wait for its threads and run its atexit hooks (not in a rehearsal: that must
    leave no trace)."""
    exit_code, memory_error = 0, False
    try:
        exec(compile(code, "<string>", "exec"), namespace)
    except SystemExit as exc:
        exit_code = exit_code_of(exc)
    except MemoryError:
        exit_code, memory_error = 1, True
        print_exception()
    except BaseException:
        exit_code = 1
        print_exception()
    if finish:
        try:
            threading = sys.modules.get("threading")  # as `python -c` does: no import, no threads to wait for
            if threading is not None:
                threading._shutdown()  # wait for non-daemon threads
            import atexit

            atexit._run_exitfuncs()
        except BaseException:
            pass
    for stream in (sys.stdout, sys.stderr):
        try:  # noqa: SIM105  (contextlib.suppress here would touch, and copy, contextlib's pages in every child)
            stream.flush()
        except BaseException:
            pass
    return exit_code & 0xFF, memory_error


def print_exception() -> None:
    """Print the current exception's traceback without the zygote's own frame."""
    import traceback

    kind, value, tb = sys.exc_info()
    with contextlib.suppress(BaseException):
        traceback.print_exception(kind, value, tb.tb_next if tb is not None else None)


def exit_code_of(exc: SystemExit) -> int:
    """The exit status `python -c` gives a `SystemExit` (a non-int code is printed to stderr and exits 1)."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    print(exc.code, file=sys.stderr)
    return 1
