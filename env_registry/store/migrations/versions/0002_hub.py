"""The hub: READMEs, wheel download counts, a validation status and report per release, login sessions, eval
summaries.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("releases", sa.Column("readme", sa.Text))  # NULL until read from the stored wheel
    op.add_column("releases", sa.Column("readme_type", sa.Text))
    op.add_column("releases", sa.Column("downloads", sa.Integer, nullable=False, server_default="0"))
    op.add_column("releases", sa.Column("validation_status", sa.Text))
    op.add_column("releases", sa.Column("validation_report", sa.Text))
    op.create_table(
        "sessions",
        sa.Column("digest", sa.Text, primary_key=True),
        sa.Column("token_id", sa.Integer, sa.ForeignKey("tokens.id"), nullable=False),
        sa.Column("created", sa.Float, nullable=False),
        sa.Column("expires", sa.Float, nullable=False),
    )
    op.create_table(
        "evals",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("package", sa.Text, nullable=False),
        sa.Column("version", sa.Text, nullable=False),
        sa.Column("env_id", sa.Text, nullable=False),
        sa.Column("publisher", sa.Text),
        sa.Column("uploaded", sa.Float, nullable=False),
        sa.Column("summary", sa.Text, nullable=False),
        sa.ForeignKeyConstraint(["package", "version"], ["releases.package", "releases.version"]),
    )
    op.create_index("evals_by_release", "evals", ["package", "version"])


def downgrade() -> None:
    op.drop_table("evals")
    op.drop_table("sessions")
    for column in ("validation_report", "validation_status", "downloads", "readme_type", "readme"):
        op.drop_column("releases", column)
