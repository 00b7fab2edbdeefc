"""floods: rate_windows (submit limits shared by replicas through the database),
audit_log.count (refusals without a valid token aggregated per client and minute)

Revision ID: 0004_rate_windows
Revises: 0003
Create Date: 2026-12-02 10:00:00
"""
from alembic import op
import sqlalchemy as sa

revision = '0004_rate_windows'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('rate_windows',
    sa.Column('key', sa.String(length=255), nullable=False),
    sa.Column('window_start', sa.Integer(), nullable=False),
    sa.Column('n', sa.Integer(), nullable=False),
    sa.PrimaryKeyConstraint('key', 'window_start', name=op.f('pk_rate_windows'))
    )
    with op.batch_alter_table('rate_windows', schema=None) as batch_op:
        batch_op.create_index('ix_rate_windows_window_start', ['window_start'], unique=False)
    with op.batch_alter_table('audit_log', schema=None) as batch_op:
        batch_op.add_column(sa.Column('count', sa.Integer(), server_default='1', nullable=False))


def downgrade() -> None:
    with op.batch_alter_table('audit_log', schema=None) as batch_op:
        batch_op.drop_column('count')
    with op.batch_alter_table('rate_windows', schema=None) as batch_op:
        batch_op.drop_index('ix_rate_windows_window_start')
    op.drop_table('rate_windows')
