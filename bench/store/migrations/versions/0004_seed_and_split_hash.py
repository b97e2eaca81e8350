"""runs.seed (from the run's config) and builds.split_hash (content hash of the kept split)

runs.seed lets a seeded sweep find its finished (cell, seed) pairs and the leaderboard group
a cell's seeds; it is filled from config["seed"] for existing runs. builds.split_hash is
sha256 of the compact JSON [[id, gold answer], ...] of the kept problems sorted by id
(bench.problems.split_hash, written out here so this migration stays as it is); it is
computed for existing complete builds from their kept build_problems.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02 12:00:00
"""
import hashlib
import json

from alembic import op
import sqlalchemy as sa


revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def _split_hash(pairs) -> str:
    canon = json.dumps(sorted([str(i), str(a)] for i, a in pairs), ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canon.encode("utf-8")).hexdigest()


def upgrade() -> None:
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('seed', sa.Integer(), nullable=True))
    with op.batch_alter_table('builds', schema=None) as batch_op:
        batch_op.add_column(sa.Column('split_hash', sa.String(length=64), nullable=True))
        batch_op.create_index('ix_builds_split_hash', ['split_hash'], unique=False)

    conn = op.get_bind()
    runs = sa.table('runs', sa.column('id', sa.String), sa.column('config', sa.JSON), sa.column('seed', sa.Integer))
    for rid, config in conn.execute(sa.select(runs.c.id, runs.c.config)).all():
        seed = config.get('seed') if isinstance(config, dict) else None
        if isinstance(seed, int) and not isinstance(seed, bool):
            conn.execute(runs.update().where(runs.c.id == rid).values(seed=seed))
    builds = sa.table('builds', sa.column('id', sa.String), sa.column('status', sa.String),
                      sa.column('split_hash', sa.String))
    problems = sa.table('build_problems', sa.column('build_id', sa.String), sa.column('problem_id', sa.String),
                        sa.column('answer', sa.Text), sa.column('kept', sa.Boolean))
    for (bid,) in conn.execute(sa.select(builds.c.id).where(builds.c.status == 'complete')).all():
        pairs = conn.execute(sa.select(problems.c.problem_id, problems.c.answer)
                             .where(problems.c.build_id == bid, problems.c.kept.is_(True))).all()
        conn.execute(builds.update().where(builds.c.id == bid).values(split_hash=_split_hash(pairs)))


def downgrade() -> None:
    with op.batch_alter_table('builds', schema=None) as batch_op:
        batch_op.drop_index('ix_builds_split_hash')
        batch_op.drop_column('split_hash')
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.drop_column('seed')
