"""runs: the step-0 calibration and the provenance facts of every run

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 02:40:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('calibration', sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column('provenance', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.drop_column('provenance')
        batch_op.drop_column('calibration')
