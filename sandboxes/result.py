"""What one execution produced. Model failures (timeout, OOM, crash) are results, not exceptions."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

# What a call's `Result.status` can be (the type, and the same values as a tuple).
Status = Literal["ok", "error", "timeout", "cpu_limit", "oom", "output_limit", "killed", "infra_error"]
STATUSES: tuple[str, ...] = ("ok", "error", "timeout", "cpu_limit", "oom", "output_limit", "killed", "infra_error")


@dataclass
class Result:
    """One execution's outcome.

    status: "ok" (exit 0), "error" (non-zero exit, e.g. an uncaught exception), "timeout" (wall
    deadline), "cpu_limit", "oom", "output_limit" (output cap hit, process killed), "killed" (died by
    a signal, see `signal`), or "infra_error" (the sandbox itself failed after one retry: never the
    model's fault, never turn it into reward). stdout/stderr are decoded with replacement characters;
    the raw bytes are in stdout_bytes/stderr_bytes.
    """

    status: Status
    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None
    signal: int | None = None
    truncated: bool = False
    wall_ms: float = 0.0
    cpu_ms: float | None = None
    provider: str = ""
    attempts: int = 1
    stdout_bytes: bytes = field(default=b"", repr=False)
    stderr_bytes: bytes = field(default=b"", repr=False)

    @property
    def ok(self) -> bool:
        """Whether the snippet exited 0 (status "ok")."""
        return self.status == "ok"

    @property
    def infra_error(self) -> bool:
        """Whether the sandbox itself failed (status "infra_error"): count it, never turn it into reward."""
        return self.status == "infra_error"

    @classmethod
    def from_wire(cls, reply: dict, provider: str, attempts: int = 1) -> Result:
        """A worker's reply as a Result.

        Raises:
            ValueError: if the reply's status is not one of `STATUSES`.
        """
        out, err = reply.get("stdout", b""), reply.get("stderr", b"")
        status = reply["status"]
        if status not in STATUSES:
            raise ValueError(f"worker reported unknown status {status!r}")
        return cls(
            status=status,
            stdout=out.decode("utf-8", errors="replace"),
            stderr=err.decode("utf-8", errors="replace"),
            exit_code=reply.get("exit_code"),
            signal=reply.get("signal"),
            truncated=bool(reply.get("truncated")),
            wall_ms=float(reply.get("wall_ms", 0.0)),
            cpu_ms=reply.get("cpu_ms"),
            provider=provider,
            attempts=attempts,
            stdout_bytes=out,
            stderr_bytes=err,
        )

    @classmethod
    def infra(cls, message: str, provider: str, attempts: int, wall_ms: float = 0.0) -> Result:
        """An "infra_error" Result carrying `message` as its stderr."""
        return cls(status="infra_error", stderr=message, provider=provider, attempts=attempts, wall_ms=wall_ms)
