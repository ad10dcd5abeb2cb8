"""The publish gate's states of a release and the registry's calls on them (``molt-env serve --validate``).

A release uploaded to a server started with ``--validate`` is stored ``pending``; the gate's worker process
(``env_registry.validation.gate``) validates its wheel and stores ``passed`` or ``failed`` with the report, in the
release's ``validation_status`` / ``validation_report`` columns. ``pending`` and ``failed`` releases are held back:
an unpinned env ID never resolves to them, an exact pin is refused with the reason, and the simple index does not
list their files. A release with no status (published without the gate) is not held back.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from env_registry import database
from env_registry.database import releases
from env_registry.errors import Error
from env_registry.records import ReleaseInfo

PENDING, PASSED, FAILED = "pending", "passed", "failed"
GATED = (PENDING, FAILED)  # not resolvable, not on the simple index


def resolvable(yanked: bool, validation_status: str | None) -> bool:
    """Whether an unpinned ID may resolve to a release: neither yanked nor held back by the publish gate."""
    return not yanked and validation_status not in GATED


class ValidationStates:
    """The publish-gate calls of ``LocalRegistry`` (which supplies ``engine`` and ``release``)."""

    engine: Engine
    release: Callable[[str, str], ReleaseInfo]

    def held_back(self, info: ReleaseInfo) -> str:
        """Why a release the gate holds back (``pending`` or ``failed``) may not be installed, as an error says it."""
        where = f"/api/packages/{info.package}/{info.version}/validation"
        if info.validation_status == PENDING:
            return f"{info.package} {info.version} is still being validated by {self}; try again shortly ({where})"
        return (
            f"{info.package} {info.version} failed validation on {self}, so it is not installable; its report is at "
            f"{where}: fix the package and publish a new version"
        )

    def set_validation(self, package: str, version: str, status: str, report: dict[str, Any]) -> None:
        """Store the gate's verdict on a release.

        Args:
            package: the package name.
            version: its version.
            status: ``passed`` or ``failed``.
            report: the ``ValidationReport.to_json()`` to serve.

        Raises:
            NotFound: no such release.
            Error: ``status`` is neither.
        """
        if status not in (PASSED, FAILED):
            raise Error(f"a validation status is {PASSED!r} or {FAILED!r}, not {status!r}")
        info = self.release(package, version)
        with database.write(self.engine, exclusive=False) as db:
            db.execute(
                releases.update()
                .where(releases.c.package == info.package, releases.c.version == info.version)
                .values(validation_status=status, validation_report=json.dumps(report))
            )

    def pending_validations(self) -> list[ReleaseInfo]:
        """The releases the gate has not decided yet, oldest upload first."""
        with database.read(self.engine) as db:
            rows = db.execute(
                sa.select(releases.c.package, releases.c.version, releases.c.uploaded)
                .where(releases.c.validation_status == PENDING)
                .order_by(releases.c.uploaded)
            ).all()
        return [self.release(r.package, r.version) for r in rows]
