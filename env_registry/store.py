"""A registry on disk: release files under ``files/<package>/`` and their metadata in one SQLite database.

This is the local directory registry (``--registry DIR``) and also the storage of the registry server, so both
follow the same rules: versions are immutable, identical content under a new version is refused unless asked for,
an env ID belongs to one package, yanked versions resolve only by exact pin. A publish checks those rules and moves
its files into place inside one ``BEGIN IMMEDIATE`` transaction, so concurrent publishers (threads or processes)
serialize: one wins, the others get a ``Conflict`` naming what they collided with.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import sqlite3
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from packaging.version import Version
from pydantic import BaseModel

from env_registry import names
from env_registry.artifacts import Release, file_sha256
from env_registry.errors import Error
from env_registry.ids import parse_env_id

SCHEMA = """
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
TOKEN_PREFIX = "molt_"


class Conflict(Error):
    """The publish or yank collides with what the registry already holds (HTTP 409)."""


class NotFound(Error, LookupError):
    """No such package, version, env ID or file (HTTP 404)."""


class Forbidden(Error, PermissionError):
    """The token's publisher does not own the package (HTTP 403)."""


class FileInfo(BaseModel):
    filename: str
    kind: str  # "wheel" | "sdist"
    sha256: str
    size: int
    url: str  # relative to the registry root: files/<package>/<filename>


class ReleaseInfo(BaseModel):
    package: str
    version: str
    content_hash: str
    summary: str
    requires_python: str | None
    env_ids: list[str]
    manifests: list[dict[str, Any]]
    publisher: str | None
    uploaded: float
    yanked: bool
    yanked_reason: str | None
    files: list[FileInfo]

    @property
    def wheel(self) -> FileInfo:
        return next(f for f in self.files if f.kind == "wheel")


class PackageInfo(BaseModel):
    name: str
    owner: str | None
    latest: str | None  # newest non-yanked version
    env_ids: list[str]
    releases: list[ReleaseInfo]


class EnvIdInfo(BaseModel):
    env_id: str
    package: str
    versions: list[str]  # every published package version providing it, oldest first
    latest: str | None  # what an unpinned install gets (newest non-yanked)


class TokenInfo(BaseModel):
    id: int
    publisher: str
    created: float
    revoked: float | None


def _check_owner(package: str, owner: str | None, publisher: str) -> None:
    """A token's publisher may change only its own packages; one published locally (no owner) is local-only."""
    if owner is None:
        raise Forbidden(
            f"package {package!r} was published locally (it has no owner), so only local publishing "
            "may add to or yank it (molt-env publish --registry DIR); choose another package name"
        )
    if owner != publisher:
        raise Forbidden(
            f"package {package!r} belongs to publisher {owner!r}, not {publisher!r}; "
            "publish it with one of their tokens, or choose another package name"
        )


class LocalRegistry:
    """The registry under ``root`` (created on first use). ``label``: how error messages name it (a server passes
    one, so that its clients never see its file system paths)."""

    def __init__(self, root: str | Path, label: str | None = None) -> None:
        self.root = Path(root).expanduser().resolve()
        self.label = label
        self.files = self.root / "files"
        self.staging = self.root / "staging"
        for d in (self.files, self.staging):
            d.mkdir(parents=True, exist_ok=True)
        with self._connect() as db:
            db.executescript(SCHEMA)

    def __repr__(self) -> str:
        return self.label or f"LocalRegistry({str(self.root)!r})"

    # -- connections --
    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.root / "registry.db", timeout=60, isolation_level=None, check_same_thread=False)
        db.row_factory = sqlite3.Row
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA foreign_keys=ON")
            yield db
        finally:
            db.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; ``BEGIN IMMEDIATE`` takes the write lock up front, so checks and writes are atomic."""
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise

    # -- publishing --
    def publish(self, release: Release, publisher: str | None = None, allow_same_content: bool = False) -> ReleaseInfo:
        """Add a release (validated by ``inspect_release``); ``publisher`` is the token's owner, None for local use."""
        staged = self.staging / uuid.uuid4().hex
        staged.mkdir()
        try:
            files = []
            for path, kind in ((release.wheel, "wheel"), (release.sdist, "sdist")):
                target = staged / path.name
                shutil.copyfile(path, target)
                files.append((target, kind, file_sha256(target), target.stat().st_size))
            return self._commit(release, files, publisher, allow_same_content)
        finally:
            shutil.rmtree(staged, ignore_errors=True)

    def _commit(
        self, release: Release, files: list[tuple[Path, str, str, int]], publisher: str | None, allow_same_content: bool
    ) -> ReleaseInfo:
        name, version = release.name, release.version
        placed: list[Path] = []  # removed again if the transaction does not commit
        try:
            with self._write() as db:
                new_package = self._check_publishable(db, release, publisher, allow_same_content)
                now = time.time()
                if new_package:
                    db.execute("INSERT INTO packages VALUES (?, ?, ?)", (name, publisher, now))
                manifests = json.dumps([m.model_dump(mode="json") for m in release.manifests])
                db.execute(
                    "INSERT INTO releases VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0, NULL)",
                    (
                        name,
                        version,
                        release.content_hash,
                        release.summary,
                        release.requires_python,
                        manifests,
                        publisher,
                        now,
                    ),
                )
                db.executemany("INSERT INTO env_ids VALUES (?, ?, ?)", [(e, name, version) for e in release.env_ids])
                directory = self.files / name
                directory.mkdir(exist_ok=True)
                for path, kind, sha256, size in files:
                    db.execute(
                        "INSERT INTO files VALUES (?, ?, ?, ?, ?, ?)", (path.name, name, version, kind, sha256, size)
                    )
                    os.replace(path, directory / path.name)
                    placed.append(directory / path.name)
        except BaseException:
            for path in placed:
                path.unlink(missing_ok=True)
            raise
        return self.release(name, version)

    def _check_publishable(
        self, db: sqlite3.Connection, release: Release, publisher: str | None, allow_same_content: bool
    ) -> bool:
        """Raise unless ``release`` may be added; True when its package is new. Runs inside the write transaction."""
        name, version = release.name, release.version
        row = db.execute("SELECT owner FROM packages WHERE name = ?", (name,)).fetchone()
        if row is not None and publisher is not None:
            _check_owner(name, row["owner"], publisher)
        existing = db.execute("SELECT version, content_hash FROM releases WHERE package = ?", (name,)).fetchall()
        for other in existing:
            if Version(other["version"]) == Version(version):
                same = "the same" if other["content_hash"] == release.content_hash else "different"
                raise Conflict(
                    f"{name} {other['version']} is already published (with {same} content); published "
                    f"versions are immutable: bump the version in pyproject.toml"
                )
        duplicate = [o["version"] for o in existing if o["content_hash"] == release.content_hash]
        if duplicate and not allow_same_content:
            raise Conflict(
                f"{name} {version} has the same content (hash {release.content_hash[:12]}) as the "
                f"published version {duplicate[0]}; change the package, or pass --allow-same-content "
                "to publish it again under a new version"
            )
        for env_id in release.env_ids:
            self._check_env_id_free(db, env_id, name, publisher)
        return row is None

    @staticmethod
    def _check_env_id_free(db: sqlite3.Connection, env_id: str, package: str, publisher: str | None) -> None:
        """An env ID belongs to one package; its other ``-vN`` versions may only come from the same publisher."""
        base = parse_env_id(env_id).base
        rows = db.execute(
            "SELECT DISTINCT e.env_id, e.package, p.owner FROM env_ids e JOIN packages p "
            "ON p.name = e.package WHERE e.package != ? AND (e.env_id = ? OR e.env_id LIKE ?)",
            (package, env_id, f"{base}-v%"),
        ).fetchall()
        for row in rows:
            if row["env_id"] == env_id:
                raise Conflict(
                    f"env ID {env_id!r} is already provided by package {row['package']!r}; an env ID "
                    "belongs to one package: pick another ID"
                )
            if parse_env_id(row["env_id"]).base == base and (publisher is None or row["owner"] != publisher):
                raise Conflict(
                    f"env {base!r} is already provided by package {row['package']!r} (as "
                    f"{row['env_id']!r}); only its publisher may add versions of it: pick another name"
                )

    def yank(self, package: str, version: str, reason: str, publisher: str | None = None) -> ReleaseInfo:
        """Mark a release yanked (PEP 592): resolution skips it, an exact pin still installs it."""
        info = self.release(package, version)
        with self._write() as db:
            owner = db.execute("SELECT owner FROM packages WHERE name = ?", (info.package,)).fetchone()["owner"]
            if publisher is not None:
                _check_owner(info.package, owner, publisher)
            db.execute(
                "UPDATE releases SET yanked = 1, yanked_reason = ? WHERE package = ? AND version = ?",
                (reason, info.package, info.version),
            )
        return self.release(info.package, info.version)

    # -- reading --
    def release(self, package: str, version: str) -> ReleaseInfo:
        name = names.package_name(package)
        with self._connect() as db:
            rows = db.execute("SELECT * FROM releases WHERE package = ?", (name,)).fetchall()
            match = [r for r in rows if Version(r["version"]) == Version(names.package_version(version))]
            if not match:
                raise NotFound(
                    f"{name} {version} is not in {self}; published versions: {[r['version'] for r in rows] or 'none'}"
                )
            return self._release_info(db, match[0])

    def package(self, package: str) -> PackageInfo:
        name = names.package_name(package)
        with self._connect() as db:
            row = db.execute("SELECT * FROM packages WHERE name = ?", (name,)).fetchone()
            if row is None:
                raise NotFound(f"package {name!r} is not in {self}")
            releases = [
                self._release_info(db, r)
                for r in db.execute("SELECT * FROM releases WHERE package = ?", (name,)).fetchall()
            ]
        releases.sort(key=lambda r: Version(r.version))
        latest = _newest([r for r in releases if not r.yanked])
        env_ids = sorted({e for r in releases for e in r.env_ids})
        return PackageInfo(
            name=name, owner=row["owner"], latest=latest.version if latest else None, env_ids=env_ids, releases=releases
        )

    def packages(self) -> list[PackageInfo]:
        with self._connect() as db:
            package_names = [r["name"] for r in db.execute("SELECT name FROM packages ORDER BY name")]
        return [self.package(n) for n in package_names]

    def env_ids(self) -> list[EnvIdInfo]:
        """The env ID -> package index: every published env ID, its package and versions."""
        with self._connect() as db:
            rows = db.execute(
                "SELECT e.env_id, e.package, e.version, r.yanked FROM env_ids e "
                "JOIN releases r ON r.package = e.package AND r.version = e.version"
            ).fetchall()
        grouped: dict[tuple[str, str], list[sqlite3.Row]] = {}
        for row in rows:
            grouped.setdefault((row["env_id"], row["package"]), []).append(row)
        found = []
        for (env_id, package), group in sorted(grouped.items()):
            versions = sorted((r["version"] for r in group), key=Version)
            latest = _newest_version([r["version"] for r in group if not r["yanked"]])
            found.append(EnvIdInfo(env_id=env_id, package=package, versions=versions, latest=latest))
        return found

    def search(self, query: str) -> list[PackageInfo]:
        """Packages whose name, env IDs, description or tags contain ``query`` (case-insensitive)."""
        needle = query.lower()
        found = []
        for package in self.packages():
            haystack = [package.name, *package.env_ids]
            for release in package.releases:
                haystack += [release.summary, *(m.get("description", "") for m in release.manifests)]
                haystack += [t for m in release.manifests for t in m.get("tags", [])]
            if any(needle in text.lower() for text in haystack):
                found.append(package)
        return found

    def resolve(self, env_id: str) -> ReleaseInfo:
        """The release an env ID installs: its exact ``@pin`` (yanked or not), else the newest non-yanked version."""
        parsed = parse_env_id(env_id)
        with self._connect() as db:
            rows = db.execute(
                "SELECT env_id, package, version FROM env_ids WHERE env_id = ? OR env_id LIKE ?",
                (parsed.unpinned, f"{parsed.base}-v%"),
            ).fetchall()
        rows = [r for r in rows if parse_env_id(r["env_id"]).base == parsed.base]
        if parsed.version is None and rows:  # unversioned: the highest -vN published
            top = max(parse_env_id(r["env_id"]).version or 0 for r in rows)
            rows = [r for r in rows if (parse_env_id(r["env_id"]).version or 0) == top]
        else:
            rows = [r for r in rows if r["env_id"] == parsed.unpinned]
        if not rows:
            raise NotFound(f"no package in {self} provides env ID {parsed.unpinned!r}; see `molt-env search`")
        releases = [self.release(r["package"], r["version"]) for r in rows]
        if parsed.pin is not None:
            pinned = [r for r in releases if Version(r.version) == Version(names.package_version(parsed.pin))]
            if not pinned:
                raise NotFound(
                    f"{parsed.unpinned!r} has no package version {parsed.pin}; published: "
                    f"{sorted((r.version for r in releases), key=Version)}"
                )
            return pinned[0]
        newest = _newest([r for r in releases if not r.yanked])
        if newest is None:
            raise NotFound(
                f"every version providing {parsed.unpinned!r} is yanked "
                f"({', '.join(r.version for r in releases)}); pin one with '@<version>' to install it anyway"
            )
        return newest

    def file_path(self, package: str, filename: str) -> Path:
        name = names.package_name(package)
        file_name, _, _ = names.distribution_file(filename)
        path = self.files / name / filename
        if file_name != name or not path.is_file():
            raise NotFound(f"file {filename!r} of package {name!r} is not in {self}")
        return path

    def fetch(self, info: ReleaseInfo, file: FileInfo, dest: Path) -> Path:
        """Copy one release file to ``dest`` (a directory); the caller verifies its hash."""
        target = dest / file.filename
        shutil.copyfile(self.file_path(info.package, file.filename), target)
        return target

    def _release_info(self, db: sqlite3.Connection, row: sqlite3.Row) -> ReleaseInfo:
        files = db.execute(
            "SELECT * FROM files WHERE package = ? AND version = ? ORDER BY kind DESC", (row["package"], row["version"])
        ).fetchall()
        env_ids = [
            r["env_id"]
            for r in db.execute(
                "SELECT env_id FROM env_ids WHERE package = ? AND version = ? ORDER BY env_id",
                (row["package"], row["version"]),
            )
        ]
        return ReleaseInfo(
            package=row["package"],
            version=row["version"],
            content_hash=row["content_hash"],
            summary=row["summary"],
            requires_python=row["requires_python"],
            env_ids=env_ids,
            manifests=json.loads(row["manifests"]),
            publisher=row["publisher"],
            uploaded=row["uploaded"],
            yanked=bool(row["yanked"]),
            yanked_reason=row["yanked_reason"],
            files=[
                FileInfo(
                    filename=f["filename"],
                    kind=f["kind"],
                    sha256=f["sha256"],
                    size=f["size"],
                    url=f"files/{f['package']}/{f['filename']}",
                )
                for f in files
            ],
        )

    # -- publish tokens (stored as sha256 digests; the token itself is shown once, at minting) --
    def mint_token(self, publisher: str) -> tuple[int, str]:
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        with self._write() as db:
            cursor = db.execute(
                "INSERT INTO tokens (publisher, digest, created) VALUES (?, ?, ?)",
                (names.publisher_name(publisher), _digest(token), time.time()),
            )
        return int(cursor.lastrowid or 0), token

    def revoke_token(self, token_id: int) -> TokenInfo:
        with self._write() as db:
            if (
                db.execute(
                    "UPDATE tokens SET revoked = ? WHERE id = ? AND revoked IS NULL", (time.time(), token_id)
                ).rowcount
                == 0
            ):
                raise NotFound(f"no active token with id {token_id}; see `molt-env token list`")
        return next(t for t in self.tokens() if t.id == token_id)

    def tokens(self) -> list[TokenInfo]:
        with self._connect() as db:
            rows = db.execute("SELECT id, publisher, created, revoked FROM tokens ORDER BY id").fetchall()
        return [TokenInfo(**dict(r)) for r in rows]

    def token_publisher(self, token: str) -> str | None:
        """The publisher of an active token, or None."""
        with self._connect() as db:
            row = db.execute(
                "SELECT publisher FROM tokens WHERE digest = ? AND revoked IS NULL", (_digest(token),)
            ).fetchone()
        return row["publisher"] if row else None


def _newest_version(versions: list[str]) -> str | None:
    """The highest version, preferring final releases over pre-releases (as pip does)."""
    finals = [v for v in versions if not Version(v).is_prerelease]
    return max(finals or versions, key=Version, default=None)


def _newest(releases: list[ReleaseInfo]) -> ReleaseInfo | None:
    newest = _newest_version([r.version for r in releases])
    return next((r for r in releases if r.version == newest), None)


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()
