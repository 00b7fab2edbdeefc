"""Alembic migrations. Run with ``raylane-server db upgrade`` or ``alembic upgrade head``."""
