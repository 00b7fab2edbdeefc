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
    # Natively, never through a batch (see downgrade): SQLite adds a column itself.
    op.add_column('jobs', sa.Column('cluster', sa.String(length=32), nullable=True))
    op.add_column('jobs', sa.Column('nominated_at', sa.DateTime(timezone=True), nullable=True))
    op.create_index('ix_jobs_cluster_status', 'jobs', ['cluster', 'status'], unique=False)
    op.create_index('ix_jobs_status_nominated_at', 'jobs', ['status', 'nominated_at'], unique=False)
    op.add_column('attempts', sa.Column('fenced_at', sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column('attempts', 'fenced_at')
    op.drop_index('ix_jobs_status_nominated_at', table_name='jobs')
    op.drop_index('ix_jobs_cluster_status', table_name='jobs')
    # Natively, not through a batch: on SQLite a batch drops and rebuilds `jobs`,
    # and with foreign keys on, dropping it deletes every attempt, event and usage
    # row of every job (ON DELETE CASCADE). SQLite drops a column itself since 3.35.
    op.drop_column('jobs', 'nominated_at')
    op.drop_column('jobs', 'cluster')
