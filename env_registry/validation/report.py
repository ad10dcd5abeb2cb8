"""``ValidationReport``: the verdict of ``molt-env validate`` (and of a registry's publish gate), as checks.

A report is plain data: ``to_json()`` / ``from_json()`` round-trip it, so a registry can store and serve it as is.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

MAX_SAMPLES = 3
MAX_SAMPLE_CHARS = 2000


def _text(value: Any) -> str:
    return value[:MAX_SAMPLE_CHARS] if isinstance(value, str) else ""


def _sample(prompt: Any) -> str | list[dict[str, str]] | None:
    if isinstance(prompt, str):
        return _text(prompt)
    if not isinstance(prompt, list):
        return None
    messages = []
    for m in prompt[:16]:
        if not isinstance(m, dict):
            return None
        content = m.get("content")
        if isinstance(content, list):  # parts: text kept, anything else shown as a placeholder
            content = " ".join(
                _text(p.get("text")) if isinstance(p, dict) and p.get("type") == "text" else "[image]" for p in content
            )
        messages.append({"role": _text(m.get("role"))[:32], "content": _text(content)})
    return messages


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
    samples: dict[str, dict[str, list[Any]]] = field(default_factory=dict)  # env ID -> split -> first prompts
    calibration: dict[str, dict[str, Any]] = field(default_factory=dict)  # env ID -> the reference eval's figures

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.passed for c in self.checks)

    def add_samples(self, env_id: str, split: str, prompts: Any) -> None:
        """Keep a split's first prompts as the jailed checks sent them, bounded and reduced to text: at most
        ``MAX_SAMPLES`` prompts, each a string or chat messages (role and text content, images as ``[image]``), every
        text cut at ``MAX_SAMPLE_CHARS``; anything else (a package's hostile output) is dropped."""
        if not isinstance(prompts, list) or not isinstance(env_id, str) or not isinstance(split, str):
            return
        kept = [p for p in (_sample(p) for p in prompts[:MAX_SAMPLES]) if p is not None]
        if env_id in self.env_ids and len(split) <= 64:
            self.samples.setdefault(env_id, {})[split] = kept

    def add_calibration(self, env_id: Any, data: Any) -> None:
        """Keep an env's reference-eval figures (``calibration``) as the jailed worker sent them, reduced to bounded
        numbers and short strings; anything else is dropped."""
        from env_registry.validation.calibration import sanitize

        kept = sanitize(data)
        if kept is not None and isinstance(env_id, str) and env_id in self.env_ids:
            self.calibration[env_id] = kept

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
        for env_id, c in self.calibration.items():
            if c.get("error"):
                lines.append(f"  reference eval of {env_id}: {c['error']}")
                continue
            curve = ", ".join(f"pass@{k}={v:.3f}" for k, v in enumerate(c["pass_at_k"], 1) if v is not None)
            badge = f" [{c['badge']}]" if c.get("badge") else ""
            lines.append(
                f"  reference eval of {env_id} by {c['policy']}: {curve}, mean reward {c['mean_reward']}{badge}"
            )
        failed = sum(not c.passed for c in self.checks)
        lines.append(f"{len(self.checks) - failed} passed, {failed} failed: {'OK' if self.ok else 'NOT OK'}")
        return "\n".join(lines)
