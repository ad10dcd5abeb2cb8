"""Executing untrusted code: a fast local jail pool, a Docker tier and a Ray-spread pool.

    import sandboxes
    async with sandboxes.open("local", wall_s=10, cpu_s=10, memory_mb=1024, max_output_bytes=65536) as sb:
        r = await sb.run_python("print(sum(range(10)))")
        r = await sb.exec(["sh", "-c", "ls /"], stdin=b"")
    r.status, r.stdout, r.stderr, r.exit_code, r.signal, r.truncated, r.wall_ms, r.provider

`sandboxes.probe()` reports what this host supports and which provider "auto" picks.
The bottom layer of the project: imports nothing from molt_envs, env_registry or molt_train.
"""

from sandboxes.api import Sandbox, open, reap, shutdown, stats
from sandboxes.errors import SandboxError, SandboxUnavailable
from sandboxes.limits import Limits
from sandboxes.local import host_site_packages
from sandboxes.probe import HostReport, probe
from sandboxes.result import STATUSES, Result, Status

__all__ = [
    "STATUSES",
    "HostReport",
    "Limits",
    "Result",
    "Sandbox",
    "SandboxError",
    "SandboxUnavailable",
    "Status",
    "host_site_packages",
    "open",
    "probe",
    "reap",
    "shutdown",
    "stats",
]
