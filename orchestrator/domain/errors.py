"""Domain errors. The API maps each class to one HTTP status in one place
(``raylane.api.errors``); nothing below the API raises HTTP errors."""

from __future__ import annotations


class RaylaneError(Exception):
    """Base of every domain error; ``message`` is shown to the caller as is."""

    def __init__(self, message: str, *, field: str | None = None):
        super().__init__(message)
        self.message = message
        self.field = field


class NotFound(RaylaneError):
    """The object does not exist, or the caller may not see it (they look the same)."""


class Conflict(RaylaneError):
    """The request is valid but the object's state forbids it (e.g. cancel a finished job)."""


class InvalidTransition(Conflict):
    """A status change the table in ``states`` does not allow, or lost a race."""


class Invalid(RaylaneError):
    """Input that is well-formed but cannot be accepted (e.g. a job that can never fit)."""


class Forbidden(RaylaneError):
    """The caller is known but a rule forbids the action."""


class Unauthorized(RaylaneError):
    """No or bad credentials."""


class RateLimited(RaylaneError):
    """Too many requests of one kind from one caller; try again after ``retry_after_s``."""

    def __init__(self, message: str, *, retry_after_s: int):
        super().__init__(message)
        self.retry_after_s = retry_after_s


# What crosses the layers from below: the store's and Ray's failures, as the API
# maps them (503: the same request may work when sent again) without importing
# the store or Ray's adapters.


class Unavailable(Exception):
    """A service the control plane depends on did not answer (the database, a Ray
    cluster); the same request may succeed when sent again."""


class StoreFailed(Exception):
    """The database failed a call (busy, gone, failing over, or a statement it
    refused): raised where a layer above the store must tell it from its own errors
    (a lane host's env whose package could not be read)."""


class StoreUnavailable(Unavailable, StoreFailed):
    """The database's availability (down, restarting, a connection cut, the pool's
    wait run out, SQLite locked), not the statement's: the same work may succeed
    when tried again. ``store.db`` raises it for the SQLAlchemy error it wraps
    (``__cause__``) when a unit of work ends with one."""


class EngineUnavailable(Unavailable):
    """A Ray cluster (its dashboard, Jobs API or GCS) could not be reached."""
