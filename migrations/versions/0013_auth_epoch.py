"""auth_epoch: one number raised by every change to a token's identity or
liveness, so replicas may keep verified tokens in memory and still refuse a
revoked one on its next request (services.access)

Revision ID: 0013_auth_epoch
Revises: 0012_usage
Create Date: 2026-12-01 17:20:00

Triggers raise it, not the store's functions: a token changed by any writer
(an operator's UPDATE included) moves the epoch in the same transaction.
last_used_at (written once a minute per token) is not among the columns.
"""
from alembic import op
import sqlalchemy as sa


revision = '0013_auth_epoch'
down_revision = '0012_usage'
branch_labels = None
depends_on = None

COLUMNS = 'revoked_at, expires_at, role, project, name, token_hash'
BUMP = 'UPDATE auth_epoch SET n = n + 1 WHERE id = 1'


def upgrade() -> None:
    table = op.create_table('auth_epoch',
    sa.Column('id', sa.Integer(), autoincrement=False, nullable=False),
    sa.Column('n', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_auth_epoch'))
    )
    op.bulk_insert(table, [{'id': 1, 'n': 0}])
    if op.get_bind().dialect.name == 'postgresql':
        op.execute(f'CREATE FUNCTION raylane_bump_auth_epoch() RETURNS trigger AS $$ '
                   f'BEGIN {BUMP}; RETURN NULL; END $$ LANGUAGE plpgsql')
        op.execute(f'CREATE TRIGGER api_tokens_auth_epoch AFTER UPDATE OF {COLUMNS} OR DELETE ON api_tokens '
                   f'FOR EACH STATEMENT EXECUTE FUNCTION raylane_bump_auth_epoch()')
    else:
        op.execute(f'CREATE TRIGGER api_tokens_auth_epoch_update AFTER UPDATE OF {COLUMNS} ON api_tokens '
                   f'BEGIN {BUMP}; END')
        op.execute(f'CREATE TRIGGER api_tokens_auth_epoch_delete AFTER DELETE ON api_tokens BEGIN {BUMP}; END')


def downgrade() -> None:
    if op.get_bind().dialect.name == 'postgresql':
        op.execute('DROP TRIGGER api_tokens_auth_epoch ON api_tokens')
        op.execute('DROP FUNCTION raylane_bump_auth_epoch()')
    else:
        op.execute('DROP TRIGGER api_tokens_auth_epoch_update')
        op.execute('DROP TRIGGER api_tokens_auth_epoch_delete')
    op.drop_table('auth_epoch')
