"""attempts.ray_job: the Ray job an attempt ran in when it is not its own (a
warm lane's host), so the attempt links to that job in Ray's dashboard

Revision ID: 0015_attempt_ray_job
Revises: 0014_lane_logs
Create Date: 2026-12-02 02:40:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0015_attempt_ray_job'
down_revision = '0014_lane_logs'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('attempts') as batch_op:
        batch_op.add_column(sa.Column('ray_job', sa.String(length=128), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('attempts') as batch_op:
        batch_op.drop_column('ray_job')
