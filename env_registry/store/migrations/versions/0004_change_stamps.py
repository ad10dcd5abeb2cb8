"""The registry's change stamps: one row counting the writes that change what the index and the pages show
(``content``) and the wheel downloads (``downloads``); the server's page cache keys on them.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    changes = op.create_table(
        "changes",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("content", sa.Integer, nullable=False),
        sa.Column("downloads", sa.Integer, nullable=False),
    )
    op.bulk_insert(changes, [{"id": 1, "content": 0, "downloads": 0}])


def downgrade() -> None:
    op.drop_table("changes")
