"""The publish gate's states of a release and the registry's calls on them (``molt-env serve --validate``).

A release uploaded to a server started with ``--validate`` is stored ``pending``; the gate's worker process
(``env_registry.validation.gate``) validates its wheel and stores ``passed`` or ``failed`` with the report, in the
release's ``validation_status`` / ``validation_report`` columns. ``pending`` and ``failed`` releases are held back:
an unpinned env ID never resolves to them, an exact pin is refused with the reason, and the simple index does not
list their files. A release with no status (published without the gate) is not held back.

Several gates may share one database (server replicas, each started with ``--validate``): a gate validates a pending
release only after ``claim_validation`` won it (an ``UPDATE ... WHERE validation_status = 'pending'`` that only an
unclaimed, expired or own claim matches, so exactly one gate wins), renews its claim while it works, and stores its
verdict only while the claim is still its own. A claim not renewed for ``lease_s`` (its gate died) is taken over.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from env_registry.errors import Error
from env_registry.store import database
from env_registry.store.database import releases
from env_registry.store.records import ReleaseInfo

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

    def claim_validation(
        self, package: str, version: str, claimant: str, lease_s: float, now: float | None = None
    ) -> bool:
        """Claim (or renew the claim on) a pending release for one gate.

        Args:
            package: the package name.
            version: its version.
            claimant: the gate's id (unique per gate process).
            lease_s: a claim not renewed for this long is another gate's to take.
            now: the time of the claim (default: now).

        Returns:
            True if the release is pending and now claimed by ``claimant``; False if it is decided, or another
            gate's claim on it is live.
        """
        now = time.time() if now is None else now
        c = releases.c
        with database.write(self.engine, exclusive=False, stamp=None) as db:
            claimed = db.execute(
                releases.update()
                .where(
                    c.package == package,
                    c.version == version,
                    c.validation_status == PENDING,
                    sa.or_(
                        c.validation_claim.is_(None),
                        c.validation_claim == claimant,
                        c.validation_claimed < now - lease_s,
                    ),
                )
                .values(validation_claim=claimant, validation_claimed=now)
            )
        return claimed.rowcount == 1

    def set_validation(
        self, package: str, version: str, status: str, report: dict[str, Any], claimant: str | None = None
    ) -> bool:
        """Store the gate's verdict on a release.

        Args:
            package: the package name.
            version: its version.
            status: ``passed`` or ``failed``.
            report: the ``ValidationReport.to_json()`` to serve.
            claimant: the gate storing it: the verdict is stored only while the release is pending and claimed by
                it (None: unconditionally).

        Returns:
            Whether the verdict was stored.

        Raises:
            NotFound: no such release.
            Error: ``status`` is neither.
        """
        if status not in (PASSED, FAILED):
            raise Error(f"a validation status is {PASSED!r} or {FAILED!r}, not {status!r}")
        info = self.release(package, version)
        c = releases.c
        mine = [] if claimant is None else [c.validation_status == PENDING, c.validation_claim == claimant]
        with database.write(self.engine, exclusive=False) as db:
            stored = db.execute(
                releases.update()
                .where(c.package == info.package, c.version == info.version, *mine)
                .values(validation_status=status, validation_report=json.dumps(report), validation_claim=None)
            )
        return stored.rowcount == 1

    def pending_validations(self) -> list[ReleaseInfo]:
        """The releases the gate has not decided yet, oldest upload first."""
        with database.read(self.engine) as db:
            rows = db.execute(
                sa.select(releases.c.package, releases.c.version, releases.c.uploaded)
                .where(releases.c.validation_status == PENDING)
                .order_by(releases.c.uploaded)
            ).all()
        return [self.release(r.package, r.version) for r in rows]
