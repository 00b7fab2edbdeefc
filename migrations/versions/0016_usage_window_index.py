"""attempt_usage: the window index covers what costs and the report read
(ix_attempt_usage_window replaces ix_attempt_usage_held_to, its first column)

Revision ID: 0016_usage_window_index
Revises: 0015_attempt_ray_job
Create Date: 2026-12-03 20:25:00
"""
from alembic import op


revision = '0016_usage_window_index'
down_revision = '0015_attempt_ray_job'
branch_labels = None
depends_on = None

COLUMNS = ['held_to', 'held_from', 'project', 'kind', 'node_group', 'market', 'cpu', 'gpu', 'job_id']


def upgrade() -> None:
    with op.batch_alter_table('attempt_usage') as batch_op:
        batch_op.create_index('ix_attempt_usage_window', COLUMNS, unique=False)
        batch_op.drop_index('ix_attempt_usage_held_to')


def downgrade() -> None:
    with op.batch_alter_table('attempt_usage') as batch_op:
        batch_op.create_index('ix_attempt_usage_held_to', ['held_to'], unique=False)
        batch_op.drop_index('ix_attempt_usage_window')
