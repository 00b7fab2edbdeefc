"""jobs.cluster, a fleet's nominee (the one cluster whose dispatcher may admit the
job now; NULL: the deployment's one cluster) and jobs.nominated_at (when the placer
last nominated it or judged the nomination still best), and attempts.fenced_at (an attempt
given up with its lost cluster, stopped there once the cluster answered again).
Both NULL for every row written before: a deployment of one cluster never sets them.

Revision ID: 0019_fleet_dispatch
Revises: 0018_attempt_cluster
Create Date: 2026-12-07 13:00:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0019_fleet_dispatch'
down_revision = '0018_attempt_cluster'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs') as batch_op:
        batch_op.add_column(sa.Column('cluster', sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column('nominated_at', sa.DateTime(timezone=True), nullable=True))
        batch_op.create_index('ix_jobs_cluster_status', ['cluster', 'status'], unique=False)
        batch_op.create_index('ix_jobs_status_nominated_at', ['status', 'nominated_at'], unique=False)
    with op.batch_alter_table('attempts') as batch_op:
        batch_op.add_column(sa.Column('fenced_at', sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('attempts') as batch_op:
        batch_op.drop_column('fenced_at')
    with op.batch_alter_table('jobs') as batch_op:
        batch_op.drop_index('ix_jobs_status_nominated_at')
        batch_op.drop_index('ix_jobs_cluster_status')
        batch_op.drop_column('nominated_at')
        batch_op.drop_column('cluster')
