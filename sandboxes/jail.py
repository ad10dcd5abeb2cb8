"""The bubblewrap command line for one jailed worker, and the environment it starts with.

Traps handled here (sandboxes digest §0.4): bwrap is started with a scrubbed environment because its
PID 1 keeps the launcher's environment readable in /proc/1/environ; as root it is started under an
unprivileged per-slot uid (else the jail's uid maps to host uid 0); `--new-session` so no controlling
tty is reachable (TIOCSTI); `--die-with-parent` so a jail never outlives its host.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from functools import cache

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
# What each jail holds of ours: every module of sandboxes/injail/ (the worker `zygote.py` and its siblings), no other.
IN_JAIL_DIR = os.path.join(PACKAGE_DIR, "injail")
IN_JAIL_MODULES = tuple(
    sorted(name for name in os.listdir(IN_JAIL_DIR) if name.endswith(".py") and name != "__init__.py")
)
JAIL_CODE_DIR = "/opt/sandboxes"
SITE_MOUNT = "/opt/site"
INSIDE_UID = 1000
TMPFS_MB = 256

JAIL_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/tmp/work",
    "TMPDIR": "/tmp",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONUNBUFFERED": "0",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "NUMEXPR_NUM_THREADS": "1",
    "MPLBACKEND": "Agg",
}
LAUNCH_ENV = {"PATH": "/usr/bin:/bin"}  # what bwrap itself (jail PID 1) sees: nothing secret
# network="loopback": the jail keeps its own network namespace (a loopback device and nothing else), and the
# zygote's seccomp filter and Landlock rule set then allow TCP/UDP sockets in it (read by bpf_filter and landlock
# from this variable of the zygote's environment, set before they are installed)
NETWORK_ENV = "SANDBOX_NETWORK"
NETWORKS = ("none", "loopback")


def bwrap_path() -> str | None:
    return shutil.which("bwrap", path="/usr/bin:/bin:/usr/local/bin")


@cache
def bwrap_version() -> str | None:
    path = bwrap_path()
    if path is None:
        return None
    out = subprocess.run([path, "--version"], capture_output=True, text=True, env=LAUNCH_ENV, timeout=10)
    return out.stdout.strip() or None


def _root_entries() -> list[str]:
    """bwrap arguments recreating /bin, /lib* and /sbin as the host has them (merged-/usr symlinks or dirs)."""
    args: list[str] = []
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = "/" + name
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    return args


def zygote_config(
    preload: list[str], site_dirs: list[str], persistent: bool, pid_namespace: bool = True, network: str = "none"
) -> dict:
    return {
        "preload": preload,
        "site": [f"{SITE_MOUNT}/{i}" for i in range(len(site_dirs))] if pid_namespace else site_dirs,
        "persistent": persistent,
        "pid_namespace": pid_namespace,
        "env": JAIL_ENV if network == "none" else {**JAIL_ENV, NETWORK_ENV: network},
    }


def bwrap_argv(
    python: str, config: dict, site_dirs: list[str], binds: list[tuple[str, str]] = ()
) -> tuple[list[str], list[int]]:
    """The command line and the fds it needs passed: the in-jail modules are copied in from open
    files, site dirs and ``binds`` (host dir, jail path; read-only) bound from open dirs, so no host
    path shows up in the jail's /proc/1/cmdline."""
    bwrap = bwrap_path()
    if bwrap is None:
        raise FileNotFoundError("bwrap is not installed (apt-get install bubblewrap)")
    args = [
        bwrap,
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--uid",
        str(INSIDE_UID),
        "--gid",
        str(INSIDE_UID),
        "--cap-drop",
        "ALL",
        "--die-with-parent",
        "--new-session",
        "--hostname",
        "sandbox",
        "--clearenv",
    ]
    for key, value in JAIL_ENV.items():
        args += ["--setenv", key, value]
    args += ["--ro-bind", "/usr", "/usr", *_root_entries()]
    for path in ("/etc/ld.so.cache", "/etc/alternatives", "/etc/localtime"):
        if os.path.exists(path):
            args += ["--ro-bind", path, path]
    args += ["--proc", "/proc", "--dev", "/dev", "--size", str(TMPFS_MB << 20), "--tmpfs", "/tmp"]
    args += ["--size", str(64 << 20), "--tmpfs", "/dev/shm"]
    fds = []
    for name in IN_JAIL_MODULES:
        fds.append(os.open(os.path.join(IN_JAIL_DIR, name), os.O_RDONLY))
        args += ["--perms", "0444", "--ro-bind-data", str(fds[-1]), f"{JAIL_CODE_DIR}/{name}"]
    for i, host_dir in enumerate(site_dirs):
        fds.append(os.open(host_dir, os.O_PATH | os.O_DIRECTORY))
        args += ["--ro-bind-fd", str(fds[-1]), f"{SITE_MOUNT}/{i}"]
    for host_dir, jail_path in binds:
        fds.append(os.open(host_dir, os.O_PATH | os.O_DIRECTORY))
        args += ["--ro-bind-fd", str(fds[-1]), jail_path]
    if not python.startswith("/usr/"):
        args += ["--ro-bind", python, python]
    # the root and /dev are tmpfs the jail's uid owns: read-only, their mode, times and xattrs carry nothing between
    # executions (/tmp and /dev/shm are mounts of their own, restored by the zygote's wipe)
    args += ["--remount-ro", "/dev", "--remount-ro", "/"]
    args += ["--chdir", "/tmp", "--", python, "-I", "-S", f"{JAIL_CODE_DIR}/zygote.py", json.dumps(config)]
    return args, fds


def launcher_argv(procs_files: list[str], argv: list[str]) -> list[str]:
    """Prefix `argv` with the launcher (sandboxes/launcher.py): joins the cgroups, reaps the jail."""
    python = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
    return [python, "-I", "-S", os.path.join(PACKAGE_DIR, "launcher.py"), *procs_files, "--", *argv]
