"""webhooks: a project's subscriptions to job status changes, and their deliveries

Revision ID: 0006_webhooks
Revises: 0005_packages
Create Date: 2026-12-01 11:27:13
"""
from alembic import op
import sqlalchemy as sa


revision = '0006_webhooks'
down_revision = '0005_packages'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('webhooks',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('project', sa.String(length=64), nullable=False),
    sa.Column('url', sa.String(length=2048), nullable=False),
    sa.Column('secret', sa.String(length=128), nullable=False),
    sa.Column('statuses', sa.String(length=256), nullable=False),
    sa.Column('description', sa.String(length=256), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('created_by', sa.String(length=128), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_webhooks'))
    )
    with op.batch_alter_table('webhooks', schema=None) as batch_op:
        batch_op.create_index('ix_webhooks_project', ['project'], unique=False)

    op.create_table('webhook_deliveries',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('hook_id', sa.String(length=32), nullable=False),
    sa.Column('event_id', sa.Integer(), nullable=False),
    sa.Column('job_id', sa.String(length=26), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('attempts', sa.Integer(), server_default='0', nullable=False),
    sa.Column('next_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('lease_owner', sa.String(length=64), nullable=True),
    sa.Column('lease_expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('last_status_code', sa.Integer(), nullable=True),
    sa.Column('last_error', sa.String(length=512), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('delivered_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['event_id'], ['events.id'], name=op.f('fk_webhook_deliveries_event_id_events'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['hook_id'], ['webhooks.id'], name=op.f('fk_webhook_deliveries_hook_id_webhooks'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_webhook_deliveries')),
    sa.UniqueConstraint('hook_id', 'event_id', name=op.f('uq_webhook_deliveries_hook_id_event_id'))
    )
    with op.batch_alter_table('webhook_deliveries', schema=None) as batch_op:
        batch_op.create_index('ix_webhook_deliveries_hook_id_id', ['hook_id', 'id'], unique=False)
        batch_op.create_index('ix_webhook_deliveries_status_next_at', ['status', 'next_at'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('webhook_deliveries', schema=None) as batch_op:
        batch_op.drop_index('ix_webhook_deliveries_status_next_at')
        batch_op.drop_index('ix_webhook_deliveries_hook_id_id')

    op.drop_table('webhook_deliveries')
    with op.batch_alter_table('webhooks', schema=None) as batch_op:
        batch_op.drop_index('ix_webhooks_project')

    op.drop_table('webhooks')
