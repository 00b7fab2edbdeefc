"""schedule_hooks: webhooks on schedule events. A hook names the schedule events
it wants (``events``); a delivery is of a job's event (event_id, job_id) or of a
schedule's handled tick (schedule_id, tick: its row in schedule_runs, deleted
with the schedule)

Revision ID: 0011_schedule_hooks
Revises: 0010_tallies
Create Date: 2026-12-01 17:40:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0011_schedule_hooks'
down_revision = '0010_tallies'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('webhooks', schema=None) as batch_op:
        batch_op.add_column(sa.Column('events', sa.String(length=256), nullable=True))

    with op.batch_alter_table('webhook_deliveries', schema=None) as batch_op:
        batch_op.alter_column('event_id', existing_type=sa.Integer(), nullable=True)
        batch_op.alter_column('job_id', existing_type=sa.String(length=26), nullable=True)
        batch_op.add_column(sa.Column('schedule_id', sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column('tick', sa.DateTime(timezone=True), nullable=True))
        batch_op.create_foreign_key(batch_op.f('fk_webhook_deliveries_schedule_id_schedule_runs'), 'schedule_runs',
                                    ['schedule_id', 'tick'], ['schedule_id', 'tick'], ondelete='CASCADE')
        batch_op.create_unique_constraint(batch_op.f('uq_webhook_deliveries_hook_id_schedule_id_tick'),
                                          ['hook_id', 'schedule_id', 'tick'])


def downgrade() -> None:
    op.execute("DELETE FROM webhook_deliveries WHERE event_id IS NULL")
    with op.batch_alter_table('webhook_deliveries', schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f('uq_webhook_deliveries_hook_id_schedule_id_tick'), type_='unique')
        batch_op.drop_constraint(batch_op.f('fk_webhook_deliveries_schedule_id_schedule_runs'), type_='foreignkey')
        batch_op.drop_column('tick')
        batch_op.drop_column('schedule_id')
        batch_op.alter_column('job_id', existing_type=sa.String(length=26), nullable=False)
        batch_op.alter_column('event_id', existing_type=sa.Integer(), nullable=False)

    with op.batch_alter_table('webhooks', schema=None) as batch_op:
        batch_op.drop_column('events')
