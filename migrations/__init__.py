"""Alembic migrations. Run with ``raylane db upgrade`` or ``alembic upgrade head``."""
