"""packages: code uploaded by clients (zipped working dirs), named by sha256

Revision ID: 0005_packages
Revises: 0004_rate_windows
Create Date: 2026-12-01 08:40:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0005_packages'
down_revision = '0004_rate_windows'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('packages',
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('size_bytes', sa.Integer(), nullable=False),
    sa.Column('data', sa.LargeBinary(), nullable=False),
    sa.Column('project', sa.String(length=64), nullable=True),
    sa.Column('created_by', sa.String(length=128), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('last_used_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('sha256', name=op.f('pk_packages'))
    )
    with op.batch_alter_table('packages', schema=None) as batch_op:
        batch_op.create_index('ix_packages_last_used_at', ['last_used_at'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('packages', schema=None) as batch_op:
        batch_op.drop_index('ix_packages_last_used_at')
    op.drop_table('packages')
