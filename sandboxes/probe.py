"""What this host can do for sandboxing, measured rather than assumed, and what "auto" picks."""

from __future__ import annotations

import importlib.util
import os
import platform
import subprocess
from dataclasses import asdict, dataclass, field
from functools import lru_cache

from sandboxes import cgroups, jail
from sandboxes.injail import bpf_filter, landlock


@dataclass(frozen=True)
class HostReport:
    """What `sandboxes.probe()` found on this host (each field commented below); `local_missing` says why the local
    jail cannot isolate (empty when it can), `auto` which provider "auto" picks (None: none works)."""

    bubblewrap: str | None  # "bubblewrap 0.8.0" or None when not installed
    user_namespaces: bool  # a bwrap jail with a user+pid+net namespace actually started
    user_namespaces_detail: str
    seccomp: bool  # kernel filter support and a filter for this architecture
    landlock_abi: int  # 0 = none; >= 6 adds signal/abstract-unix scoping
    cgroup: str | None  # "v1" | "v2" | None
    cgroup_writable: bool
    root: bool
    docker: str | None  # engine version when an engine answers
    docker_detail: str
    ray: bool
    local_missing: tuple[str, ...] = field(default=())
    auto: str | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def _seccomp_supported() -> bool:
    try:
        with open("/proc/self/status") as handle:
            has_field = any(line.startswith("Seccomp:") for line in handle)
    except OSError:
        return False
    return has_field and bpf_filter.supported()


@lru_cache(maxsize=1)
def _userns_check() -> tuple[bool, str]:
    path = jail.bwrap_path()
    if path is None:
        return False, "bwrap not installed"
    argv = [
        path,
        "--unshare-all",
        "--unshare-user",
        "--ro-bind",
        "/usr",
        "/usr",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--symlink",
        "usr/bin",
        "/bin",
        "--symlink",
        "usr/lib",
        "/lib",
        "--symlink",
        "usr/lib64",
        "/lib64",
        "/usr/bin/true",
    ]
    kwargs: dict = {}
    if os.geteuid() == 0:  # check what the workers will do: run bwrap as an unprivileged uid
        kwargs = {"user": 65534, "group": 65534, "extra_groups": []}
    try:
        out = subprocess.run(
            jail.launcher_argv([], argv), capture_output=True, text=True, env=jail.LAUNCH_ENV, timeout=20, **kwargs
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"bwrap failed to run: {exc}"
    if out.returncode != 0:
        return False, f"bwrap could not create namespaces: {out.stderr.strip() or out.returncode}"
    return True, "ok"


def _docker_check() -> tuple[str | None, str]:
    try:
        import docker
    except ImportError:
        return None, "the docker SDK is not installed (pip install docker)"
    if not os.environ.get("DOCKER_HOST") and not os.path.exists("/var/run/docker.sock"):
        return None, "no Docker engine: /var/run/docker.sock does not exist and DOCKER_HOST is unset"
    try:
        client = docker.from_env(timeout=3)
        try:
            return client.version().get("Version", "?"), "ok"
        finally:
            client.close()
    except Exception as exc:  # the SDK raises several unrelated types for "no engine"
        return None, f"no Docker engine answered: {exc}"


def probe(docker: bool = True) -> HostReport:
    """Check bubblewrap, user namespaces, seccomp, Landlock, cgroups and (optionally) Docker.

    Args:
        docker: also ask a Docker engine (a round trip; the local provider skips it).

    Returns:
        A `HostReport`; its `local_missing` lists why the local jail cannot isolate (empty when it can) and `auto`
        names the provider `sandboxes.open("auto")` picks (None when none works).
    """
    version = jail.bwrap_version()
    userns, userns_detail = _userns_check()
    seccomp = _seccomp_supported()
    kind = cgroups.version()
    writable = cgroups.writable()
    root = os.geteuid() == 0
    missing = []
    if version is None:
        missing.append("bubblewrap is not installed (apt-get install bubblewrap)")
    elif not userns:
        missing.append(f"user namespaces are unavailable ({userns_detail})")
    if not seccomp:
        missing.append(
            f"no seccomp filter support (kernel lacks it, or architecture {platform.machine()} is not x86_64)"
        )
    docker_version, docker_detail = _docker_check() if docker else (None, "not probed")
    has_ray = importlib.util.find_spec("ray") is not None
    auto = "local" if not missing else ("docker" if docker_version else None)
    return HostReport(
        bubblewrap=version,
        user_namespaces=userns,
        user_namespaces_detail=userns_detail,
        seccomp=seccomp,
        landlock_abi=landlock.abi(),
        cgroup=kind,
        cgroup_writable=writable,
        root=root,
        docker=docker_version,
        docker_detail=docker_detail,
        ray=has_ray,
        local_missing=tuple(missing),
        auto=auto,
    )
