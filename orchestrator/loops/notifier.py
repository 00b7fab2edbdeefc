"""The notifier: sends due webhook deliveries (``store.webhooks``), signed.

Each pass leases up to ``BATCH`` due deliveries to this replica, POSTs each to
its hook's URL and records the try: a 2xx is DELIVERED; anything else (another
status, a timeout, a refused connection) is tried again after a backoff that
doubles from ``FIRST_BACKOFF_S`` up to ``MAX_BACKOFF_S``, until
``webhook_max_attempts`` tries have failed (FAILED). The lease outlasts one
request's timeout, so another replica never sends a delivery this one is
sending; if this replica dies mid-send, the lease expires and another sends it
again (at least once; ``Raylane-Delivery`` is the same on every try).

A request:

    POST <url>
    Content-Type: application/json
    Raylane-Delivery: 42                 the delivery's id: dedupe by it
    Raylane-Event: job.status            the kind of event
    Raylane-Signature: t=1764590000,v1=<hex HMAC-SHA256 of "<t>.<body>" with the hook's secret>

    {"delivery_id": 42, "event_id": 7, "hook_id": "wh_...", "type": "job.status", "at": "...",
     "job": {"id", "name", "project", "kind"}, "from_status", "to_status", "reason", "attempt",
     "failure_cause"}

A schedule's handled tick, for a hook that asked for ``schedule.created`` or
``schedule.skipped`` (``events``):

    Raylane-Event: schedule.skipped
    {"delivery_id", "hook_id", "type": "schedule.skipped", "at", "schedule": {"id", "name", "project"},
     "tick", "outcome": "skipped", "reason", "job": null}     (created: "job": {"id"})
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import httpx

from raylane import __version__
from raylane.orchestrator.loops.base import LoopService
from raylane.orchestrator.settings import Settings
from raylane.orchestrator.store import db, webhooks as store
from raylane.orchestrator.store.transitions import utcnow

log = logging.getLogger(__name__)

BATCH = 50
SENDERS = 8  # deliveries in flight at once per replica
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 300.0
EVENT_TYPE = "job.status"


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """The ``Raylane-Signature`` header of ``body`` sent at ``timestamp``."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def verify(secret: str, header: str, body: bytes, *, tolerance_s: float = 300, now: float | None = None) -> bool:
    """What a receiver does (docs/webhooks.md): the MAC matches and the timestamp
    is recent, so a captured request cannot be replayed later."""
    try:
        fields = dict(part.split("=", 1) for part in header.split(","))
        t = int(fields["t"])
    except (ValueError, KeyError):
        return False
    if abs((now if now is not None else time.time()) - t) > tolerance_s:
        return False
    return hmac.compare_digest(signature(secret, t, body), header)


def event_type(d: dict) -> str:
    """``job.status``, or a schedule's ``schedule.created`` / ``schedule.skipped``."""
    return store.SCHEDULE_EVENTS[d["tick_outcome"]] if d.get("schedule_id") else EVENT_TYPE


def payload(d: dict) -> dict:
    if d.get("schedule_id"):
        return {"delivery_id": d["id"], "hook_id": d["hook_id"], "type": event_type(d), "at": d["tick_at"].isoformat(),
                "schedule": {"id": d["schedule_id"], "name": d["schedule_name"], "project": d["project"]},
                "tick": d["tick"].isoformat(), "outcome": d["tick_outcome"], "reason": d["tick_reason"],
                "job": {"id": d["tick_job_id"]} if d["tick_job_id"] else None}
    return {"delivery_id": d["id"], "event_id": d["event_id"], "hook_id": d["hook_id"], "type": EVENT_TYPE,
            "at": d["at"].isoformat(), "job": {"id": d["job_id"], "name": d["name"], "project": d["project"],
                                              "kind": d["kind"]},
            "from_status": d["from_status"], "to_status": d["to_status"], "reason": d["reason"],
            "attempt": d["attempt"], "failure_cause": d["failure_cause"]}


def backoff(tries_failed: int) -> float:
    return min(MAX_BACKOFF_S, FIRST_BACKOFF_S * 2 ** max(0, tries_failed - 1))


class Notifier(LoopService):
    name = "notifier"

    def __init__(self, settings: Settings, sessions, *, owner: str | None = None, wake=None):
        super().__init__(settings.webhook_interval_s, wake)
        self.settings = settings
        self.sessions = sessions
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:notifier"
        # Redirects are not followed: a receiver must not bounce the request elsewhere.
        self.http = httpx.Client(timeout=settings.webhook_timeout_s, follow_redirects=False,
                                 headers={"User-Agent": f"raylane-webhooks/{__version__}"})
        self._pool = ThreadPoolExecutor(max_workers=SENDERS, thread_name_prefix="raylane-webhook")

    def stop(self, timeout: float = 15) -> None:
        super().stop(timeout)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.http.close()

    def _refused(self, url: str) -> str | None:
        """Why a URL may not be called now (it resolves to a private address, say,
        since the hook was made); None when it may."""
        if self.settings.webhook_allow_private:
            return None
        from urllib.parse import urlsplit

        from raylane.orchestrator.netaddr import resolve

        parts = urlsplit(url)
        try:
            private = [a for a in resolve(parts.hostname or "", parts.port) if not a.is_global]
        except OSError as e:
            return f"does not resolve: {e}"
        return f"refused: {parts.hostname} resolves to {private[0]}, not a public address" if private else None

    def run_once(self) -> None:
        while True:
            now = utcnow()
            # Long enough for every request of the batch to time out.
            lease_until = now + timedelta(seconds=self.settings.webhook_timeout_s * (BATCH + 1))
            with db.transaction(self.sessions) as s:
                due = store.claim(s, owner=self.owner, now=now, lease_until=lease_until, limit=BATCH)
            # Concurrently: one slow or dead receiver must not hold up every other's deliveries.
            list(self._pool.map(self.send, due))
            if len(due) < BATCH or self._stop.is_set():
                return

    def send(self, d: dict) -> None:
        body = json.dumps(payload(d), separators=(",", ":")).encode()
        headers = {"Content-Type": "application/json", "Raylane-Delivery": str(d["id"]), "Raylane-Event": event_type(d),
                   "Raylane-Signature": signature(d["secret"], int(time.time()), body)}
        code, error = None, self._refused(d["url"])
        if error is None:
            try:
                r = self.http.post(d["url"], content=body, headers=headers)
                code = r.status_code
                if not 200 <= code < 300:
                    # Not its body: whoever reads the delivery log must not read a service through it.
                    error = f"answered {code}"
            except httpx.HTTPError as e:
                error = f"{type(e).__name__}"
        tries = d["attempts"] + 1
        retry_in = None if tries >= self.settings.webhook_max_attempts else timedelta(seconds=backoff(tries))
        with db.transaction(self.sessions) as s:
            kept = store.sent(s, d["id"], owner=self.owner, now=utcnow(), status_code=code, error=error,
                              retry_in=retry_in)
        if error:
            log.info("webhook %s delivery %s (try %d): %s%s", d["hook_id"], d["id"], tries, error,
                     "" if retry_in is not None else "; gave up")
        if not kept:
            with db.transaction(self.sessions) as s:
                gone = not store.exists(s, d["id"])
            if gone:  # its hook or schedule was deleted meanwhile
                log.info("webhook delivery %s was deleted while it was being sent", d["id"])
            else:
                log.warning("webhook delivery %s: lease lost while sending; another replica may send it again", d["id"])
