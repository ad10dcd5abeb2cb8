"""Resource limits for one execution, validated up front with errors that name the bad value."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class Limits:
    """Per-execution limits. Defaults follow the sandboxes digest §4.5.

    wall_s: wall-clock deadline; the whole process tree is killed when it passes (status "timeout").
    cpu_s: CPU seconds of the snippet's own process (RLIMIT_CPU, status "cpu_limit").
    memory_mb: address-space cap of each process (RLIMIT_AS) and the basis of the jail's memory
        cgroup (plus `cgroup_headroom_mb` for the warm worker itself); status "oom".
    max_output_bytes: stdout+stderr bytes kept; more kills the run (status "output_limit", truncated).
    file_size_mb: largest file a snippet may write (RLIMIT_FSIZE).
    open_files: RLIMIT_NOFILE. processes: RLIMIT_NPROC for the jail's uid and its pids cgroup.

    Raises:
        ValueError: for a value out of its range (the message names the field, the value and the range).
    """

    wall_s: float = 10.0
    cpu_s: float | None = None
    memory_mb: int = 1024
    max_output_bytes: int = 65536
    file_size_mb: int = 16
    open_files: int = 128
    processes: int = 64
    cgroup_headroom_mb: int = 256

    def __post_init__(self) -> None:
        if self.cpu_s is None:
            object.__setattr__(self, "cpu_s", self.wall_s)
        for name in ("wall_s", "cpu_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0 < value <= 3600:
                raise ValueError(f"{name}={value!r} must be a number of seconds in (0, 3600]")
        for name, low, high in (
            ("memory_mb", 32, 1 << 20),
            ("max_output_bytes", 1, 1 << 26),
            ("file_size_mb", 1, 1 << 20),
            ("open_files", 16, 1 << 20),
            ("processes", 8, 1 << 16),
            ("cgroup_headroom_mb", 0, 1 << 20),
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                raise ValueError(f"{name}={value!r} must be an integer in [{low}, {high}]")

    def replace(self, **changes: object) -> Limits:
        """A copy with `changes` applied (None values ignored); `cpu_s` follows a new `wall_s` when it followed the old.

        Raises:
            ValueError: for a value out of its range.
        """
        changes = {k: v for k, v in changes.items() if v is not None}
        if not changes:
            return self
        merged = {**self.to_wire(), **changes}
        if "wall_s" in changes and "cpu_s" not in changes and self.cpu_s == self.wall_s:
            merged["cpu_s"] = None
        return Limits(**merged)

    def to_wire(self) -> dict:
        """Every field as a plain dict (what a worker receives)."""
        return {name: getattr(self, name) for name in _FIELDS}


_FIELDS = tuple(f.name for f in fields(Limits))
