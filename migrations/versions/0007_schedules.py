"""schedules: specs run at the ticks of a cron expression, one row per handled tick

Revision ID: 0007_schedules
Revises: 0006_webhooks
Create Date: 2026-12-01 11:36:20
"""
from alembic import op
import sqlalchemy as sa


revision = '0007_schedules'
down_revision = '0006_webhooks'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('schedules',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('project', sa.String(length=64), nullable=False),
    sa.Column('name', sa.String(length=128), nullable=False),
    sa.Column('cron', sa.String(length=256), nullable=False),
    sa.Column('timezone', sa.String(length=64), nullable=False),
    sa.Column('spec', sa.JSON(), nullable=False),
    sa.Column('overlap', sa.String(length=16), nullable=False),
    sa.Column('missed', sa.String(length=16), nullable=False),
    sa.Column('starting_deadline_s', sa.Float(), nullable=False),
    sa.Column('paused', sa.Boolean(), nullable=False),
    sa.Column('next_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('last_job_id', sa.String(length=26), nullable=True),
    sa.Column('lease_owner', sa.String(length=64), nullable=True),
    sa.Column('lease_expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('created_by', sa.String(length=128), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_schedules')),
    sa.UniqueConstraint('project', 'name', name=op.f('uq_schedules_project_name'))
    )
    with op.batch_alter_table('schedules', schema=None) as batch_op:
        batch_op.create_index('ix_schedules_paused_next_at', ['paused', 'next_at'], unique=False)

    op.create_table('schedule_runs',
    sa.Column('schedule_id', sa.String(length=32), nullable=False),
    sa.Column('tick', sa.DateTime(timezone=True), nullable=False),
    sa.Column('job_id', sa.String(length=26), nullable=True),
    sa.Column('outcome', sa.String(length=16), nullable=False),
    sa.Column('reason', sa.String(length=256), nullable=True),
    sa.Column('at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['schedule_id'], ['schedules.id'], name=op.f('fk_schedule_runs_schedule_id_schedules'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('schedule_id', 'tick', name=op.f('pk_schedule_runs'))
    )


def downgrade() -> None:
    op.drop_table('schedule_runs')
    with op.batch_alter_table('schedules', schema=None) as batch_op:
        batch_op.drop_index('ix_schedules_paused_next_at')

    op.drop_table('schedules')
