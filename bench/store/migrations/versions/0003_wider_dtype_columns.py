"""dtype columns wide enough for every format name ("bf16+head32" is 11 characters)

builds.dtype, runs.rollout_dtype / train_dtype and mismatch_reports.rollout_dtype /
train_dtype go from VARCHAR(10) to VARCHAR(20). SQLite does not enforce the length;
PostgreSQL does, so an 11-character format would fail to insert there without this.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02 10:00:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None

COLUMNS = {'builds': ('dtype',), 'runs': ('rollout_dtype', 'train_dtype'),
           'mismatch_reports': ('rollout_dtype', 'train_dtype')}


def upgrade() -> None:
    for table, cols in COLUMNS.items():
        with op.batch_alter_table(table, schema=None) as batch_op:
            for col in cols:
                batch_op.alter_column(col, existing_type=sa.String(length=10), type_=sa.String(length=20),
                                      existing_nullable=False)


def downgrade() -> None:
    for table, cols in COLUMNS.items():
        with op.batch_alter_table(table, schema=None) as batch_op:
            for col in cols:
                batch_op.alter_column(col, existing_type=sa.String(length=20), type_=sa.String(length=10),
                                      existing_nullable=False)
