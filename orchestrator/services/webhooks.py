"""Webhooks as the API sees them: a project's subscriptions to its jobs' status
changes and its schedules' handled ticks (docs/webhooks.md).

Rules: members and admins manage the hooks of projects they see (the API's
``CallerDep``); a hook's URL is http or https, names a host that
``RAYLANE_WEBHOOK_ALLOWED_HOSTS`` allows and that resolves to public addresses
only (unless ``RAYLANE_WEBHOOK_ALLOW_PRIVATE``; the notifier checks again at
each send), and never Ray's dashboard (the control plane holds Ray's token; it
must not be turned into a client of Ray, or of the cloud's metadata service, by
a member's URL). The secret that signs deliveries is shown once; listings show
a URL's scheme and host, not its path (often a credential).
"""

from __future__ import annotations

import fnmatch
import secrets
from urllib.parse import urlsplit

from raylane.orchestrator.domain.errors import Invalid, NotFound
from raylane.orchestrator.netaddr import resolve
from raylane.orchestrator.domain.views import NewWebhook, Webhook, WebhookCreate, WebhookDelivery
from raylane.orchestrator.settings import Settings
from raylane.orchestrator.store import db, webhooks as store
from raylane.orchestrator.store.transitions import utcnow

DELIVERY_LOG_LIMIT = 200


def redacted(url: str) -> str:
    """A URL as listed: scheme, host and port; its path and query may be a credential
    (a chat service's hook URL is), shown only to whoever created it."""
    parts = urlsplit(url)
    tail = "/\u2026" if (parts.path not in ("", "/") or parts.query) else parts.path
    return f"{parts.scheme}://{parts.netloc}{tail}"


def _view(row: dict) -> dict:
    return {**{k: v for k, v in row.items() if k != "secret"}, "url": redacted(row["url"]),
            "statuses": [s for s in row["statuses"].split(",") if s],
            "events": [e for e in (row.get("events") or "").split(",") if e]}


def _delivery(row: dict) -> WebhookDelivery:
    kind = store.SCHEDULE_EVENTS[row["tick_outcome"]] if row["schedule_id"] else "job.status"
    return WebhookDelivery(**{k: v for k, v in row.items() if k != "tick_outcome"}, type=kind)


def _port(parts) -> int | None:
    try:
        return parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError:
        return None


class Webhooks:
    def __init__(self, settings: Settings, sessions, dashboard_url=lambda: None):
        self.settings = settings
        self.sessions = sessions
        self.dashboard_url = dashboard_url  # Ray's dashboard, once attached

    def check_url(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise Invalid("must be an http:// or https:// URL with a host", field="url")
        if _port(parts) is None:
            raise Invalid("has an invalid port", field="url")
        if parts.username or parts.password:
            raise Invalid("must not carry credentials; the receiver checks the Raylane-Signature header instead",
                          field="url")
        host = parts.hostname.lower()
        if not any(fnmatch.fnmatchcase(host, p.lower()) for p in self.settings.webhook_allowed_hosts):
            raise Invalid(f"host {host} is not allowed by RAYLANE_WEBHOOK_ALLOWED_HOSTS", field="url")
        try:
            addresses = resolve(host, _port(parts))
        except OSError as e:
            raise Invalid(f"host {host} does not resolve: {e}", field="url") from None
        if not self.settings.webhook_allow_private:
            private = [a for a in addresses if not a.is_global]
            if private:
                raise Invalid(f"host {host} resolves to {private[0]}, not a public address (set "
                              f"RAYLANE_WEBHOOK_ALLOW_PRIVATE=true for receivers inside your network)", field="url")
        ray = self.dashboard_url()
        if ray:
            rp = urlsplit(ray)
            try:
                ray_addresses = resolve(rp.hostname or "", _port(rp))
            except OSError:
                ray_addresses = set()
            if _port(rp) == _port(parts) and (ray_addresses & addresses or (rp.hostname or "").lower() == host):
                raise Invalid("names Ray's dashboard; a webhook may not call Ray", field="url")

    def create(self, body: WebhookCreate, *, project: str, actor: str) -> NewWebhook:
        statuses = list(dict.fromkeys(s.value for s in body.statuses))
        if "PENDING" in statuses:
            raise Invalid("PENDING is not a change a hook can follow; a job is PENDING when it is submitted",
                          field="statuses")
        events = list(dict.fromkeys(body.events))
        if not statuses and not events:
            raise Invalid("a hook follows at least one job status or schedule event", field="statuses")
        self.check_url(body.url)
        secret = "whsec_" + secrets.token_urlsafe(32)
        with db.transaction(self.sessions) as s:
            row = store.create(s, hook_id="wh_" + secrets.token_hex(8), project=project, url=body.url, secret=secret,
                               statuses=statuses, events=events, description=body.description, actor=actor, now=utcnow())
        return NewWebhook(**{**_view(row), "url": body.url}, secret=secret)

    def list(self, *, project: str | None) -> list[Webhook]:
        with db.read(self.sessions) as s:
            return [Webhook(**_view(r)) for r in store.list_(s, project=project)]

    def get(self, hook_id: str, *, project: str | None) -> Webhook:
        with db.read(self.sessions) as s:
            row = store.get(s, hook_id, project=project)
        if row is None:
            raise NotFound(f"webhook {hook_id} not found")
        return Webhook(**_view(row))

    def delete(self, hook_id: str, *, project: str | None) -> None:
        with db.transaction(self.sessions) as s:
            if not store.delete_(s, hook_id, project=project):
                raise NotFound(f"webhook {hook_id} not found")

    def deliveries(self, hook_id: str, *, project: str | None, limit: int = DELIVERY_LOG_LIMIT) -> list[WebhookDelivery]:
        with db.read(self.sessions) as s:
            if store.get(s, hook_id, project=project) is None:
                raise NotFound(f"webhook {hook_id} not found")
            return [_delivery(r) for r in store.deliveries(s, hook_id, limit=limit)]
