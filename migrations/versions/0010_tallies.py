"""tallies: counts /metrics reads instead of scanning every job (store.tallies),
filled from the tables as they are; the node-group index gains created_at
(the oldest queued job per group); the queue's index orders priority high
first (read in order, not sorted); (status, id) serves an admin's list by
status; attempts get an index on ended_at (costs)

Revision ID: 0010_tallies
Revises: 0009_dependencies
Create Date: 2026-12-01 11:40:00

The backfill is written here, not imported from the store, so this revision
keeps doing what it did when the store changes later. It is the same counting
as ``store.tallies.recount`` (the test of this revision compares the two).
"""
from alembic import op
import sqlalchemy as sa


revision = '0010_tallies'
down_revision = '0009_dependencies'
branch_labels = None
depends_on = None

NONE = 'none'
BUCKETS = {
    'admission_wait': (0.1, 0.5, 1, 2, 5, 10, 30, 60, 300, 900, 1800, 3600, 4 * 3600, 12 * 3600, 24 * 3600),
    'dispatch_latency': (0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300, 900),
}


def _backfill(bind) -> None:
    jobs = sa.table('jobs', sa.column('id'), sa.column('status'), sa.column('node_group'), sa.column('kind'),
                    sa.column('created_at'))
    att = sa.table('attempts', sa.column('job_id'), sa.column('number'), sa.column('node_group'),
                   sa.column('market'), sa.column('cause'), sa.column('created_at'), sa.column('started_at'))
    f = sa.func
    pg = bind.dialect.name == 'postgresql'

    def seconds(later, earlier):
        if pg:
            return f.extract('epoch', later - earlier)
        return (f.julianday(later) - f.julianday(earlier)) * 86400.0

    jg = f.coalesce(jobs.c.node_group, NONE)
    ag = f.coalesce(att.c.node_group, NONE)
    market = f.coalesce(att.c.market, NONE)
    rows = []

    def put(name, a, b, v):
        if v:
            rows.append({'name': name, 'label1': a, 'label2': b, 'shard': 0, 'value': float(v)})

    for st, g, n in bind.execute(sa.select(jobs.c.status, jg, f.count()).group_by(jobs.c.status, jg)):
        put('jobs', st, g, n)
    for kind, n in bind.execute(sa.select(jobs.c.kind, f.count()).group_by(jobs.c.kind)):
        put('jobs_created', kind, '', n)
    for g, m, n in bind.execute(sa.select(ag, market, f.count()).group_by(ag, market)):
        put('attempts', g, m, n)
    for g, n in bind.execute(sa.select(ag, f.count()).where(att.c.number > 1).group_by(ag)):
        put('retries', g, '', n)
    for g, c, n in bind.execute(sa.select(ag, att.c.cause, f.count()).where(att.c.cause.is_not(None))
                                .group_by(ag, att.c.cause)):
        put('failures', g, c, n)
    for name, d, where in (
        ('admission_wait', seconds(att.c.created_at, jobs.c.created_at), [att.c.job_id == jobs.c.id, att.c.number == 1]),
        ('dispatch_latency', seconds(att.c.started_at, att.c.created_at), [att.c.started_at.is_not(None)]),
    ):
        sub = sa.select(ag.label('g'), d.label('d')).where(*where).subquery()
        cols = [f.count(), f.coalesce(f.sum(sub.c.d), 0.0)]
        cols += [f.sum(sa.case((sub.c.d <= b, 1), else_=0)) for b in BUCKETS[name]]
        for g, count, total, *le in bind.execute(sa.select(sub.c.g, *cols).group_by(sub.c.g)):
            put(name, g, '+Inf', count)
            put(name, g, 'sum', total)
            for b, n in zip(BUCKETS[name], le):
                put(name, g, str(float(b)), n)
    if rows:
        tallies = sa.table('tallies', sa.column('name'), sa.column('label1'), sa.column('label2'),
                           sa.column('shard'), sa.column('value'))
        bind.execute(tallies.insert(), rows)


def upgrade() -> None:
    op.create_table('tallies',
    sa.Column('name', sa.String(length=32), nullable=False),
    sa.Column('label1', sa.String(length=64), nullable=False),
    sa.Column('label2', sa.String(length=64), nullable=False),
    sa.Column('shard', sa.Integer(), nullable=False),
    sa.Column('value', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('name', 'label1', 'label2', 'shard', name=op.f('pk_tallies'))
    )
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_index('ix_jobs_node_group_status')
        batch_op.create_index('ix_jobs_node_group_status_created_at', ['node_group', 'status', 'created_at'],
                              unique=False)
        batch_op.drop_index('ix_jobs_status_priority_id')
        batch_op.create_index('ix_jobs_status_priority_id', ['status', sa.text('priority DESC'), 'id'], unique=False)
        batch_op.create_index('ix_jobs_status_id', ['status', 'id'], unique=False)
    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.create_index('ix_attempts_ended_at', ['ended_at'], unique=False)
    _backfill(op.get_bind())


def downgrade() -> None:
    with op.batch_alter_table('attempts', schema=None) as batch_op:
        batch_op.drop_index('ix_attempts_ended_at')
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_index('ix_jobs_node_group_status_created_at')
        batch_op.create_index('ix_jobs_node_group_status', ['node_group', 'status'], unique=False)
        batch_op.drop_index('ix_jobs_status_priority_id')
        batch_op.create_index('ix_jobs_status_priority_id', ['status', 'priority', 'id'], unique=False)
        batch_op.drop_index('ix_jobs_status_id')
    op.drop_table('tallies')
