"""The registry server's publish gate: the worker process of ``molt-env serve --validate``.

``molt-env serve --validate`` stores every upload ``pending`` (``env_registry.validation_states``) and starts this
module as a process of its own (``python -m env_registry.validation.gate``), never on the request path and never in
a server process: it takes the pending releases oldest first, runs ``validate`` on each one's stored wheel (the
package's import and grader run only inside the sandbox jail, see ``validate``), and stores ``passed`` or
``failed`` with the report. Pending releases live in the database, so a gate that was stopped mid-validation takes
them up again when the server next starts with ``--validate``. The gate exits when its stdin closes (the server
that started it is gone), taking its pip and jail children with it.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import traceback
from collections.abc import Sequence

from env_registry.store import LocalRegistry
from env_registry.validation.report import ValidationReport
from env_registry.validation.validate import now, validate
from env_registry.validation_states import FAILED, PASSED

POLL_S = 1.0
RETRY_S = 10.0


def validate_release(registry: LocalRegistry, package: str, version: str, timeout_s: float) -> ValidationReport:
    """Validate one stored release's wheel and store the verdict; returns the report.

    Args:
        registry: the server's registry.
        package: the release's package.
        version: its version.
        timeout_s: wall-clock limit of the jailed checks.
    """
    info = registry.release(package, version)
    wheel = registry.file_path(info.package, info.wheel.filename)
    try:
        report = validate(wheel, timeout_s=timeout_s)
    except Exception as exc:  # a bug of the validator itself: the release fails, with the reason, not the gate
        report = ValidationReport(target=wheel.name, package=info.package, version=info.version, started=now())
        tail = traceback.format_exception_only(exc)[-1].strip()
        report.add("validation ran", False, f"the validator crashed: {tail}; publish a new version to retry")
        report.finished = now()
    report.target = f"{info.package} {info.version} ({wheel.name})"  # not the server's file path
    registry.set_validation(info.package, info.version, PASSED if report.ok else FAILED, report.to_json())
    return report


def run(registry: LocalRegistry, timeout_s: float, stop: threading.Event) -> None:
    """Validate pending releases until ``stop`` is set. A database or file-store error is printed and retried
    (the release stays pending), so the gate outlives a database restart."""
    while not stop.is_set():
        try:
            pending = registry.pending_validations()
            for info in pending:
                report = validate_release(registry, info.package, info.version, timeout_s)
                print(f"validated {info.package} {info.version}: {PASSED if report.ok else FAILED}", flush=True)
                if stop.is_set():
                    return
        except Exception as exc:
            print(f"publish gate: {type(exc).__name__}: {exc}; retrying in {RETRY_S:g} s", file=sys.stderr, flush=True)
            stop.wait(RETRY_S)
            continue
        if not pending:
            stop.wait(POLL_S)


def _exit_with_stdin() -> None:
    """End this process group (the gate, its pip and jail children) once stdin closes."""
    sys.stdin.read()
    os.killpg(os.getpgid(0), signal.SIGTERM)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m env_registry.validation.gate", description=__doc__)
    parser.add_argument("--root", required=True, help="the registry directory")
    parser.add_argument("--db", help="the registry database URL (default: the SQLite file in --root)")
    parser.add_argument("--timeout", type=float, default=600.0, help="wall-clock limit of each package's checks (s)")
    args = parser.parse_args(argv)
    registry = LocalRegistry(args.root, label="this registry", db=args.db)
    threading.Thread(target=_exit_with_stdin, daemon=True).start()
    try:
        run(registry, args.timeout, threading.Event())
    finally:
        registry.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
