"""check_reports: each `bench check` (a model's engine pairs judged against a tolerance contract)

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03 14:00:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'check_reports',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('model_id', sa.Integer(), nullable=False),
        sa.Column('engine', sa.String(length=20), nullable=False),
        sa.Column('ok', sa.Boolean(), nullable=False),
        sa.Column('contract_digest', sa.String(length=40), nullable=False),
        sa.Column('conditions', sa.JSON(), nullable=False),
        sa.Column('pairs', sa.JSON(), nullable=False),
        sa.Column('created_at', sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(['model_id'], ['models.id']),
        sa.PrimaryKeyConstraint('id'),
    )


def downgrade() -> None:
    op.drop_table('check_reports')
