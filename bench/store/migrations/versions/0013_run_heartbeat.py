"""runs.heartbeat_at: the last heartbeat of a run's process (runners/ledger.py); a run still
`running` whose last sign of life is older than bench.statuses.DEAD_AFTER_S reads as
`interrupted` (None for the runs before: their updated_at stands in)

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-04 23:00:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('heartbeat_at', sa.DateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.drop_column('heartbeat_at')
