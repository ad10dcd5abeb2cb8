"""A registry: release files under ``<root>/files/<package>/`` and their metadata in one database.

This is the local directory registry (``--registry DIR``) and also the storage of the registry server, so both
follow the same rules: versions are immutable, identical content under a new version is refused unless asked for,
an env ID belongs to one package, yanked versions resolve only by exact pin. The database is the SQLite file
``<root>/registry.db`` unless ``db`` names a PostgreSQL database (``env_registry.store.database``). A publish checks those
rules and moves its files into place inside one transaction holding the registry's write lock, so concurrent
publishers (threads, processes, server replicas) serialize: one wins, the others get a ``Conflict`` naming what
they collided with.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import uuid
from pathlib import Path
from typing import Any, NamedTuple

import sqlalchemy as sa
from packaging.version import Version
from sqlalchemy.engine import Connection

from env_registry.errors import Error
from env_registry.ids import parse_env_id
from env_registry.packages import names
from env_registry.packages.artifacts import InvalidArtifact, Release, file_sha256, read_readme
from env_registry.store import database, queries
from env_registry.store.credentials import TOKEN_PREFIX, Credentials
from env_registry.store.database import env_ids as env_ids_table
from env_registry.store.database import files, packages, releases
from env_registry.store.eval_summaries import EvalSummaries
from env_registry.store.records import (
    Conflict,
    EnvIdInfo,
    EvalRecord,
    FileInfo,
    Forbidden,
    NotFound,
    PackageInfo,
    ReleaseInfo,
    TokenInfo,
)
from env_registry.store.validation_states import GATED, PENDING, ValidationStates, resolvable


class IndexLink(NamedTuple):
    """One file on a package's simple-index page."""

    filename: str
    sha256: str
    url: str  # relative to the registry root
    requires_python: str | None
    yanked: bool
    yanked_reason: str | None


__all__ = [  # the records are re-exported: callers import them from here
    "TOKEN_PREFIX",
    "Conflict",
    "EnvIdInfo",
    "EvalRecord",
    "FileInfo",
    "Forbidden",
    "IndexLink",
    "LocalRegistry",
    "NotFound",
    "PackageInfo",
    "ReleaseInfo",
    "TokenInfo",
]


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


class LocalRegistry(Credentials, EvalSummaries, ValidationStates):
    """The registry under ``root`` (created and migrated on first use).

    Args:
        root: the directory of the file store (and of the SQLite database, unless ``db`` is given).
        label: how error messages name it (a server passes one, so that its clients never see its paths).
        db: a database URL, ``postgresql://user:pass@host/db`` or ``sqlite:///path``; default ``<root>/registry.db``.

    Raises:
        DatabaseError: ``db`` is not a usable database URL, or the database cannot be reached.
    """

    def __init__(self, root: str | Path, label: str | None = None, db: str | None = None) -> None:
        self.root = Path(root).expanduser().resolve()
        self.label = label
        self.url = database.database_url(self.root, db)
        self.files = self.root / "files"
        self.staging = self.root / "staging"
        for d in (self.files, self.staging):
            d.mkdir(parents=True, exist_ok=True)
        self.engine = database.create(self.url)
        try:
            database.migrate(self.engine)
        except sa.exc.OperationalError as exc:
            self.engine.dispose()
            raise database.DatabaseError(
                f"cannot open the registry database {self.url.render_as_string(hide_password=True)}: "
                f"{str(exc.orig).strip()}; check --db (host, port, user, database) and that the server runs"
            ) from None

    def __repr__(self) -> str:
        if self.label:
            return self.label
        if self.url.get_backend_name() == "sqlite":
            return f"LocalRegistry({str(self.root)!r})"
        return f"LocalRegistry({str(self.root)!r}, db={self.url.render_as_string(hide_password=True)!r})"

    def close(self) -> None:
        """Close the database connections (the registry opens new ones if used again)."""
        self.engine.dispose()

    # -- publishing --
    def publish(
        self,
        release: Release,
        publisher: str | None = None,
        allow_same_content: bool = False,
        pending_validation: bool = False,
    ) -> ReleaseInfo:
        """Add a release (validated by ``inspect_release``).

        Args:
            release: the wheel + sdist pair and what was read from them.
            publisher: the token's owner, None for local use.
            allow_same_content: publish even if an earlier version has the same content hash.
            pending_validation: store it ``pending`` (the publish gate): not resolvable until validation passes.

        Returns:
            The release as stored.

        Raises:
            Conflict: the version exists, the content duplicates a version, or an env ID is taken.
            Forbidden: ``publisher`` does not own the package.
        """
        staged = self.staging / uuid.uuid4().hex
        staged.mkdir()
        try:
            copies = []
            for path, kind in ((release.wheel, "wheel"), (release.sdist, "sdist")):
                target = staged / path.name
                shutil.copyfile(path, target)
                copies.append((target, kind, file_sha256(target), target.stat().st_size))
            return self._commit(release, copies, publisher, allow_same_content, PENDING if pending_validation else None)
        finally:
            shutil.rmtree(staged, ignore_errors=True)

    def _commit(
        self,
        release: Release,
        copies: list[tuple[Path, str, str, int]],
        publisher: str | None,
        allow_same_content: bool,
        validation_status: str | None,
    ) -> ReleaseInfo:
        name, version = release.name, release.version
        placed: list[Path] = []  # removed again if the transaction does not commit
        try:
            with database.write(self.engine) as db:
                new_package = self._check_publishable(db, release, publisher, allow_same_content)
                now = time.time()
                if new_package:
                    db.execute(packages.insert().values(name=name, owner=publisher, created=now))
                db.execute(
                    releases.insert().values(
                        package=name,
                        version=version,
                        content_hash=release.content_hash,
                        summary=release.summary,
                        requires_python=release.requires_python,
                        manifests=json.dumps([m.model_dump(mode="json") for m in release.manifests]),
                        publisher=publisher,
                        uploaded=now,
                        yanked=False,
                        readme=release.readme,
                        readme_type=release.readme_type,
                        validation_status=validation_status,
                    )
                )
                db.execute(
                    env_ids_table.insert(),
                    [{"env_id": e, "package": name, "version": version} for e in release.env_ids],
                )
                directory = self.files / name
                directory.mkdir(exist_ok=True)
                for path, kind, sha256, size in copies:
                    db.execute(
                        files.insert().values(
                            filename=path.name, package=name, version=version, kind=kind, sha256=sha256, size=size
                        )
                    )
                    os.replace(path, directory / path.name)
                    placed.append(directory / path.name)
        except BaseException:
            for path in placed:
                path.unlink(missing_ok=True)
            raise
        return self.release(name, version)

    def _check_publishable(
        self, db: Connection, release: Release, publisher: str | None, allow_same_content: bool
    ) -> bool:
        """Raise unless ``release`` may be added; True when its package is new. Runs inside the write transaction."""
        name, version = release.name, release.version
        owner = db.execute(sa.select(packages.c.owner).where(packages.c.name == name)).first()
        if owner is not None and publisher is not None:
            _check_owner(name, owner.owner, publisher)
        existing = db.execute(
            sa.select(releases.c.version, releases.c.content_hash).where(releases.c.package == name)
        ).all()
        for other in existing:
            if Version(other.version) == Version(version):
                same = "the same" if other.content_hash == release.content_hash else "different"
                raise Conflict(
                    f"{name} {other.version} is already published (with {same} content); published "
                    f"versions are immutable: bump the version in pyproject.toml"
                )
        duplicate = [o.version for o in existing if o.content_hash == release.content_hash]
        if duplicate and not allow_same_content:
            raise Conflict(
                f"{name} {version} has the same content (hash {release.content_hash[:12]}) as the "
                f"published version {duplicate[0]}; change the package, or pass --allow-same-content "
                "to publish it again under a new version"
            )
        for env_id in release.env_ids:
            self._check_env_id_free(db, env_id, name, publisher)
        return owner is None

    @staticmethod
    def _check_env_id_free(db: Connection, env_id: str, package: str, publisher: str | None) -> None:
        """An env ID belongs to one package; its other ``-vN`` versions may only come from the same publisher."""
        base = parse_env_id(env_id).base
        e = env_ids_table.c
        rows = db.execute(
            sa.select(e.env_id, e.package, packages.c.owner)
            .distinct()
            .join(packages, packages.c.name == e.package)
            .where(e.package != package, sa.or_(e.env_id == env_id, e.env_id.startswith(f"{base}-v", autoescape=True)))
        ).all()
        for row in rows:
            if row.env_id == env_id:
                raise Conflict(
                    f"env ID {env_id!r} is already provided by package {row.package!r}; an env ID "
                    "belongs to one package: pick another ID"
                )
            if parse_env_id(row.env_id).base == base and (publisher is None or row.owner != publisher):
                raise Conflict(
                    f"env {base!r} is already provided by package {row.package!r} (as "
                    f"{row.env_id!r}); only its publisher may add versions of it: pick another name"
                )

    def yank(self, package: str, version: str, reason: str, publisher: str | None = None) -> ReleaseInfo:
        """Mark a release yanked (PEP 592): resolution skips it, an exact pin still installs it.

        Raises:
            NotFound: no such release.
            Forbidden: ``publisher`` does not own the package.
        """
        if "\x00" in reason:
            raise Error(f"the yank reason {reason[:80]!r} contains a NUL character; give plain text")
        info = self.release(package, version)
        with database.write(self.engine) as db:
            owner = db.execute(sa.select(packages.c.owner).where(packages.c.name == info.package)).scalar_one()
            if publisher is not None:
                _check_owner(info.package, owner, publisher)
            db.execute(
                releases.update()
                .where(releases.c.package == info.package, releases.c.version == info.version)
                .values(yanked=True, yanked_reason=reason)
            )
        return self.release(info.package, info.version)

    # -- reading --
    def release(self, package: str, version: str) -> ReleaseInfo:
        """One release, by package name and version (both normalized first).

        Raises:
            InvalidName: the name or version is malformed.
            NotFound: no such release.
        """
        name = names.package_name(package)
        wanted = Version(names.package_version(version))
        with database.read(self.engine) as db:
            rows = db.execute(queries.RELEASE_ROWS[True], {"name": name}).all()
            match = [r for r in rows if Version(r.version) == wanted]
            if not match:
                raise NotFound(
                    f"{name} {version} is not in {self}; published versions: {[r.version for r in rows] or 'none'}"
                )
            return self._releases(db, match, name)[0]

    def package(self, package: str) -> PackageInfo:
        """A package and all its releases, oldest first.

        Raises:
            InvalidName: the name is malformed.
            NotFound: no such package.
        """
        name = names.package_name(package)
        found = self._packages(name)
        if not found:
            raise NotFound(f"package {name!r} is not in {self}")
        return found[0]

    def packages(self) -> list[PackageInfo]:
        """Every package, by name."""
        return self._packages(None)

    def _packages(self, name: str | None) -> list[PackageInfo]:
        """The package ``name`` (a list of one, or empty), or every package when ``name`` is None."""
        one, params = name is not None, {"name": name}
        with database.read(self.engine) as db:
            package_rows = sorted(db.execute(queries.PACKAGE_ROWS[one], params).all(), key=lambda r: r.name)
            release_rows = db.execute(queries.RELEASE_ROWS[one], params).all()
            all_releases = self._releases(db, release_rows, name)
        by_package: dict[str, list[ReleaseInfo]] = {}
        for release in sorted(all_releases, key=lambda r: Version(r.version)):
            by_package.setdefault(release.package, []).append(release)
        found = []
        for row in package_rows:
            owned = by_package.get(row.name, [])
            latest = _newest([r for r in owned if resolvable(r.yanked, r.validation_status)])
            found.append(
                PackageInfo(
                    name=row.name,
                    owner=row.owner,
                    latest=latest.version if latest else None,
                    env_ids=sorted({e for r in owned for e in r.env_ids}),
                    releases=owned,
                )
            )
        return found

    def index_links(self, package: str) -> list[IndexLink]:
        """The files of a package as its PEP 503 page lists them (oldest version first, wheel before sdist), read in
        one query: the index is what pip asks for most.

        Raises:
            InvalidName: the name is malformed.
            NotFound: no such package.
        """
        name = names.package_name(package)
        with database.read(self.engine) as db:
            rows = db.execute(queries.INDEX_LINKS, {"name": name}).all()
        if not rows:
            raise NotFound(f"package {name!r} is not in {self}")
        rows.sort(key=lambda r: (Version(r.version), r.kind != "wheel"))
        return [
            IndexLink(r.filename, r.sha256, f"files/{name}/{r.filename}", r.requires_python, r.yanked, r.yanked_reason)
            for r in rows
            if r.validation_status not in GATED  # pip never sees a version the publish gate holds back
        ]

    def env_ids(self) -> list[EnvIdInfo]:
        """The env ID -> package index: every published env ID, its package and versions."""
        e = env_ids_table.c
        with database.read(self.engine) as db:
            rows = db.execute(
                sa.select(e.env_id, e.package, e.version, releases.c.yanked, releases.c.validation_status).join(
                    releases, sa.and_(releases.c.package == e.package, releases.c.version == e.version)
                )
            ).all()
        grouped: dict[tuple[str, str], list[Any]] = {}
        for row in rows:
            grouped.setdefault((row.env_id, row.package), []).append(row)
        found = []
        for (env_id, package), group in sorted(grouped.items()):
            versions = sorted((r.version for r in group), key=Version)
            latest = _newest_version([r.version for r in group if resolvable(r.yanked, r.validation_status)])
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
        """The release an env ID installs: its exact ``@pin`` (yanked or not), else the newest non-yanked version.

        Raises:
            InvalidEnvId: ``env_id`` is malformed.
            NotFound: nothing provides it, the pin does not exist, or every version providing it is yanked.
        """
        parsed = parse_env_id(env_id)
        pin = None if parsed.pin is None else Version(names.package_version(parsed.pin))  # a bad pin: 400, not 404
        with database.read(self.engine) as db:
            pattern = re.sub(r"([!%_])", r"!\1", parsed.base) + "-v%"
            rows = db.execute(queries.ID_FAMILY, {"env_id": parsed.unpinned, "pattern": pattern}).all()
            rows = [r for r in rows if parse_env_id(r.env_id).base == parsed.base]
            if parsed.version is None and rows:  # unversioned: the highest -vN published
                top = max(parse_env_id(r.env_id).version or 0 for r in rows)
                rows = [r for r in rows if (parse_env_id(r.env_id).version or 0) == top]
            else:
                rows = [r for r in rows if r.env_id == parsed.unpinned]
            if not rows:
                raise NotFound(f"no package in {self} provides env ID {parsed.unpinned!r}; see `molt-env search`")
            wanted = {(r.package, r.version) for r in rows}
            providers = sorted({r.package for r in rows})
            release_rows = [
                r
                for package in providers
                for r in db.execute(queries.RELEASE_ROWS[True], {"name": package})
                if (r.package, r.version) in wanted
            ]
            candidates = self._releases(db, release_rows, providers[0] if len(providers) == 1 else None)
        if parsed.pin is not None:
            pinned = [r for r in candidates if Version(r.version) == pin]
            if not pinned:
                raise NotFound(
                    f"{parsed.unpinned!r} has no package version {parsed.pin}; published: "
                    f"{sorted((r.version for r in candidates), key=Version)}"
                )
            if pinned[0].validation_status in GATED:
                raise NotFound(self.held_back(pinned[0]))
            return pinned[0]
        newest = _newest([r for r in candidates if resolvable(r.yanked, r.validation_status)])
        if newest is None:
            held = [r for r in candidates if not r.yanked and r.validation_status in GATED]
            if held:
                raise NotFound(f"no version providing {parsed.unpinned!r} is installable: {self.held_back(held[-1])}")
            raise NotFound(
                f"every version providing {parsed.unpinned!r} is yanked "
                f"({', '.join(r.version for r in candidates)}); pin one with '@<version>' to install it anyway"
            )
        return newest

    def readme(self, package: str, version: str) -> tuple[str, str | None]:
        """``(README text, its content type)`` of a release; read from its wheel once if it predates the column.

        Raises:
            InvalidName: the name or version is malformed.
            NotFound: no such release.
        """
        name, exact = names.package_name(package), names.package_version(version)
        with database.read(self.engine) as db:  # the stored, normalized version: one query
            row = db.execute(queries.README, {"name": name, "version": exact}).first()
        if row is not None and row.readme is not None:
            return row.readme, row.readme_type
        info = self.release(package, version)  # another spelling of the version, or a README not read yet
        key = (releases.c.package == info.package, releases.c.version == info.version)
        with database.read(self.engine) as db:
            row = db.execute(sa.select(releases.c.readme, releases.c.readme_type).where(*key)).one()
        if row.readme is not None:
            return row.readme, row.readme_type
        try:
            text, content_type = read_readme(self.file_path(info.package, info.wheel.filename))
        except (InvalidArtifact, NotFound):
            text, content_type = "", None
        with database.write(self.engine, exclusive=False, stamp=None) as db:  # the same text: no stamp
            db.execute(releases.update().where(*key).values(readme=text, readme_type=content_type))
        return text, content_type

    def validation(self, package: str, version: str) -> tuple[str | None, dict[str, Any] | None]:
        """``(status, report)`` of a release's validation; ``(None, None)`` while nothing validated it."""
        info = self.release(package, version)
        with database.read(self.engine) as db:
            row = db.execute(
                sa.select(releases.c.validation_status, releases.c.validation_report).where(
                    releases.c.package == info.package, releases.c.version == info.version
                )
            ).one()
        return row.validation_status, json.loads(row.validation_report) if row.validation_report else None

    def count_download(self, package: str, filename: str) -> None:
        """Count one download of ``filename`` against its release when it is a wheel (the install count)."""
        with database.write(self.engine, exclusive=False, stamp=database.DOWNLOADS) as db:
            row = db.execute(
                sa.select(files.c.version).where(
                    files.c.package == package, files.c.filename == filename, files.c.kind == "wheel"
                )
            ).first()
            if row is not None:
                db.execute(
                    releases.update()
                    .where(releases.c.package == package, releases.c.version == row.version)
                    .values(downloads=releases.c.downloads + 1)
                )

    def file_path(self, package: str, filename: str) -> Path:
        """Where a release file lies in the file store.

        Raises:
            InvalidName: the package or file name is malformed.
            NotFound: no such file of that package.
        """
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

    def _releases(self, db: Connection, rows: list[Any], package: str | None) -> list[ReleaseInfo]:
        """``ReleaseInfo`` of release rows, their files and env IDs read in two queries (of one package's rows when
        ``package`` is given, else of all)."""
        wanted = {(r.package, r.version) for r in rows}
        if not wanted:
            return []
        one, params = package is not None, {"name": package}
        by_release: dict[tuple[str, str], list[FileInfo]] = {}
        for f in db.execute(queries.FILE_ROWS[one], params):
            if (f.package, f.version) in wanted:
                by_release.setdefault((f.package, f.version), []).append(
                    FileInfo(
                        filename=f.filename,
                        kind=f.kind,
                        sha256=f.sha256,
                        size=f.size,
                        url=f"files/{f.package}/{f.filename}",
                    )
                )
        ids: dict[tuple[str, str], list[str]] = {}
        for e in db.execute(queries.ID_ROWS[one], params):
            ids.setdefault((e.package, e.version), []).append(e.env_id)
        return [
            ReleaseInfo(
                package=r.package,
                version=r.version,
                content_hash=r.content_hash,
                summary=r.summary,
                requires_python=r.requires_python,
                env_ids=ids.get((r.package, r.version), []),
                manifests=json.loads(r.manifests),
                publisher=r.publisher,
                uploaded=r.uploaded,
                yanked=bool(r.yanked),
                yanked_reason=r.yanked_reason,
                files=by_release.get((r.package, r.version), []),
                downloads=r.downloads,
                validation_status=r.validation_status,
            )
            for r in rows
        ]


def _newest_version(versions: list[str]) -> str | None:
    """The highest version, preferring final releases over pre-releases (as pip does)."""
    finals = [v for v in versions if not Version(v).is_prerelease]
    return max(finals or versions, key=Version, default=None)


def _newest(releases: list[ReleaseInfo]) -> ReleaseInfo | None:
    newest = _newest_version([r.version for r in releases])
    return next((r for r in releases if r.version == newest), None)
