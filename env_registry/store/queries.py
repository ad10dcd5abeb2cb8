"""The store's hot reads, built once: building an SQLAlchemy statement per request costs more than running it.

``True``/``False`` keys pick the statement for one package (bound as ``name``) or for all of them.
"""

import sqlalchemy as sa

from env_registry.store.database import env_ids as env_ids_table
from env_registry.store.database import files, packages, releases

INDEX_LINKS = (
    sa.select(
        files.c.filename,
        files.c.sha256,
        files.c.kind,
        releases.c.version,
        releases.c.requires_python,
        releases.c.yanked,
        releases.c.yanked_reason,
        releases.c.validation_status,
    )
    .join(releases, sa.and_(releases.c.package == files.c.package, releases.c.version == files.c.version))
    .where(files.c.package == sa.bindparam("name"))
)


# what a release row is read with everywhere; the README and the validation report are read only where shown, the
# publish gate's claim only by the gate
HIDDEN = ("readme", "readme_type", "validation_report", "validation_claim", "validation_claimed")
RELEASE_COLUMNS = [c for c in releases.c if c.name not in HIDDEN]
ONE = sa.bindparam("name")
PACKAGE_ROWS = {True: sa.select(packages).where(packages.c.name == ONE), False: sa.select(packages)}
RELEASE_ROWS = {
    True: sa.select(*RELEASE_COLUMNS).where(releases.c.package == ONE),
    False: sa.select(*RELEASE_COLUMNS),
}
FILE_ROWS = {
    True: sa.select(files).where(files.c.package == ONE).order_by(files.c.kind.desc()),
    False: sa.select(files).order_by(files.c.kind.desc()),
}
README = sa.select(releases.c.readme, releases.c.readme_type).where(
    releases.c.package == ONE, releases.c.version == sa.bindparam("version")
)
ID_FAMILY = sa.select(env_ids_table).where(  # an env ID and its other -vN versions
    sa.or_(
        env_ids_table.c.env_id == sa.bindparam("env_id"),
        env_ids_table.c.env_id.like(sa.bindparam("pattern"), escape="!"),
    )
)
ID_ROWS = {
    True: sa.select(env_ids_table).where(env_ids_table.c.package == ONE).order_by(env_ids_table.c.env_id),
    False: sa.select(env_ids_table).order_by(env_ids_table.c.env_id),
}
