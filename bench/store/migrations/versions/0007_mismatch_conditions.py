"""mismatch_reports: the conditions of each offline report (engine, limit, max_tokens, device, cpu_16bit)

n was stored already. Reports from before stay without conditions (NULL): no bf16 ÷ fp16 ratio
pairs them, because nothing says they were measured alike.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-14 12:10:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('mismatch_reports', schema=None) as batch_op:
        batch_op.add_column(sa.Column('engine', sa.String(length=20), nullable=True))
        batch_op.add_column(sa.Column('limit', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('max_tokens', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('device', sa.String(length=20), nullable=True))
        batch_op.add_column(sa.Column('cpu_16bit', sa.String(length=10), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('mismatch_reports', schema=None) as batch_op:
        for name in ('cpu_16bit', 'device', 'max_tokens', 'limit', 'engine'):
            batch_op.drop_column(name)
