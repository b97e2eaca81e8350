"""runs.status: the step-0 calibration gate's end gets a status of its own, `miscalibrated` (FAIL)

Before, a run the gate stopped was stored `failed`, the status of an error or Ctrl-C, which now
gives no verdict at all (bench/statuses.py). A `failed` run whose stored calibration did not pass
(`calibration.ok` false) is such a run: it becomes `miscalibrated`; every other run keeps its
status, and `max_steps` reads as UNDECIDED where it read as FAIL. The downgrade makes them
`failed` again.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02 19:30:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None

runs = sa.table('runs', sa.column('id', sa.String), sa.column('status', sa.String),
                sa.column('calibration', sa.JSON))


def upgrade() -> None:
    conn = op.get_bind()
    rows = conn.execute(sa.select(runs.c.id, runs.c.calibration).where(runs.c.status == 'failed')).all()
    gated = [rid for rid, cal in rows if isinstance(cal, dict) and cal.get('ok') is False]
    if gated:
        conn.execute(runs.update().where(runs.c.id.in_(gated)).values(status='miscalibrated'))


def downgrade() -> None:
    op.get_bind().execute(runs.update().where(runs.c.status == 'miscalibrated').values(status='failed'))
