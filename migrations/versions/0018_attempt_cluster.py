"""attempts.cluster: the fleet's cluster an attempt was placed on (docs/fleet.md),
so a fleet's report, reconciling and fencing know where each attempt lives.
NULL: the deployment's one cluster (every attempt made before fleets, and every
attempt of a deployment without RAYLANE_FLEET).

Revision ID: 0018_attempt_cluster
Revises: 0017_usage_prev
Create Date: 2026-12-07 04:35:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0018_attempt_cluster'
down_revision = '0017_usage_prev'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('attempts') as batch_op:
        batch_op.add_column(sa.Column('cluster', sa.String(length=32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('attempts') as batch_op:
        batch_op.drop_column('cluster')
