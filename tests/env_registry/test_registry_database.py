"""The registry's data layer: migrations (a root made before them keeps working), the ``--db`` URL, and the
concurrency guarantees on PostgreSQL with separate publishing processes and two server replicas."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import socket
import sqlite3
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psycopg
import pytest
from packaging_support import hatch_build, run_cli, start_server

from env_registry.packages.scaffold import init
from env_registry.store.client import RegistryClient
from env_registry.store.database import DatabaseError, database_url
from env_registry.store.local import LocalRegistry

# The schema and the writes of the store before migrations existed (env_registry/store.py up to this change).
LEGACY_SCHEMA = """
CREATE TABLE IF NOT EXISTS packages (name TEXT PRIMARY KEY, owner TEXT, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS releases (
    package TEXT NOT NULL REFERENCES packages(name), version TEXT NOT NULL, content_hash TEXT NOT NULL,
    summary TEXT NOT NULL, requires_python TEXT, manifests TEXT NOT NULL, publisher TEXT, uploaded REAL NOT NULL,
    yanked INTEGER NOT NULL DEFAULT 0, yanked_reason TEXT, PRIMARY KEY (package, version));
CREATE INDEX IF NOT EXISTS releases_by_hash ON releases (package, content_hash);
CREATE TABLE IF NOT EXISTS files (
    filename TEXT PRIMARY KEY, package TEXT NOT NULL, version TEXT NOT NULL, kind TEXT NOT NULL,
    sha256 TEXT NOT NULL, size INTEGER NOT NULL, FOREIGN KEY (package, version) REFERENCES releases);
CREATE INDEX IF NOT EXISTS files_by_release ON files (package, version);
CREATE TABLE IF NOT EXISTS env_ids (
    env_id TEXT NOT NULL, package TEXT NOT NULL, version TEXT NOT NULL, PRIMARY KEY (env_id, package, version));
CREATE INDEX IF NOT EXISTS env_ids_by_package ON env_ids (package, version);
CREATE TABLE IF NOT EXISTS tokens (
    id INTEGER PRIMARY KEY, publisher TEXT NOT NULL, digest TEXT NOT NULL UNIQUE, created REAL NOT NULL,
    revoked REAL);
"""


def legacy_publish(root: Path, release, publisher: str | None) -> None:
    root.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(root / "registry.db", isolation_level=None)
    db.executescript(LEGACY_SCHEMA)
    db.execute("BEGIN IMMEDIATE")
    if db.execute("SELECT 1 FROM packages WHERE name = ?", (release.name,)).fetchone() is None:
        db.execute("INSERT INTO packages VALUES (?, ?, ?)", (release.name, publisher, time.time()))
    manifests = json.dumps([m.model_dump(mode="json") for m in release.manifests])
    db.execute(
        "INSERT INTO releases VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0, NULL)",
        (release.name, release.version, release.content_hash, release.summary, release.requires_python, manifests)
        + (publisher, time.time()),
    )
    db.executemany(
        "INSERT INTO env_ids VALUES (?, ?, ?)", [(e, release.name, release.version) for e in release.env_ids]
    )
    (root / "files" / release.name).mkdir(parents=True, exist_ok=True)
    for path, kind in ((release.wheel, "wheel"), (release.sdist, "sdist")):
        sha256 = hashlib.sha256(path.read_bytes()).hexdigest()
        db.execute(
            "INSERT INTO files VALUES (?, ?, ?, ?, ?, ?)",
            (path.name, release.name, release.version, kind, sha256, path.stat().st_size),
        )
        shutil.copyfile(path, root / "files" / release.name / path.name)
    db.execute("COMMIT")
    db.close()


def test_a_root_made_before_migrations_keeps_working(echo, tmp_path):
    root = tmp_path / "old-root"
    legacy_publish(root, echo.releases["1.0.0"], "acme")
    legacy_publish(root, echo.releases["1.0.1"], "acme")
    token = "molt_legacy-token"
    with sqlite3.connect(root / "registry.db") as db:
        db.execute("UPDATE releases SET yanked = 1, yanked_reason = 'old bug' WHERE version = '1.0.0'")
        db.execute(
            "INSERT INTO tokens (publisher, digest, created) VALUES ('acme', ?, ?)",
            (hashlib.sha256(token.encode()).hexdigest(), time.time()),
        )

    registry = LocalRegistry(root)  # migrates: stamps the old schema as 0001, upgrades to the newest
    with sqlite3.connect(root / "registry.db") as db:
        assert db.execute("SELECT version_num FROM alembic_version").fetchone() == ("0004",)
    assert registry.resolve("acme/echo-v1").version == "1.0.1"
    old = registry.release("acme-echo", "1.0.0")
    assert old.yanked and old.yanked_reason == "old bug" and old.downloads == 0 and old.validation_status is None
    assert registry.token_publisher(token) == "acme"
    text, content_type = registry.readme("acme-echo", "1.0.1")  # read from the stored wheel, once
    assert "Release 1.0.1." in text and content_type == "text/markdown"
    with sqlite3.connect(root / "registry.db") as db:
        assert "Release 1.0.1." in db.execute("SELECT readme FROM releases WHERE version = '1.0.1'").fetchone()[0]
    info = registry.publish(echo.releases["1.0.2"], publisher="acme")
    assert registry.resolve("acme/echo-v1").version == info.version == "1.0.2"
    registry.close()
    assert [r.version for r in LocalRegistry(root).package("acme-echo").releases] == ["1.0.0", "1.0.1", "1.0.2"]


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("mysql://u:secret@h/db", "is not supported"),
        ("not a url", "is not a database URL"),
        ("sqlite://", "is not supported"),
    ],
)
def test_db_urls_other_than_sqlite_and_postgresql_are_refused(tmp_path, url, message):
    with pytest.raises(DatabaseError, match=message) as caught:
        database_url(tmp_path, url)
    assert "secret" not in str(caught.value)  # passwords are never echoed
    out = run_cli("token", "list", "--root", str(tmp_path / "r"), "--db", url)
    assert out.returncode == 2 and message in out.stderr


def test_the_head_revision_is_the_newest_migration():
    from alembic.script import ScriptDirectory

    from env_registry.store.database import HEAD_REVISION, alembic_config

    assert ScriptDirectory.from_config(alembic_config()).get_current_head() == HEAD_REVISION


def test_an_unreachable_database_is_a_clear_error(tmp_path):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = run_cli("token", "list", "--root", str(tmp_path), "--db", f"postgresql://molt:hunter2@127.0.0.1:{port}/x")
    assert out.returncode == 2 and "cannot open the registry database" in out.stderr, out.stderr
    assert "hunter2" not in out.stderr and "Traceback" not in out.stderr


def test_postgresql_urls_get_the_psycopg_driver(tmp_path):
    assert database_url(tmp_path, "postgresql://u:p@h:5/db").drivername == "postgresql+psycopg"
    assert str(database_url(tmp_path, None)) == f"sqlite:///{tmp_path}/registry.db"


def test_token_commands_take_db_and_postgresql_keeps_only_digests(postgres, tmp_path):
    db = postgres.new_database()
    minted = run_cli("token", "mint", "--root", str(tmp_path), "--db", db, "--publisher", "acme")
    assert minted.returncode == 0, minted.stderr
    token = minted.stdout.strip().splitlines()[-1]
    assert run_cli("token", "revoke", "1", "--root", str(tmp_path), "--db", db).returncode == 0
    assert run_cli("token", "list", "--root", str(tmp_path), "--db", db).stdout.split() == ["1", "acme", "revoked"]
    with psycopg.connect(db) as conn:
        rows = conn.execute("SELECT * FROM tokens").fetchall()
    assert len(rows) == 1 and token not in repr(rows) and hashlib.sha256(token.encode()).hexdigest() in repr(rows)
    assert not (tmp_path / "registry.db").exists()  # the metadata went to PostgreSQL, not next to the files


# 20 publishing processes (forked from one that imported httpx), released together by a barrier
PUBLISHERS = textwrap.dedent(
    """
    import json, multiprocessing, sys
    from pathlib import Path
    import httpx
    jobs = json.loads(sys.argv[1])
    context = multiprocessing.get_context("fork")
    barrier, results = context.Barrier(len(jobs)), context.Queue()

    def publish(i, url, token, wheel, sdist):
        files = {"wheel": (Path(wheel).name, open(wheel, "rb")), "sdist": (Path(sdist).name, open(sdist, "rb"))}
        barrier.wait()
        r = httpx.post(url + "/api/packages", files=files, headers={"Authorization": "Bearer " + token}, timeout=300)
        results.put((i, r.status_code, r.json()))

    processes = [context.Process(target=publish, args=(i, *job)) for i, job in enumerate(jobs)]
    for p in processes:
        p.start()
    found = sorted(results.get(timeout=300) for _ in jobs)
    for p in processes:
        p.join()
    print(json.dumps([{"status": status, "body": body} for _, status, body in found]))
    """
)


def test_twenty_publishing_processes_and_two_replicas_on_one_postgresql(postgres, tmp_path):
    """Two `molt-env serve` replicas share one database and one file store; 20 processes publish at once through
    both: 8 distinct packages, 6 trees of one package version, 6 packages claiming one env ID."""
    db = postgres.new_database()
    root = tmp_path / "shared-root"
    with ThreadPoolExecutor(2) as pool:  # the replicas start (and migrate the new database) at the same time
        replicas = list(pool.map(lambda _: start_server(root, "--db", db), range(2)))
    try:
        releases = [hatch_build(init(tmp_path / f"d{i}", f"conc/pkg{i}-v1"), tmp_path / f"dd{i}") for i in range(8)]
        for i in range(6):
            src = init(tmp_path / f"race{i}", "conc/race-v1")
            (src / "README.md").write_text(f"racer {i}\n")
            releases.append(hatch_build(src, tmp_path / f"rr{i}"))
        for i in range(6):
            src = init(tmp_path / f"claim{i}", "conc/shared-v1", package=f"conc-shared-{'abcdef'[i]}")
            releases.append(hatch_build(src, tmp_path / f"cc{i}"))
        jobs = [(replicas[i % 2].url, replicas[0].token, str(r.wheel), str(r.sdist)) for i, r in enumerate(releases)]
        out = subprocess.run(
            [sys.executable, "-c", PUBLISHERS, json.dumps(jobs)], capture_output=True, text=True, timeout=400
        )
        assert out.returncode == 0, out.stderr[-3000:]
        results = json.loads(out.stdout)
        statuses = [r["status"] for r in results]
        assert statuses.count(201) == 10 and statuses.count(409) == 10, results
        conflicts = [r["body"]["detail"] for r in results if r["status"] == 409]
        assert sum("conc-race 0.1.0 is already published" in c for c in conflicts) == 5
        assert sum("env ID 'conc/shared-v1' is already provided by package 'conc-shared-" in c for c in conflicts) == 5

        states = [httpx.get(f"{r.url}/api/packages").json() for r in replicas]
        assert states[0] == states[1] and len(states[0]) == 10  # the replicas serve one state
        assert [e for e in httpx.get(f"{replicas[1].url}/api/envs").json() if e["env_id"] == "conc/shared-v1"] == [
            e for e in httpx.get(f"{replicas[0].url}/api/envs").json() if e["env_id"] == "conc/shared-v1"
        ]
        for package in states[0]:
            page = httpx.get(f"{replicas[1].url}/simple/{package['name']}/").text
            links = re.findall(r'href="([^"#]+)#sha256=([0-9a-f]{64})"', page)
            assert len(links) == 2
            for href, sha256 in links:
                assert hashlib.sha256(httpx.get(replicas[0].url + href).content).hexdigest() == sha256
        on_disk = sorted(p.name for p in (root / "files").iterdir())
        assert on_disk == sorted(p["name"] for p in states[0])  # no file of a losing publish stayed behind
        assert not list((root / "staging").iterdir())

        # a yank through one replica is what the other one resolves
        a, b = (RegistryClient(r.url, replicas[0].token) for r in replicas)
        winner = a.resolve("conc/race-v1")
        a.yank("conc-race", winner.version, "raced")
        assert b.package("conc-race").releases[0].yanked_reason == "raced"
        assert httpx.get(f"{replicas[1].url}/packages/conc-race").text.count("yanked: raced") >= 1
    finally:
        for replica in replicas:
            replica.stop()
