"""attempt_usage: a covering index by held_to for fair share (store.fairshare), which
reads the rows still holding or that stopped within the last ten half-lives: without
it, every row of the table's whole history, every 30 s.

Revision ID: 0021_fair_share_index
Revises: 0020_sharing
Create Date: 2026-12-07 16:00:00
"""
from alembic import op


revision = '0021_fair_share_index'
down_revision = '0020_sharing'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index('ix_attempt_usage_fair_share', 'attempt_usage', ['held_to', 'held_from', 'project', 'node_group', 'cpu', 'gpu'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_attempt_usage_fair_share', table_name='attempt_usage')
