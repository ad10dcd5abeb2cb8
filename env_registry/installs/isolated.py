"""Isolated installs: an env package in a virtual environment of its own, served from there.

``molt-env install ID --isolated`` makes ``$MOLT_CACHE/isolated/<package>-<version>/venv`` (default cache
``~/.molt/cache``), pip-installs into it the package's wheel with its declared dependencies plus this project's env
runtime (``molt-ecosystem[remote]``: ``molt_envs``, ``env_registry``, ``sandboxes`` and the env server's
dependencies, not torch, ray or the trainer's), starts the env server there once to read each env's spec and spec
hash, and records all of it in ``install.json`` beside the venv. From then on the registry lists those IDs, and
``make(ID)`` / ``runner_for(ID)`` start (and reuse, and stop at exit) a server in that venv
(``env_registry.serving.managed_servers``). A failed install is recorded too, so ``make(ID)`` can say what failed.
The registry finds both through ``SOURCE``, this module's ``molt.sources`` entry point.

The runtime comes from where this project is installed: a source checkout (an editable install) is built into a
wheel once per content (cached under ``$MOLT_CACHE/runtime/``); an install from a local wheel reuses that wheel;
otherwise pip installs the same version from its index.
"""

from __future__ import annotations

import datetime
import hashlib
import importlib.metadata as metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
import warnings
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

from pydantic import BaseModel, ValidationError

from env_registry.errors import IsolatedInstallError
from env_registry.installs.pip import pip_install
from env_registry.registry import registry
from env_registry.remote import RemoteEnvSpec
from env_registry.serving.managed_servers import ManagedServer, managed_endpoint
from env_registry.sources import Source

PROJECT = "molt-ecosystem"
RUNTIME_EXTRA = "remote"
RECORD = "install.json"
BUILD_TIMEOUT_S = 600


class IsolatedInstall(BaseModel):
    """What ``install.json`` records about one package version installed in its own venv."""

    package: str
    version: str
    env_ids: list[str]
    venv: str
    python: str
    status: Literal["installed", "failed"]
    error: str | None = None
    specs: dict[str, dict[str, Any]] = {}  # env ID -> EnvSpec JSON, as the venv's registry made it
    hashes: dict[str, str] = {}  # env ID -> spec hash, as the venv's registry computed it
    runtime: str = ""  # the requirement this project's runtime was installed from
    installed_at: str = ""

    @property
    def where(self) -> str:
        return f"the isolated install of {self.package} {self.version} ({self.venv})"


def cache_dir() -> Path:
    return Path(os.environ.get("MOLT_CACHE") or "~/.molt/cache").expanduser()


def records() -> list[IsolatedInstall]:
    """Every readable ``install.json`` under the cache (an unreadable one is skipped with a warning)."""
    found = []
    for path in sorted((cache_dir() / "isolated").glob(f"*/{RECORD}")):
        try:
            found.append(IsolatedInstall.model_validate_json(path.read_text()))
        except (OSError, ValidationError) as exc:
            warnings.warn(f"skipping the unreadable isolated install record {path}: {exc}", stacklevel=2)
    return found


def served_specs(record: IsolatedInstall) -> list[RemoteEnvSpec]:
    """The specs of an installed record, each reaching its server (started on first use) in the record's venv."""
    specs = []
    for env_id in record.env_ids:

        def endpoint(env_id: str = env_id) -> Any:
            return managed_endpoint(record.python, env_id, record.where, record.hashes[env_id])

        specs.append(RemoteEnvSpec.served(record.specs[env_id], record.hashes[env_id], record.where, endpoint))
    return specs


def install_release(info: Any, wheel: Path) -> IsolatedInstall:
    """Install a verified release wheel (``info``: its ``ReleaseInfo``) into a fresh venv of its own and record it.

    Raises:
        IsolatedInstallError: the venv, pip or the env server failed (recorded as a failed install).
    """
    root = cache_dir() / "isolated" / f"{info.package}-{info.version}"
    venv = root / "venv"
    record = IsolatedInstall(
        package=info.package,
        version=info.version,
        env_ids=list(info.env_ids),
        venv=str(venv),
        python=str(venv / "bin" / "python"),
        status="failed",
        installed_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    )
    try:
        root.mkdir(parents=True, exist_ok=True)
        # without pip of its own (this interpreter's pip installs into it): a venv in half a second, not ten
        _run([sys.executable, "-m", "venv", "--clear", "--without-pip", str(venv)], f"creating the venv {venv}")
        record.runtime = runtime_requirement()
        pip_install([record.runtime, str(wheel)], f"{info.package} {info.version} into {venv}", into=record.python)
        for env_id in record.env_ids:
            server = ManagedServer(record.python, env_id, record.where)
            try:
                server.start()
                record.specs[env_id], record.hashes[env_id] = server.metadata.spec, server.metadata.hash
            finally:
                server.stop()
                server.log_path.unlink(missing_ok=True)
    except Exception as exc:
        record.error = str(exc)
        _write(root, record)
        raise IsolatedInstallError(
            f"the isolated install of {info.package} {info.version} failed (recorded in {root / RECORD}): {exc}"
        ) from None
    record.status = "installed"
    _write(root, record)
    for spec in served_specs(record):  # make(ID) works in this process from now on
        registry.add_served(spec)
    return record


def _write(root: Path, record: IsolatedInstall) -> None:
    tmp = root / f".{RECORD}.tmp"
    tmp.write_text(record.model_dump_json(indent=1))
    os.replace(tmp, root / RECORD)


def _run(cmd: list[str], what: str) -> None:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise IsolatedInstallError(f"{what}: `{' '.join(cmd)}`: {exc}") from None
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-20:])
        raise IsolatedInstallError(f"{what}: `{' '.join(cmd)}` failed (exit {proc.returncode}):\n{tail}")


def runtime_requirement() -> str:
    """The pip requirement that gives a venv this project's env runtime, at this installation's exact code."""
    try:
        dist = metadata.distribution(PROJECT)
    except metadata.PackageNotFoundError:
        raise IsolatedInstallError(f"{PROJECT} is not installed here, so there is no env runtime to install") from None
    direct = json.loads(dist.read_text("direct_url.json") or "null") or {}
    url = direct.get("url", "")
    if url.startswith("file://"):
        path = Path(unquote(urlsplit(url).path))
        wheel = runtime_wheel(path) if "dir_info" in direct else path if path.suffix == ".whl" else None
        if wheel is not None and wheel.is_file():
            return f"{PROJECT}[{RUNTIME_EXTRA}] @ {wheel.as_uri()}"
    return f"{PROJECT}[{RUNTIME_EXTRA}]=={dist.version}"


def runtime_wheel(source: Path) -> Path:
    """This project's wheel built from the source tree at ``source``, once per content of what the wheel ships."""
    try:
        pyproject = tomllib.loads((source / "pyproject.toml").read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise IsolatedInstallError(f"cannot read the {PROJECT} source tree at {source}: {exc}") from None
    packages = pyproject.get("tool", {}).get("hatch", {}).get("build", {}).get("targets", {}).get("wheel", {})
    digest = hashlib.sha256((source / "pyproject.toml").read_bytes())
    for package in packages.get("packages", []):
        for path in sorted((source / package).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                digest.update(f"{path.relative_to(source)}\0".encode())
                digest.update(path.read_bytes())
    out = cache_dir() / "runtime" / digest.hexdigest()[:16]
    built = sorted(out.glob("*.whl"))
    if built:
        return built[0]
    cmd = [sys.executable, "-m", "build", "--wheel", str(source)]
    if importlib.util.find_spec("hatchling") is not None:
        cmd.insert(3, "--no-isolation")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".build-", dir=out.parent) as tmp:
        _run([*cmd, "--outdir", tmp], f"building the {PROJECT} runtime wheel from {source}")
        wheels = sorted(Path(tmp).glob("*.whl"))
        if len(wheels) != 1:
            raise IsolatedInstallError(f"building {source} made {[w.name for w in wheels]}, not one wheel")
        out.mkdir(exist_ok=True)
        target = out / wheels[0].name
        shutil.move(wheels[0], target)
    return target


def install_of(env_id: str) -> IsolatedInstall | None:
    """The installed isolated install that provides ``env_id`` (an unpinned ID, as its spec names it), if any."""
    return next((r for r in records() if r.status == "installed" and env_id in r.env_ids), None)


def failed_install(env_id: str) -> IsolatedInstall | None:
    """The failed isolated install that was to provide ``env_id``, if there is one."""
    return next((r for r in records() if r.status == "failed" and env_id in r.env_ids), None)


class IsolatedInstalls(Source):
    """The ``molt.sources`` entry of isolated installs: their IDs, and why one that failed is missing."""

    def listed(self) -> list[RemoteEnvSpec]:
        return [spec for record in records() if record.status == "installed" for spec in served_specs(record)]

    def missing(self, env_id: str) -> Exception | None:
        failed = failed_install(env_id)
        if failed is None:
            return None
        return IsolatedInstallError(
            f"{env_id!r} was to come from {failed.where}, which failed: {failed.error}; fix it and "
            f"run `molt-env install {env_id} --isolated` again"
        )


SOURCE = IsolatedInstalls()
