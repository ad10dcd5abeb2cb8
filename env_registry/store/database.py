"""The registry's data layer: its tables (SQLAlchemy Core), the database behind them, and their migrations.

One registry database is either the embedded SQLite file ``<root>/registry.db`` (the default) or a PostgreSQL
database shared by several server replicas (``--db postgresql://user:pass@host/db``). The same queries run on both;
what differs is confined to this module:

- **Writers serialize.** ``write(engine)`` opens a transaction that holds the registry's one write lock until it
  ends: ``BEGIN IMMEDIATE`` on SQLite, a transaction-level advisory lock on PostgreSQL. A publish checks its rules
  and writes its rows under it, so concurrent publishers (threads, processes, replicas) can never both win.
- **Every write advances a change stamp** (the one row of ``changes``, in the write's own transaction): ``content``
  for what the index, the API and the pages show, ``downloads`` for the install counts. A server's page cache
  (``env_registry.hub.page_cache``) reads them per request, so every replica sees a write the moment it commits.
- **Migrations run at start-up** (alembic, ``env_registry/store/migrations/versions``), under the same lock, so two
  replicas starting at once migrate once. A SQLite registry made before migrations existed holds exactly the
  schema of revision 0001: it is stamped with that revision and upgraded from there.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError

from env_registry.errors import Error

MIGRATIONS = Path(__file__).with_name("migrations")
LEGACY_REVISION = "0001"  # the schema every registry.db had before migrations existed
HEAD_REVISION = "0004"  # the newest migration (a test checks it is alembic's head): opening a registry at head
# costs one query, and no import of alembic
WRITE_LOCK_KEY = 0x6D6F6C74  # "molt": the PostgreSQL advisory lock every registry writer takes

metadata = sa.MetaData()

packages = sa.Table(
    "packages",
    metadata,
    sa.Column("name", sa.Text, primary_key=True),
    sa.Column("owner", sa.Text),  # the publisher of its first upload; None when published locally
    sa.Column("created", sa.Float, nullable=False),
)
releases = sa.Table(
    "releases",
    metadata,
    sa.Column("package", sa.Text, sa.ForeignKey("packages.name"), primary_key=True),
    sa.Column("version", sa.Text, primary_key=True),
    sa.Column("content_hash", sa.Text, nullable=False),
    sa.Column("summary", sa.Text, nullable=False),
    sa.Column("requires_python", sa.Text),
    sa.Column("manifests", sa.Text, nullable=False),  # JSON list of the validated manifests
    sa.Column("publisher", sa.Text),
    sa.Column("uploaded", sa.Float, nullable=False),
    sa.Column("yanked", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("yanked_reason", sa.Text),
    sa.Column("readme", sa.Text),  # the wheel's long description; NULL: not read yet (a release from before 0002)
    sa.Column("readme_type", sa.Text),  # its Description-Content-Type
    sa.Column("downloads", sa.Integer, nullable=False, server_default="0"),  # wheel downloads
    sa.Column("validation_status", sa.Text),  # NULL: not validated; the publish gate will set pending/passed/failed
    sa.Column("validation_report", sa.Text),  # JSON
    sa.Column("validation_claim", sa.Text),  # the publish gate validating it (validation_states.claim_validation)
    sa.Column("validation_claimed", sa.Float),  # when that gate last renewed its claim
)
files = sa.Table(
    "files",
    metadata,
    sa.Column("filename", sa.Text, primary_key=True),
    sa.Column("package", sa.Text, nullable=False),
    sa.Column("version", sa.Text, nullable=False),
    sa.Column("kind", sa.Text, nullable=False),
    sa.Column("sha256", sa.Text, nullable=False),
    sa.Column("size", sa.Integer, nullable=False),
    sa.ForeignKeyConstraint(["package", "version"], ["releases.package", "releases.version"]),
)
env_ids = sa.Table(
    "env_ids",
    metadata,
    sa.Column("env_id", sa.Text, primary_key=True),
    sa.Column("package", sa.Text, primary_key=True),
    sa.Column("version", sa.Text, primary_key=True),
)
tokens = sa.Table(
    "tokens",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("publisher", sa.Text, nullable=False),
    sa.Column("digest", sa.Text, nullable=False, unique=True),  # sha256 of the token; the token is never stored
    sa.Column("created", sa.Float, nullable=False),
    sa.Column("revoked", sa.Float),
)
sessions = sa.Table(
    "sessions",
    metadata,
    sa.Column("digest", sa.Text, primary_key=True),  # sha256 of the cookie's value
    sa.Column("token_id", sa.Integer, sa.ForeignKey("tokens.id"), nullable=False),
    sa.Column("created", sa.Float, nullable=False),
    sa.Column("expires", sa.Float, nullable=False),
)
evals = sa.Table(
    "evals",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("package", sa.Text, nullable=False),
    sa.Column("version", sa.Text, nullable=False),
    sa.Column("env_id", sa.Text, nullable=False),
    sa.Column("publisher", sa.Text),
    sa.Column("uploaded", sa.Float, nullable=False),
    sa.Column("summary", sa.Text, nullable=False),  # the uploaded summary.json
    sa.ForeignKeyConstraint(["package", "version"], ["releases.package", "releases.version"]),
)


changes = sa.Table(  # one row (id 1): the change stamps, see the module docstring
    "changes",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("content", sa.Integer, nullable=False),  # writes that change what is shown: publish, yank, verdicts
    sa.Column("downloads", sa.Integer, nullable=False),  # wheel downloads (the install counts)
)
CONTENT, DOWNLOADS = "content", "downloads"
STAMPS = sa.select(changes.c.content, changes.c.downloads).where(changes.c.id == 1)


class DatabaseError(Error):
    """The ``--db`` URL is not a database this registry can use."""


def database_url(root: Path, db: str | None) -> URL:
    """The URL of the registry database: ``db`` (``sqlite:///...`` or ``postgresql://...``), else the SQLite file
    inside ``root``. A ``postgresql://`` URL gets the psycopg (v3) driver.

    Raises:
        DatabaseError: ``db`` is malformed or names another kind of database.
    """
    if db is None:
        return URL.create("sqlite", database=str(root / "registry.db"))
    try:
        url = make_url(db)
    except ArgumentError:
        raise DatabaseError(
            f"--db {db!r:.200} is not a database URL; give postgresql://user:pass@host/db or sqlite:///path"
        ) from None
    if url.get_backend_name() == "postgresql" and url.get_driver_name() in ("psycopg", "psycopg2"):
        return url.set(drivername="postgresql+psycopg")
    if url.drivername == "sqlite" and url.database:
        return url
    raise DatabaseError(
        f"--db {url.render_as_string(hide_password=True)!r:.200} is not supported; give "
        "postgresql://user:pass@host/db (PostgreSQL, through psycopg) or sqlite:///path/registry.db"
    )


def create(url: URL) -> Engine:
    """An engine for ``url`` whose connections follow the transaction rules in the module docstring."""
    if url.get_backend_name() != "sqlite":
        return sa.create_engine(url, pool_pre_ping=True, pool_size=8, max_overflow=16)
    engine = sa.create_engine(url, connect_args={"timeout": 60, "check_same_thread": False})

    @sa.event.listens_for(engine, "connect")
    def _configure(dbapi_connection, _record) -> None:  # type: ignore[no-untyped-def]
        dbapi_connection.isolation_level = None  # transactions are begun below, not by the driver
        for pragma in ("journal_mode=WAL", "foreign_keys=ON", "busy_timeout=60000"):
            dbapi_connection.execute(f"PRAGMA {pragma}")

    @sa.event.listens_for(engine, "begin")
    def _begin(connection: Connection) -> None:
        # IMMEDIATE takes the write lock up front, so a writer's checks and writes are atomic
        connection.exec_driver_sql("BEGIN IMMEDIATE" if connection.get_execution_options().get("write") else "BEGIN")

    return engine


@contextmanager
def read(engine: Engine) -> Iterator[Connection]:
    """One read transaction (a consistent snapshot on both backends)."""
    with engine.connect() as connection, connection.begin():
        yield connection


@contextmanager
def write(engine: Engine, exclusive: bool = True, stamp: str | None = CONTENT) -> Iterator[Connection]:
    """One write transaction; it commits when the block ends without error.

    Args:
        exclusive: hold the registry's write lock (publish, yank, migrate); writes that touch only their own rows
            (a download count, a token, a session) pass False and skip it on PostgreSQL. On SQLite every write
            transaction holds the database's one lock anyway.
        stamp: the change stamp the write advances: ``CONTENT`` (the default: anything the index, the API or a
            page shows), ``DOWNLOADS`` (an install count), or None for a write no page shows (a token, a session,
            the gate's claim). A write that changes what is shown and passes None leaves cached pages stale.
    """
    with engine.connect() as connection:
        connection.execution_options(write=True)
        with connection.begin():
            if exclusive and engine.dialect.name == "postgresql":
                connection.execute(sa.select(sa.func.pg_advisory_xact_lock(WRITE_LOCK_KEY)))
            yield connection
            if stamp is not None:
                column = changes.c[stamp]
                connection.execute(changes.update().where(changes.c.id == 1).values({column: column + 1}))


def migrate(engine: Engine) -> None:
    """Bring the database to the newest schema (a no-op when it is there already)."""
    with read(engine) as connection:
        if _current_revision(connection) == HEAD_REVISION:
            return
    from alembic import command

    config = alembic_config()
    with write(engine, stamp=None) as connection:  # under the write lock: two replicas starting together migrate once
        config.attributes["connection"] = connection
        current = _current_revision(connection)
        if current is None and sa.inspect(connection).has_table("packages"):
            command.stamp(config, LEGACY_REVISION)
        if current != HEAD_REVISION:
            command.upgrade(config, "head")


def _current_revision(connection: Connection) -> str | None:
    if not sa.inspect(connection).has_table("alembic_version"):
        return None
    return connection.execute(sa.text("SELECT version_num FROM alembic_version")).scalar()


def alembic_config():  # type: ignore[no-untyped-def]
    """alembic's configuration of the registry's migrations (no alembic.ini: the scripts sit in the package)."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return config
