"""run_verifications: one row per `bench runs verify` of a run

When, on which device and CPU kind (cpu_kernel_path() on a CPU), how many steps were re-run and
values compared, the verdict (bit-identical, within-tolerance, differs), the tolerance applied
(None: bit-identical was required), the first difference and the bench commit that re-ran. Rows go with their run.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-14 12:00:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'run_verifications',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('run_id', sa.String(length=40), nullable=False),
        sa.Column('created_at', sa.DateTime(), nullable=False),
        sa.Column('device', sa.String(length=20), nullable=False),
        sa.Column('device_name', sa.Text(), nullable=True),
        sa.Column('cpu_16bit', sa.String(length=10), nullable=True),
        sa.Column('steps', sa.Integer(), nullable=False),
        sa.Column('compared', sa.Integer(), nullable=False),
        sa.Column('differences', sa.Integer(), nullable=False),
        sa.Column('verdict', sa.String(length=20), nullable=False),
        sa.Column('tolerance', sa.Text(), nullable=True),
        sa.Column('first_difference', sa.JSON(), nullable=True),
        sa.Column('bench_commit', sa.String(length=40), nullable=True),
        sa.ForeignKeyConstraint(['run_id'], ['runs.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id'),
    )
    with op.batch_alter_table('run_verifications', schema=None) as batch_op:
        batch_op.create_index('ix_run_verifications_run_id', ['run_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('run_verifications', schema=None) as batch_op:
        batch_op.drop_index('ix_run_verifications_run_id')
    op.drop_table('run_verifications')
