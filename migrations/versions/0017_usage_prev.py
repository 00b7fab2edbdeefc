"""attempt_usage: prev_held_to and prev_group_held_to, so a window counts distinct
jobs (in all and per node group) as a sum in the GROUP BY that sums its held
seconds (store.usage.sums) instead of two more COUNT(DISTINCT) scans; the window
index covers them (and no longer job_id, which nothing reading it needs)

Revision ID: 0017_usage_prev
Revises: 0016_usage_window_index
Create Date: 2026-12-04 14:30:00

The backfill is written here, not imported from the store (the test of this
revision compares it with ``store.usage_rows.recount``).
"""
from alembic import op
import sqlalchemy as sa


revision = '0017_usage_prev'
down_revision = '0016_usage_window_index'
branch_labels = None
depends_on = None

OLD = ['held_to', 'held_from', 'project', 'kind', 'node_group', 'market', 'cpu', 'gpu', 'job_id']
NEW = ['held_to', 'held_from', 'project', 'kind', 'node_group', 'market', 'cpu', 'gpu', 'prev_held_to',
       'prev_group_held_to']


def _backfill() -> None:
    u = sa.table('attempt_usage', sa.column('job_id'), sa.column('number'), sa.column('node_group'),
                 sa.column('held_to'), sa.column('prev_held_to'), sa.column('prev_group_held_to'))
    p = u.alias('earlier')
    earlier = (p.c.job_id == u.c.job_id, p.c.number < u.c.number)
    same_group = sa.func.coalesce(p.c.node_group, '') == sa.func.coalesce(u.c.node_group, '')
    op.get_bind().execute(sa.update(u).where(u.c.number > 1).values(
        prev_held_to=sa.select(sa.func.max(p.c.held_to)).where(*earlier).scalar_subquery(),
        prev_group_held_to=sa.select(sa.func.max(p.c.held_to)).where(*earlier, same_group).scalar_subquery()))


def upgrade() -> None:
    with op.batch_alter_table('attempt_usage') as batch_op:
        batch_op.add_column(sa.Column('prev_held_to', sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column('prev_group_held_to', sa.BigInteger(), nullable=True))
        batch_op.drop_index('ix_attempt_usage_window')
    _backfill()
    with op.batch_alter_table('attempt_usage') as batch_op:
        batch_op.create_index('ix_attempt_usage_window', NEW, unique=False)


def downgrade() -> None:
    with op.batch_alter_table('attempt_usage') as batch_op:
        batch_op.drop_index('ix_attempt_usage_window')
        batch_op.drop_column('prev_group_held_to')
        batch_op.drop_column('prev_held_to')
        batch_op.create_index('ix_attempt_usage_window', OLD, unique=False)
