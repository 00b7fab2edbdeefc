"""The job store: SQLAlchemy 2.0 tables and functions that take a session.

``tables``      the schema (Alembic migrations in migrations/ build the same)
``db``          engines and sessions for SQLite (WAL) and PostgreSQL
``transitions`` the only writer of a job's and an attempt's status: compare-and-set + event row
``lifecycle``   one function per observation of the loops: attempt and job in one transaction
``jobs``        submit, read, list, cancel: what the API calls
``queue``       claim and lease: the queue's head, admissions, stale leases
``stats``       aggregate reads: what active jobs hold, the metrics' counts
``quotas``      per-project limits and usage; ``usage``: attempts for accounting
``tokens``      projects, API tokens and the audit trail
``packages``    code packages uploaded by clients, and their sweep
"""
