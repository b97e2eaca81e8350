"""mismatch_reports.attention: the rollout engine's decode attention when it is not its plain
one ("cascade": bench/engines/cascade.py, `bench mismatch --cascade-attention`); NULL for the
plain decode and for every report from before, so those keep pairing with one another

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-06 10:45:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('mismatch_reports', schema=None) as batch_op:
        batch_op.add_column(sa.Column('attention', sa.String(length=20), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('mismatch_reports', schema=None) as batch_op:
        batch_op.drop_column('attention')
