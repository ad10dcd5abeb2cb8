"""The registry server's publish gate: the worker process of ``molt-env serve --validate``.

``molt-env serve --validate`` stores every upload ``pending`` (``env_registry.store.validation_states``) and starts this
module as a process of its own (``python -m env_registry.validation.gate``), never on the request path and never in
a server process: it takes the pending releases oldest first, runs ``validate`` on each one's stored wheel (the
package's import and grader run only inside the sandbox jail, see ``validate``), and stores ``passed`` or
``failed`` with the report. Pending releases live in the database, so a gate that was stopped mid-validation takes
them up again when the server next starts with ``--validate`` (once its old claim's lease ran out). Several gates
may share one database (replicas, each ``--validate``): each release is claimed by one of them
(``ValidationStates.claim_validation``), whose claim is renewed every ``lease / 3`` while it validates, so a release
is validated once however many gates see it pending. The gate exits when its stdin closes (the server
that started it is gone), taking its pip and jail children with it. With ``--reference-endpoint`` (the operator's
reference policy; a ``--reference-checkpoint`` is served by ``molt-env serve`` itself and reaches the gate as its URL
and ``--reference-stamp``, the path and content hash the figures are stamped with), each env whose checks passed is also played by it in the jail, and the report's ``calibration``
holds its difficulty figures (``env_registry.validation.calibration``).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import threading
import traceback
import uuid
from collections.abc import Sequence

from env_registry.store.local import LocalRegistry
from env_registry.store.validation_states import FAILED, PASSED
from env_registry.validation.calibration import Reference, add_reference_flags, reference_of
from env_registry.validation.report import ValidationReport
from env_registry.validation.validate import now, validate

POLL_S = 1.0
RETRY_S = 10.0
LEASE_S = 120.0  # a claim not renewed for this long (its gate died) is taken over


def validate_release(
    registry: LocalRegistry,
    package: str,
    version: str,
    timeout_s: float,
    claimant: str | None = None,
    reference: Reference | None = None,
) -> ValidationReport:
    """Validate one stored release's wheel and store the verdict; returns the report.

    Args:
        registry: the server's registry.
        package: the release's package.
        version: its version.
        timeout_s: wall-clock limit of the jailed checks.
        claimant: the gate whose claim the verdict is stored under (None: unconditionally).
        reference: the reference policy of the difficulty calibration (None: no calibration).
    """
    info = registry.release(package, version)
    wheel = registry.file_path(info.package, info.wheel.filename)
    try:
        report = validate(wheel, timeout_s=timeout_s, reference=reference)
    except Exception as exc:  # a bug of the validator itself: the release fails, with the reason, not the gate
        report = ValidationReport(target=wheel.name, package=info.package, version=info.version, started=now())
        tail = traceback.format_exception_only(exc)[-1].strip()
        report.add("validation ran", False, f"the validator crashed: {tail}; publish a new version to retry")
        report.finished = now()
    report.target = f"{info.package} {info.version} ({wheel.name})"  # not the server's file path
    status = PASSED if report.ok else FAILED
    if not registry.set_validation(info.package, info.version, status, report.to_json(), claimant):
        report.add("verdict stored", False, "another gate took the release over (this gate's claim had expired)")
    return report


def run(
    registry: LocalRegistry,
    timeout_s: float,
    stop: threading.Event,
    lease_s: float = LEASE_S,
    reference: Reference | None = None,
) -> None:
    """Validate pending releases until ``stop`` is set, each only once this gate's claim on it won. A database or
    file-store error is printed and retried (the release stays pending), so the gate outlives a database restart."""
    claimant = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    while not stop.is_set():
        try:
            pending = registry.pending_validations()
            for info in pending:
                if not registry.claim_validation(info.package, info.version, claimant, lease_s):
                    continue  # another gate validates it
                done = threading.Event()
                renew = threading.Thread(
                    target=_renew, args=(registry, info.package, info.version, claimant, lease_s, done), daemon=True
                )
                renew.start()
                try:
                    report = validate_release(registry, info.package, info.version, timeout_s, claimant, reference)
                finally:
                    done.set()
                    renew.join()
                print(f"validated {info.package} {info.version}: {PASSED if report.ok else FAILED}", flush=True)
                if stop.is_set():
                    return
        except Exception as exc:
            print(f"publish gate: {type(exc).__name__}: {exc}; retrying in {RETRY_S:g} s", file=sys.stderr, flush=True)
            stop.wait(RETRY_S)
            continue
        if not pending:
            stop.wait(POLL_S)


def _renew(registry: LocalRegistry, package: str, version: str, claimant: str, lease_s: float, done) -> None:
    """Renew the claim every third of the lease until ``done`` (a failed renewal is retried at the next tick)."""
    while not done.wait(lease_s / 3):
        try:
            registry.claim_validation(package, version, claimant, lease_s)
        except Exception as exc:
            print(f"publish gate: renewing the claim on {package} {version}: {exc}", file=sys.stderr, flush=True)


def _exit_with_stdin() -> None:
    """End this process group (the gate, its pip and jail children) once stdin closes."""
    sys.stdin.read()
    os.killpg(os.getpgid(0), signal.SIGTERM)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m env_registry.validation.gate", description=__doc__)
    parser.add_argument("--root", required=True, help="the registry directory")
    parser.add_argument("--db", help="the registry database URL (default: the SQLite file in --root)")
    parser.add_argument("--timeout", type=float, default=600.0, help="wall-clock limit of each package's checks (s)")
    parser.add_argument("--lease", type=float, default=LEASE_S, help="seconds before a dead gate's claim is taken over")
    add_reference_flags(parser, gate=True)
    args = parser.parse_args(argv)
    reference = reference_of(args)
    registry = LocalRegistry(args.root, label="this registry", db=args.db)
    threading.Thread(target=_exit_with_stdin, daemon=True).start()
    try:
        run(registry, args.timeout, threading.Event(), args.lease, reference)
    finally:
        registry.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
