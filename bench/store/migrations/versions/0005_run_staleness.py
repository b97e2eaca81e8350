"""runs.staleness: K, the optimizer steps the rollout weights lag behind (runners/staleness.py)

Not null, default 0: every run from before staleness existed sampled on-policy. Filled from
config["staleness"] where a run's config has it, so the leaderboard and `bench report` can
group by K and a staleness sweep find its finished (cell, K, seed) runs with one query.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-09 12:00:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('staleness', sa.Integer(), nullable=False, server_default='0'))

    conn = op.get_bind()
    runs = sa.table('runs', sa.column('id', sa.String), sa.column('config', sa.JSON),
                    sa.column('staleness', sa.Integer))
    for rid, config in conn.execute(sa.select(runs.c.id, runs.c.config)).all():
        k = config.get('staleness') if isinstance(config, dict) else None
        if isinstance(k, int) and not isinstance(k, bool) and k:
            conn.execute(runs.update().where(runs.c.id == rid).values(staleness=k))


def downgrade() -> None:
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.drop_column('staleness')
