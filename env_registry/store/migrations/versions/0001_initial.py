"""The registry schema as it was before migrations: packages, releases, files, env IDs, publish tokens.

A SQLite ``registry.db`` created by that code holds exactly these tables and is stamped with this revision.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "packages",
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("owner", sa.Text),
        sa.Column("created", sa.Float, nullable=False),
    )
    op.create_table(
        "releases",
        sa.Column("package", sa.Text, sa.ForeignKey("packages.name"), primary_key=True),
        sa.Column("version", sa.Text, primary_key=True),
        sa.Column("content_hash", sa.Text, nullable=False),
        sa.Column("summary", sa.Text, nullable=False),
        sa.Column("requires_python", sa.Text),
        sa.Column("manifests", sa.Text, nullable=False),
        sa.Column("publisher", sa.Text),
        sa.Column("uploaded", sa.Float, nullable=False),
        sa.Column("yanked", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("yanked_reason", sa.Text),
    )
    op.create_index("releases_by_hash", "releases", ["package", "content_hash"])
    op.create_table(
        "files",
        sa.Column("filename", sa.Text, primary_key=True),
        sa.Column("package", sa.Text, nullable=False),
        sa.Column("version", sa.Text, nullable=False),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("sha256", sa.Text, nullable=False),
        sa.Column("size", sa.Integer, nullable=False),
        sa.ForeignKeyConstraint(["package", "version"], ["releases.package", "releases.version"]),
    )
    op.create_index("files_by_release", "files", ["package", "version"])
    op.create_table(
        "env_ids",
        sa.Column("env_id", sa.Text, primary_key=True),
        sa.Column("package", sa.Text, primary_key=True),
        sa.Column("version", sa.Text, primary_key=True),
    )
    op.create_index("env_ids_by_package", "env_ids", ["package", "version"])
    op.create_table(
        "tokens",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("publisher", sa.Text, nullable=False),
        sa.Column("digest", sa.Text, nullable=False, unique=True),
        sa.Column("created", sa.Float, nullable=False),
        sa.Column("revoked", sa.Float),
    )


def downgrade() -> None:
    for table in ("tokens", "env_ids", "files", "releases", "packages"):
        op.drop_table(table)
