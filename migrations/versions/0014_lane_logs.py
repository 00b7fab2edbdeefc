"""lane_logs: a warm lane attempt's log tail, kept with its outcome, so Ray's KV
store holds live lane attempts only (domain.lanes)

Revision ID: 0014_lane_logs
Revises: 0013_auth_epoch
Create Date: 2026-12-01 20:50:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0014_lane_logs'
down_revision = '0013_auth_epoch'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('lane_logs',
    sa.Column('job_id', sa.String(length=26), nullable=False),
    sa.Column('number', sa.Integer(), nullable=False),
    sa.Column('tail', sa.Text(), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_lane_logs_job_id_jobs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('job_id', 'number', name=op.f('pk_lane_logs'))
    )


def downgrade() -> None:
    op.drop_table('lane_logs')
