"""attempt_usage: prev_held_to and prev_group_held_to, so a window counts distinct
jobs (in all and per node group) as a sum in the GROUP BY that sums its held
seconds (store.usage.sums) instead of two more COUNT(DISTINCT) scans; key_id, the
key those sums group by as one integer; the window index now leads with it, so
SQLite sums a window key by key in index order, without a sort

Revision ID: 0017_usage_prev
Revises: 0016_usage_window_index
Create Date: 2026-12-04 14:30:00

The backfill is written here, not imported from the store (the test of this
revision compares it with ``store.usage_rows.recount``).
"""
import hashlib
import struct

from alembic import op
import sqlalchemy as sa


revision = '0017_usage_prev'
down_revision = '0016_usage_window_index'
branch_labels = None
depends_on = None

OLD = ['held_to', 'held_from', 'project', 'kind', 'node_group', 'market', 'cpu', 'gpu', 'job_id']
NEW = ['key_id', 'held_to', 'held_from', 'prev_held_to', 'prev_group_held_to']
KEY = ('project', 'kind', 'node_group', 'market', 'cpu', 'gpu')


def _key_id(project, kind, node_group, market, cpu, gpu) -> int:
    """store.usage_rows.key_id as of this revision."""
    raw = repr((project, kind, node_group, market, float(cpu), float(gpu))).encode()
    return struct.unpack('>q', hashlib.blake2b(raw, digest_size=8).digest())[0]


def _backfill() -> None:
    bind = op.get_bind()
    u = sa.table('attempt_usage', sa.column('job_id'), sa.column('number'), sa.column('held_to'),
                 sa.column('prev_held_to'), sa.column('prev_group_held_to'), sa.column('key_id'),
                 *(sa.column(c) for c in KEY))
    p = u.alias('earlier')
    earlier = (p.c.job_id == u.c.job_id, p.c.number < u.c.number)
    same_group = sa.func.coalesce(p.c.node_group, 'none') == sa.func.coalesce(u.c.node_group, 'none')
    bind.execute(sa.update(u).where(u.c.number > 1).values(
        prev_held_to=sa.select(sa.func.max(p.c.held_to)).where(*earlier).scalar_subquery(),
        prev_group_held_to=sa.select(sa.func.max(p.c.held_to)).where(*earlier, same_group).scalar_subquery()))
    # key_id: the distinct keys hashed here, then one UPDATE that looks each row's key
    # up in a scratch table by index (one pass, however many keys).
    keys = bind.execute(sa.select(*(u.c[c] for c in KEY)).distinct()).all()
    if not keys:
        return
    scratch = sa.Table('usage_keys_0017', sa.MetaData(), sa.Column('key_id', sa.BigInteger(), nullable=False),
                       *(sa.Column(c, sa.String(64) if c not in ('cpu', 'gpu') else sa.Float(), nullable=False)
                         for c in KEY))
    scratch.create(bind)
    try:
        sa.Index('ix_usage_keys_0017', *(scratch.c[c] for c in KEY)).create(bind)
        blank = {'node_group': '', 'market': ''}  # NULL, which = cannot match, as ''
        bind.execute(scratch.insert(), [{'key_id': _key_id(*k), **{c: (blank[c] if v is None and c in blank else v)
                                                                   for c, v in zip(KEY, k)}} for k in keys])
        match = [scratch.c[c] == (sa.func.coalesce(u.c[c], '') if c in blank else u.c[c]) for c in KEY]
        bind.execute(sa.update(u).values(key_id=sa.select(scratch.c.key_id).where(*match).scalar_subquery()))
    finally:
        scratch.drop(bind)


def upgrade() -> None:
    with op.batch_alter_table('attempt_usage') as batch_op:
        batch_op.add_column(sa.Column('prev_held_to', sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column('prev_group_held_to', sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column('key_id', sa.BigInteger(), nullable=True))
        batch_op.drop_index('ix_attempt_usage_window')
    _backfill()
    with op.batch_alter_table('attempt_usage') as batch_op:
        batch_op.alter_column('key_id', existing_type=sa.BigInteger(), nullable=False)
        batch_op.create_index('ix_attempt_usage_window', NEW, unique=False)


def downgrade() -> None:
    with op.batch_alter_table('attempt_usage') as batch_op:
        batch_op.drop_index('ix_attempt_usage_window')
        batch_op.drop_column('key_id')
        batch_op.drop_column('prev_group_held_to')
        batch_op.drop_column('prev_held_to')
        batch_op.create_index('ix_attempt_usage_window', OLD, unique=False)
