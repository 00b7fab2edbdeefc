"""dependencies: a job's parents, and how many it still waits for

Revision ID: 0009_dependencies
Revises: 0008_arrays
Create Date: 2026-12-01 11:54:24
"""
from alembic import op
import sqlalchemy as sa


revision = '0009_dependencies'
down_revision = '0008_arrays'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('job_dependencies',
    sa.Column('child_id', sa.String(length=26), nullable=False),
    sa.Column('parent_id', sa.String(length=26), nullable=False),
    sa.Column('condition', sa.String(length=16), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.ForeignKeyConstraint(['child_id'], ['jobs.id'], name=op.f('fk_job_dependencies_child_id_jobs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('child_id', 'parent_id', name=op.f('pk_job_dependencies'))
    )
    with op.batch_alter_table('job_dependencies', schema=None) as batch_op:
        batch_op.create_index('ix_job_dependencies_parent_id_state', ['parent_id', 'state'], unique=False)

    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('deps_waiting', sa.Integer(), server_default='0', nullable=False))



def downgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_column('deps_waiting')

    with op.batch_alter_table('job_dependencies', schema=None) as batch_op:
        batch_op.drop_index('ix_job_dependencies_parent_id_state')

    op.drop_table('job_dependencies')
