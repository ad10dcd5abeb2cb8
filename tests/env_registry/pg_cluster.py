"""A throwaway PostgreSQL cluster for the registry tests: Debian's ``initdb`` into a temporary directory, ``pg_ctl``
on a free loopback port, one fresh database per registry, everything removed at the end.

PostgreSQL refuses to run as root, so under root the cluster belongs to the ``postgres`` user (created by Debian's
``postgresql`` package) and its commands run through ``runuser``.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

import psycopg

USER = "molt"


def _bindir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    if initdb is None:
        raise RuntimeError(
            "PostgreSQL is not installed (no initdb): `apt-get install postgresql` (.ci/setup-machine.sh, which `make test` "
            "runs, installs it); the registry's tests run against SQLite and PostgreSQL both"
        )
    return Path(initdb).parent


@dataclass
class Cluster:
    base: Path
    port: int
    bindir: Path
    run_as: list[str]

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """The URL of a new, empty database."""
        name = f"reg_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url(), autocommit=True) as db:
            db.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        subprocess.run(
            [*self.run_as, str(self.bindir / "pg_ctl"), "-D", str(self.base / "data"), "-m", "immediate", "stop"],
            capture_output=True,
            timeout=60,
        )
        shutil.rmtree(self.base, ignore_errors=True)


def start() -> Cluster:
    """A running cluster with superuser ``molt`` (trust authentication, loopback only, no fsync)."""
    bindir = _bindir()
    base = Path(tempfile.mkdtemp(prefix="molt-pg-"))
    run_as: list[str] = []
    if os.geteuid() == 0:
        owner = pwd.getpwnam("postgres")
        os.chown(base, owner.pw_uid, owner.pw_gid)
        run_as = ["runuser", "-u", "postgres", "--"]
    try:
        subprocess.run(
            [*run_as, str(bindir / "initdb"), "-D", str(base / "data"), "-U", USER, "--auth=trust", "-E", "UTF8"]
            + ["--no-sync", "--no-instructions"],
            check=True,
            capture_output=True,
            text=True,
            timeout=120,
        )
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        options = f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off"
        options += " -c full_page_writes=off -c max_connections=300 -c shared_buffers=64MB"
        subprocess.run(
            [*run_as, str(bindir / "pg_ctl"), "-D", str(base / "data"), "-l", str(base / "log"), "-w", "-t", "60"]
            + ["-o", options, "start"],
            check=True,
            capture_output=True,
            text=True,
            timeout=90,
        )
    except subprocess.CalledProcessError as exc:
        log = (base / "log").read_text() if (base / "log").exists() else ""
        shutil.rmtree(base, ignore_errors=True)
        raise RuntimeError(f"the test PostgreSQL cluster did not start: {exc.stderr}\n{log}") from None
    return Cluster(base, port, bindir, run_as)
