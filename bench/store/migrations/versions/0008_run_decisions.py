"""run_decisions: each stop rule's shadow decision per run (step, status, reason, whether it was on)

Runs from before have no rows; `bench report --early` recomputes theirs from the stored split
evaluations (the rules are pure functions of that history).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 12:30:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'run_decisions',
        sa.Column('run_id', sa.String(length=40), nullable=False),
        sa.Column('rule', sa.String(length=20), nullable=False),
        sa.Column('step', sa.Integer(), nullable=False),
        sa.Column('status', sa.String(length=20), nullable=False),
        sa.Column('reason', sa.Text(), nullable=True),
        sa.Column('rule_on', sa.Boolean(), nullable=False),
        sa.Column('created_at', sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(['run_id'], ['runs.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('run_id', 'rule'),
    )


def downgrade() -> None:
    op.drop_table('run_decisions')
