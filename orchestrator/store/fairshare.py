"""What fair share reads (``domain.fairshare``): each project's decayed usage per
node group, from the held spans ``attempt_usage`` keeps (``store.usage_rows``).

One statement, summed in the database: the decay of a span [a, b] is
H/ln2 * (2^((b-now)/H) - 2^((a-now)/H)), a difference of two exponentials of
the row's own columns, so the database returns a row per (project, group)
instead of every attempt of the lookback. It reads the rows still holding or
that stopped within the lookback, from ``ix_attempt_usage_fair_share`` alone
(covering), not the table's whole history; still a read of every attempt of
the last ten half-lives, so the dispatcher keeps the result
``FAIR_SHARE_KEPT_S``. SQLite needs its math functions for ``exp``
(``store.db`` adds one where the library was built without them).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import bindparam, case, func, select
from sqlalchemy.orm import Session

from raylane.orchestrator.domain.fairshare import LN2, LOOKBACK_HALF_LIVES, Used
from raylane.orchestrator.store.tables import attempt_usage
from raylane.orchestrator.store.usage_rows import micros

_u = attempt_usage.c
_US = 1e6  # microseconds a second: the held columns' unit


def _weight(t):
    """2^((t - now)/H) of a held column ``t`` (microseconds), as exp(k * (t - now))."""
    return func.exp(bindparam("b_k") * (t - bindparam("b_now")))


_END = func.coalesce(_u.held_to, bindparam("b_now"))
_DECAY = _weight(_END) - _weight(_u.held_from)
_USAGE = (select(_u.project, _u.node_group, func.sum(_u.gpu * _DECAY).label("gpu"),
                 func.sum(_u.cpu * _DECAY).label("cpu"),
                 func.sum(case((_u.held_to.is_not(None), _u.held_to - _u.held_from), else_=0)).label("ran"),
                 func.count(_u.held_to).label("ended"))
          .where(_u.held_from.is_not(None), _u.node_group.is_not(None),
                 (_u.held_to.is_(None)) | (_u.held_to >= bindparam("b_since")))
          .group_by(_u.project, _u.node_group))


def usage(session: Session, *, now: datetime, half_life_s: float,
          project: str | None = None) -> dict[tuple[str, str], Used]:
    """(project, group) -> its decayed usage there at ``now`` (``project``: that one's only)."""
    now_us = micros(now)
    q = _USAGE if project is None else _USAGE.where(_u.project == project)
    out = {}
    for r in session.execute(q, {"b_k": LN2 / (half_life_s * _US), "b_now": now_us,
                                 "b_since": now_us - int(LOOKBACK_HALF_LIVES * half_life_s * _US)}):
        scale = half_life_s / LN2
        out[(r.project, r.node_group)] = Used(gpu_s=max(0.0, float(r.gpu or 0.0)) * scale,
                                              cpu_s=max(0.0, float(r.cpu or 0.0)) * scale,
                                              ran_s=float(r.ran or 0) / _US, ended=int(r.ended or 0))
    return out
