"""attempts.preempt_for indexed: the dispatcher reads the attempts being (or
lately) preempted every pass (store.sharing); without the index each read scans
every attempt ever made.

Revision ID: 0022_preempt_index
Revises: 0021_fair_share_index
Create Date: 2026-12-07 17:00:00
"""
from alembic import op


revision = '0022_preempt_index'
down_revision = '0021_fair_share_index'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index('ix_attempts_preempt_for', 'attempts', ['preempt_for'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_attempts_preempt_for', table_name='attempts')
