"""``store.prepared``: a row inserted through a prepared insert reads back the same
as one inserted by ``insert(table)``, on SQLite and PostgreSQL (types, defaults,
JSON, UTC datetimes), and a unique violation is still SQLAlchemy's IntegrityError."""

from __future__ import annotations

import pytest
from sqlalchemy import insert, select
from sqlalchemy.exc import IntegrityError

from raylane.orchestrator.domain.ids import new_job_id
from raylane.orchestrator.domain.specs import JobSpec
from raylane.orchestrator.store import db
from raylane.orchestrator.store.jobs import _job_row
from raylane.orchestrator.store.prepared import PreparedInsert
from raylane.orchestrator.store.tables import job_labels, jobs
from raylane.orchestrator.store.transitions import utcnow

SPEC = JobSpec(name="p", kind="command", entrypoint="echo 'a \"b\"' %s", labels={"k": "v"})


def _row():
    r = _job_row(SPEC, project="default", job_id=new_job_id(), now=utcnow(), placement=None,
                 idempotency_key="key-" + new_job_id(), reason=None)
    del r["skips"], r["preemptions"]  # left to their column defaults
    return r


def test_a_prepared_row_reads_back_as_an_inserted_one(cp):
    prepared = PreparedInsert(jobs)
    a, b = _row(), _row()
    b["created_at"] = b["updated_at"] = a["created_at"]
    with db.transaction(cp.sessions) as s:
        prepared.execute(s, a)
        s.execute(insert(jobs), b)
        PreparedInsert(job_labels).execute(s, [{"job_id": a["id"], "key": "x", "value": "1"},
                                               {"job_id": a["id"], "key": "y", "value": "2"}])
    with db.transaction(cp.sessions) as s:
        got = {r["id"]: dict(r) for r in s.execute(select(jobs)).mappings()}
        labels = dict(s.execute(select(job_labels.c.key, job_labels.c.value)).all())
    ra, rb = got[a["id"]], got[b["id"]]
    for r in (ra, rb):
        r.pop("id"), r.pop("idempotency_key")
    assert ra == rb
    assert ra["spec"] == SPEC.model_dump(mode="json", exclude_none=True) and ra["skips"] == 0
    assert ra["created_at"] == a["created_at"] and ra["created_at"].tzinfo is not None
    assert labels == {"x": "1", "y": "2"}


def test_a_duplicate_is_an_integrity_error(cp):
    row = _row()
    with pytest.raises(IntegrityError):
        with db.transaction(cp.sessions) as s:
            PreparedInsert(jobs).execute(s, row)
            PreparedInsert(jobs).execute(s, row)
