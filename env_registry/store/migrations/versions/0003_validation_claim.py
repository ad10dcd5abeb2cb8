"""The publish gate's claim on a pending release: which gate validates it, and when it last said so.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("releases", sa.Column("validation_claim", sa.Text))  # the gate validating it; NULL: none
    op.add_column("releases", sa.Column("validation_claimed", sa.Float))  # when that gate last renewed its claim


def downgrade() -> None:
    for column in ("validation_claimed", "validation_claim"):
        op.drop_column("releases", column)
