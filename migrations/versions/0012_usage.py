"""usage: attempt_usage, one row per attempt with what /v1/costs and /v1/report
sum in SQL (store.usage_rows), filled from the attempts stored

Revision ID: 0012_usage
Revises: 0011_schedule_hooks
Create Date: 2026-12-01 17:05:00

The backfill is written here, not imported from the store, so this revision
keeps doing what it did when the store changes later. It computes what
``store.usage_rows.row_for`` does (the test of this revision compares the two).
"""
from datetime import datetime, timedelta, timezone

from alembic import op
import sqlalchemy as sa


revision = '0012_usage'
down_revision = '0011_schedule_hooks'
branch_labels = None
depends_on = None

CHUNK = 20_000
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
RAN = {'SUCCEEDED', 'FAILED', 'STOPPED'}
# domain.kinds' cost bases as of this revision; a kind not listed is charged as held.
BASIS = {'sweep': 'spot', 'batch_inference': 'spot', 'command': 'entrypoint'}
GPU_HINTS = ('cuda', 'gpu', 'torch', 'jax', 'tensorflow', 'keras', 'nvidia', 'vllm', 'triton', 'deepspeed',
             'accelerate', 'cupy', 'rapids', 'train', 'infer', 'model')


def _utc(t):
    if t is None:
        return None
    return t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t


def _us(t):
    return None if t is None else (t - EPOCH) // timedelta(microseconds=1)


def _row(r) -> dict:
    res = {k: float(v) for k, v in (r.resources or {}).items() if isinstance(v, (int, float))}
    created, started, ended = _utc(r.created_at), _utc(r.started_at), _utc(r.ended_at)
    span = None
    if r.cause != 'SUBMIT_ERROR':
        start = started
        if start is None and ended is not None and r.status in RAN:
            start = created
        if start is not None and (ended is None or ended > start):
            span = (start, ended)
    basis = BASIS.get(r.kind, 'held')
    review = None
    if res.get('GPU', 0) > 0:
        entry = str((r.spec or {}).get('entrypoint', '')).lower()
        review = 'gpu_cmd' if basis == 'entrypoint' and not any(h in entry for h in GPU_HINTS) else 'gpu'
    elif basis == 'spot' and r.market != 'SPOT':
        review = 'spot'
    return {'job_id': r.job_id, 'number': r.number, 'project': r.project, 'kind': r.kind,
            'node_group': r.node_group, 'market': r.market, 'cpu': res.get('CPU', 0.0), 'gpu': res.get('GPU', 0.0),
            'review': review, 'held_from': _us(span[0]) if span else None, 'held_to': _us(span[1]) if span else None}


def _backfill(bind) -> None:
    att = sa.table('attempts', sa.column('job_id'), sa.column('number'), sa.column('node_group'),
                   sa.column('market'), sa.column('resources', sa.JSON), sa.column('status'), sa.column('cause'),
                   sa.column('created_at', sa.DateTime), sa.column('started_at', sa.DateTime),
                   sa.column('ended_at', sa.DateTime))
    jobs = sa.table('jobs', sa.column('id'), sa.column('project'), sa.column('kind'), sa.column('spec', sa.JSON))
    usage = sa.table('attempt_usage', *(sa.column(c) for c in (
        'job_id', 'number', 'project', 'kind', 'node_group', 'market', 'cpu', 'gpu', 'review', 'held_from',
        'held_to')))
    q = (sa.select(att.c.job_id, att.c.number, att.c.node_group, att.c.market, att.c.resources, att.c.status,
                   att.c.cause, att.c.created_at, att.c.started_at, att.c.ended_at, jobs.c.project, jobs.c.kind,
                   jobs.c.spec)
         .join(jobs, jobs.c.id == att.c.job_id).order_by(att.c.job_id, att.c.number))
    last = None
    while True:  # pages by key: no cursor stays open across the inserts
        page = q.limit(CHUNK) if last is None else q.where(
            sa.tuple_(att.c.job_id, att.c.number) > sa.tuple_(sa.literal(last[0]), sa.literal(last[1]))).limit(CHUNK)
        rows = bind.execute(page).all()
        if not rows:
            return
        bind.execute(usage.insert(), [_row(r) for r in rows])
        last = (rows[-1].job_id, rows[-1].number)


def upgrade() -> None:
    op.create_table('attempt_usage',
    sa.Column('job_id', sa.String(length=26), nullable=False),
    sa.Column('number', sa.Integer(), nullable=False),
    sa.Column('project', sa.String(length=64), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('node_group', sa.String(length=64), nullable=True),
    sa.Column('market', sa.String(length=16), nullable=True),
    sa.Column('cpu', sa.Float(), nullable=False),
    sa.Column('gpu', sa.Float(), nullable=False),
    sa.Column('review', sa.String(length=8), nullable=True),
    sa.Column('held_from', sa.BigInteger(), nullable=True),
    sa.Column('held_to', sa.BigInteger(), nullable=True),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_attempt_usage_job_id_jobs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('job_id', 'number', name=op.f('pk_attempt_usage'))
    )
    with op.batch_alter_table('attempt_usage', schema=None) as batch_op:
        batch_op.create_index('ix_attempt_usage_held_to', ['held_to'], unique=False)
        batch_op.create_index('ix_attempt_usage_review_held_to', ['review', 'held_to'], unique=False)
    _backfill(op.get_bind())


def downgrade() -> None:
    with op.batch_alter_table('attempt_usage', schema=None) as batch_op:
        batch_op.drop_index('ix_attempt_usage_review_held_to')
        batch_op.drop_index('ix_attempt_usage_held_to')
    op.drop_table('attempt_usage')
