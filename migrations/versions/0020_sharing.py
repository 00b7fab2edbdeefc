"""Sharing the owned GPUs (docs/sharing.md): quotas.borrow_gpus / borrow_cpus (how
much beyond its guaranteed share a project may borrow; NULL: nothing, the hard cap
quotas always were) and lend_gpus / lend_cpus (how much of its idle share others may
borrow; NULL: all of it); attempts.preempt_for (the waiting job an attempt is
preempted for) and attempts.preempt_deadline (when it is stopped at the latest).
NULL in every row written before: no quota borrows, no attempt is being preempted.

Revision ID: 0020_sharing
Revises: 0019_fleet_dispatch
Create Date: 2026-12-07 16:00:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0020_sharing'
down_revision = '0019_fleet_dispatch'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Natively, never through a batch: SQLite adds a nullable column itself, and a
    # batch rebuild of a table others reference deletes their rows (ON DELETE CASCADE).
    for name in ('borrow_gpus', 'borrow_cpus', 'lend_gpus', 'lend_cpus'):
        op.add_column('quotas', sa.Column(name, sa.Float(), nullable=True))
    op.add_column('attempts', sa.Column('preempt_for', sa.String(length=26), nullable=True))
    op.add_column('attempts', sa.Column('preempt_deadline', sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    # Natively (SQLite drops a column itself since 3.35), for the reason upgrade gives.
    op.drop_column('attempts', 'preempt_deadline')
    op.drop_column('attempts', 'preempt_for')
    for name in ('lend_cpus', 'lend_gpus', 'borrow_cpus', 'borrow_gpus'):
        op.drop_column('quotas', name)
