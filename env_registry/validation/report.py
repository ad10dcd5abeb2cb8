"""``ValidationReport``: the verdict of ``molt-env validate`` (and of a registry's publish gate), as checks.

A report is plain data: ``to_json()`` / ``from_json()`` round-trip it, so a registry can store and serve it as is.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Check:
    """One check. ``env_id`` is None for the package-wide ones (install, manifest)."""

    name: str
    passed: bool
    detail: str = ""
    env_id: str | None = None


@dataclass
class ValidationReport:
    """What was validated, how it was isolated, and every check that ran (a failed one never hides the rest).

    ``ok`` is True when at least one check ran and none failed.
    """

    target: str
    package: str | None = None
    version: str | None = None
    env_ids: list[str] = field(default_factory=list)
    isolation: str = ""
    checks: list[Check] = field(default_factory=list)
    started: str = ""
    finished: str = ""

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.passed for c in self.checks)

    def add(self, name: str, passed: bool, detail: str = "", env_id: str | None = None) -> bool:
        self.checks.append(Check(name, bool(passed), detail[:4000], env_id))
        return bool(passed)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ValidationReport:
        data = {k: v for k, v in data.items() if k != "ok"}
        data["checks"] = [Check(**c) for c in data.get("checks", [])]
        return cls(**data)

    def render(self) -> str:
        """The report as text, one line per check, failures first within each env."""
        what = f"{self.package} {self.version}" if self.package else self.target
        lines = [f"validation of {what} ({', '.join(self.env_ids) or 'no env IDs'})", f"isolation: {self.isolation}"]
        for check in self.checks:
            where = f"[{check.env_id}] " if check.env_id else ""
            detail = f": {check.detail}" if check.detail else ""
            lines.append(f"  {'PASS' if check.passed else 'FAIL'}  {where}{check.name}{detail}")
        failed = sum(not c.passed for c in self.checks)
        lines.append(f"{len(self.checks) - failed} passed, {failed} failed: {'OK' if self.ok else 'NOT OK'}")
        return "\n".join(lines)
