"""Helpers of the package/registry tests: the CLI as a subprocess, fresh venvs, a live registry server, builds,
and an eval summary as `molt-env eval` writes one."""

from __future__ import annotations

import os
import re
import site
import socket
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import httpx

from env_registry.packages.artifacts import Release, inspect_release
from env_registry.store.client import RegistryClient
from env_registry.store.local import Conflict

MOLT_ENV = str(Path(sys.executable).with_name("molt-env"))


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """``molt-env ARGS`` as a user runs it (the installed console script, a real process)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MOLT_REGISTRY", "MOLT_TOKEN")}
    return subprocess.run([MOLT_ENV, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)


def make_venv(path: Path) -> Path:
    """A new venv whose own site-packages is empty; this venv's packages (molt-ecosystem, pip, pydantic, ...) are
    reachable through a .pth, the way ``--system-site-packages`` would give them. Installs land in the new venv."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    python = path / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    parent = site.getsitepackages()[0]
    Path(purelib, "molt_parent_env.pth").write_text(f"import site; site.addsitedir({parent!r})\n")
    return python


def in_venv(python: Path, code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(python), "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )


def hatch_build(root: Path, out: Path) -> Release:
    """Wheel + sdist with hatchling in this process (what ``python -m build`` runs, minus three interpreters)."""
    return inspect_release(*hatch_files(root, out))


def hatch_files(root: Path, out: Path) -> tuple[Path, Path]:
    """``(wheel, sdist)`` built by hatchling, not inspected (for builds a registry must refuse)."""
    from hatchling.builders.sdist import SdistBuilder
    from hatchling.builders.wheel import WheelBuilder

    out.mkdir(parents=True, exist_ok=True)
    wheel = next(WheelBuilder(str(root)).build(directory=str(out), versions=["standard"]))
    sdist = next(SdistBuilder(str(root)).build(directory=str(out), versions=["standard"]))
    return Path(wheel), Path(sdist)


def set_version(root: Path, version: str) -> None:
    path = root / "pyproject.toml"
    path.write_text(re.sub(r'(?m)^version = ".*"$', f'version = "{version}"', path.read_text(), count=1))


def rewrite_wheel(src: Path, dst: Path, member_suffix: str, transform) -> Path:
    """Copy a wheel, passing the member whose name ends with ``member_suffix`` through ``transform(text)``."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename.endswith(member_suffix):
                data = transform(data.decode()).encode()
            zout.writestr(info, data)
    return dst


@dataclass
class Server:
    url: str
    token: str
    root: Path
    process: subprocess.Popen
    db: str | None = None  # the --db URL it serves (None: the SQLite file in root)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()


def start_server(root: Path, *extra: str, deadline_s: float = 30) -> Server:
    """``molt-env serve`` on a free loopback port, with a freshly minted publish token for publisher 'acme'
    (``deadline_s``: how long it may take to answer, e.g. while it loads a reference checkpoint first)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = root.with_name(root.name + "-serve.log")
    with log.open("w") as out:
        process = subprocess.Popen(
            [MOLT_ENV, "serve", "--root", str(root), "--port", str(port), "--mint-token", "acme", *extra],
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline and process.poll() is None:
        match = re.search(r"\(shown once\): (\S+)", log.read_text())
        try:
            if match and httpx.get(f"{url}/api/health", timeout=1).status_code == 200:
                db = extra[extra.index("--db") + 1] if "--db" in extra else None
                return Server(url, match[1], root, process, db)
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"molt-env serve did not come up at {url}:\n{log.read_text()}")


# the summary.json of an eval of hub/demo-v1 1.1.0
SUMMARY = {
    "env_id": "hub/demo-v1",
    "package_version": "1.1.0",
    "spec_hash": "0123456789abcdef",
    "split": "test",
    "num_prompts": 40,
    "n": 4,
    "pass@1": 0.375,
    "pass@4": 0.625,
    "mean_reward": 0.41,
    "failures": {"grader_error": 1, "timeout": 2},
    "model": "runs/rl/hf",
    "seed": 7,
    "started": "2026-01-01T10:00:00Z",
    "finished": "2026-01-01T10:04:00Z",
    "report": {"per_env": [{"env_id": "hub/demo-v1", "mean_reward": 0.41}]},  # extra keys are kept
}


def publish(server, *releases) -> None:
    """Publish unless already there (the session's server is shared by tests in any order)."""
    for release in releases:
        try:
            RegistryClient(server.url, server.token).publish(release)
        except Conflict as exc:
            assert "with the same content" in str(exc), exc
