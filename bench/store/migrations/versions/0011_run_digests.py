"""run_digests: each native run's training-state digest at its evaluations, chained; and
run_verifications.window_start: a verification re-run from a kept checkpoint covers steps
window_start+1 … steps (0 for the verifications before: they re-ran from the start)

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-03 14:30:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'run_digests',
        sa.Column('run_id', sa.String(length=40), nullable=False),
        sa.Column('step', sa.Integer(), nullable=False),
        sa.Column('digest', sa.String(length=64), nullable=False),
        sa.Column('chain', sa.String(length=64), nullable=False),
        sa.ForeignKeyConstraint(['run_id'], ['runs.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('run_id', 'step'),
    )
    with op.batch_alter_table('run_verifications', schema=None) as batch_op:
        batch_op.add_column(sa.Column('window_start', sa.Integer(), nullable=False, server_default='0'))


def downgrade() -> None:
    with op.batch_alter_table('run_verifications', schema=None) as batch_op:
        batch_op.drop_column('window_start')
    op.drop_table('run_digests')
