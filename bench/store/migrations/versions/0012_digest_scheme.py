"""run_digests.scheme: what a state digest hashes (bench/statedigest.py; 1 for the digests before,
which also hashed the process-wide RNG states); run_verifications.digests: how a verification
compared the state digests (None: all of them, as every verification before did)

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-04 20:00:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('run_digests', schema=None) as batch_op:
        batch_op.add_column(sa.Column('scheme', sa.Integer(), nullable=False, server_default='1'))
    with op.batch_alter_table('run_verifications', schema=None) as batch_op:
        batch_op.add_column(sa.Column('digests', sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('run_verifications', schema=None) as batch_op:
        batch_op.drop_column('digests')
    with op.batch_alter_table('run_digests', schema=None) as batch_op:
        batch_op.drop_column('scheme')
