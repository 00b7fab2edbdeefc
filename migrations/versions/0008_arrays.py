"""arrays: one spec, many member jobs, at most max_parallel running

Revision ID: 0008_arrays
Revises: 0007_schedules
Create Date: 2026-12-01 11:42:59
"""
from alembic import op
import sqlalchemy as sa


revision = '0008_arrays'
down_revision = '0007_schedules'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('arrays',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('project', sa.String(length=64), nullable=False),
    sa.Column('name', sa.String(length=128), nullable=False),
    sa.Column('size', sa.Integer(), nullable=False),
    sa.Column('max_parallel', sa.Integer(), nullable=True),
    sa.Column('spec', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('created_by', sa.String(length=128), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_arrays'))
    )
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('array_id', sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column('array_index', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('array_held', sa.Boolean(), server_default=sa.false(), nullable=False))
        batch_op.create_index('ix_jobs_array_id_array_held', ['array_id', 'array_held'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_index('ix_jobs_array_id_array_held')
        batch_op.drop_column('array_held')
        batch_op.drop_column('array_index')
        batch_op.drop_column('array_id')

    op.drop_table('arrays')
