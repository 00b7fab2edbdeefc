"""Ray's Jobs API and cluster state over the dashboard's REST API.

Plain HTTP (httpx) rather than ``JobSubmissionClient``: the same endpoints, but
with our own timeouts, one pooled connection, and no version probe per client.
With token auth on, every call carries ``Authorization: Bearer <token>``; the
token stays on the server side.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import httpx

from raylane.orchestrator.backends.base import (AlreadySubmitted, GcsUnavailable, PackageMissing, RayJob, RayNode,
                                                RayUnavailable, ResultUnavailable, view_of)
from raylane.orchestrator.backends.reachability import REACHABLE, Reachability
from raylane.orchestrator.domain import protocol
from raylane.orchestrator.domain.packages import ray_package_name
from raylane.orchestrator.domain.profile import MARKET_LABEL, NODE_GROUP_LABEL
from raylane.orchestrator.domain.routing import ClusterView

# The shapes and errors live in backends.base (the Protocol's module); named here too, where callers import them.
__all__ = ["AlreadySubmitted", "GcsUnavailable", "PackageMissing", "RayJob", "RayJobsBackend", "RayNode",
           "RayUnavailable", "ResultUnavailable", "read_token"]

log = logging.getLogger(__name__)

HTTP_TIMEOUT_S = 10.0  # one dashboard call; the loops retry on their next pass
PING_TIMEOUT_S = 2.0  # /readyz asking Ray itself: a load balancer's probe must not hang on a dead host
DRAINING_TTL_S = 1.0  # one GCS answer about draining nodes serves every caller this long
GCS_BACKOFF_S = 10.0  # after the GCS could not be asked
# Nodes come from the GCS only while the dashboard (what submits go to) was seen
# answering this recently; the next listing after that asks the dashboard itself.
DASHBOARD_CHECK_S = 5.0
# How long a result the GCS cannot give is asked for again before the attempt is
# recorded without it: a GCS that stays unreachable must not hold a finished job.
RESULT_PATIENCE_S = 60.0
# A raylet's command line names its GCS: how a control plane given only the
# dashboard's URL finds the GCS (the head's own processes say where it is).
GCS_ADDRESS_FLAG = re.compile(r"--gcs-address=([^\s\"']+)")
# A package PUT to Ray may take longer than one call's timeout: at least this
# rate (a slow link to the head) before it counts as unreachable.
PACKAGE_UPLOAD_BYTES_PER_S = 1024 * 1024
RESULT_RETRY_S = 1.0  # between reads of one result while the GCS fails (the reconciler polls every 50 ms)
# Ray's own job id of a submission never changes once its driver started: kept for this
# many submissions, the least recently asked forgotten first (more than run at once).
RAY_JOB_IDS_KEPT = 4096


def read_token(explicit: str | None = None) -> str | None:
    if explicit:
        return explicit.strip()
    import os

    if os.environ.get("RAY_AUTH_TOKEN"):
        return os.environ["RAY_AUTH_TOKEN"].strip()
    for p in (os.environ.get("RAY_AUTH_TOKEN_PATH"), str(Path.home() / ".ray" / "auth_token")):
        if p and Path(p).exists():
            return Path(p).read_text().strip()
    return None


class RayJobsBackend:
    def __init__(self, dashboard_url: str, token: str | None = None, *, gcs=None):
        self.dashboard_url = dashboard_url.rstrip("/")
        self.gcs = gcs  # raylane.orchestrator.backends.ray_gcs.RayGcs: draining nodes, messages, results
        self._token = token
        self._gcs_search_after = 0.0  # no GCS address found in Ray's node list: look again after this
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=self.dashboard_url, headers=headers, timeout=HTTP_TIMEOUT_S)
        self._sdk = None  # Ray's JobSubmissionClient, only for uploading local directories
        self._labels: dict[str, dict[str, str]] = {}  # node id -> group/market labels seen while alive
        self._drained: set[str] = set()  # node ids seen draining (a killed node's death info forgets it)
        self._lock = threading.Lock()  # guards _labels, _drained, _draining_cache and _ray_job_ids
        self._ray_job_ids: OrderedDict[str, str] = OrderedDict()  # submission id -> Ray's job id, once known
        self._decoded: dict[str, tuple[bytes, RayJob]] = {}  # the last get_many's records, raw and decoded
        self._draining_cache: tuple[float, set[str]] = (0.0, set())  # (valid until, draining node ids)
        self._gcs_nodes_after = 0.0  # listing nodes through the GCS failed: not before this (monotonic)
        # group -> its live, undrained nodes as (node id, CPUs), from the last cluster_view
        # (the dispatcher's, every pass): where the warm lanes put a host each.
        self._group_nodes: dict[str, list[tuple[str, float]]] | None = None  # None: never listed
        self._group_draining: dict[str, list[str]] = {}  # group -> its draining nodes, same listing
        self.draining_ttl_s = DRAINING_TTL_S
        # submission id -> (first, last) failed read of its result, while the GCS cannot be asked
        self._result_failing: dict[str, tuple[float, float]] = {}
        self.result_patience_s = RESULT_PATIENCE_S
        # Outages of the dashboard: a failed connection begins one, a node listing that worked ends it.
        self.reachability = Reachability(self.dashboard_url)

    def close(self) -> None:
        self.http.close()
        if self.gcs is not None:
            self.gcs.close()

    def _req(self, method: str, path: str, **kw) -> httpx.Response:
        try:
            return self.http.request(method, path, **kw)
        except httpx.HTTPError as e:
            err = RayUnavailable(f"Ray dashboard at {self.dashboard_url} unreachable: {type(e).__name__}: {e}")
            self.reachability.down(err)
            raise err from e

    def ping(self) -> bool:
        """Ask Ray now whether it answers (``/api/version``, short timeout); the answer
        is recorded in ``reachability``."""
        try:
            r = self._req("GET", "/api/version", timeout=PING_TIMEOUT_S)
        except RayUnavailable:
            return False
        if r.status_code != 200:
            self.reachability.down(f"Ray dashboard at {self.dashboard_url} answered {r.status_code}")
            return False
        self.reachability.up()
        return True

    # Jobs ------------------------------------------------------------------

    def submit(self, *, submission_id: str, entrypoint: str, runtime_env: dict[str, Any] | None,
               metadata: dict[str, str], entrypoint_num_cpus: float | None = None,
               entrypoint_num_gpus: float | None = None, entrypoint_resources: dict[str, float] | None = None,
               entrypoint_label_selector: dict[str, str] | None = None) -> None:
        runtime_env = self._upload_local_packages(runtime_env)
        body: dict[str, Any] = {"entrypoint": entrypoint, "submission_id": submission_id, "metadata": metadata,
                                "runtime_env": runtime_env or None}
        if entrypoint_num_cpus is not None:
            body["entrypoint_num_cpus"] = entrypoint_num_cpus
        if entrypoint_num_gpus:
            body["entrypoint_num_gpus"] = entrypoint_num_gpus
        if entrypoint_resources:
            body["entrypoint_resources"] = entrypoint_resources
        if entrypoint_label_selector:
            body["entrypoint_label_selector"] = entrypoint_label_selector
        r = self._req("POST", "/api/jobs/", json=body)
        if r.status_code == 200:
            return
        if "already exists" in r.text:
            raise AlreadySubmitted(submission_id)
        if r.status_code >= 500 and r.status_code != 500:
            raise RayUnavailable(f"Ray Jobs API answered {r.status_code}")
        raise RuntimeError(f"Ray refused the submission ({r.status_code}): {r.text[-2000:]}")

    def _upload_local_packages(self, runtime_env: dict[str, Any] | None) -> dict[str, Any] | None:
        """A local working_dir / py_modules is zipped and uploaded to the cluster
        (content-addressed, so a second job with the same directory uploads nothing),
        exactly as ``ray job submit --working-dir`` does."""
        if not runtime_env:
            return runtime_env
        wd = runtime_env.get("working_dir")
        mods = runtime_env.get("py_modules") or []
        local = (wd and "://" not in wd) or any("://" not in m for m in mods)
        if not local:
            return runtime_env
        if self._sdk is None:
            from ray.job_submission import JobSubmissionClient

            self._sdk = JobSubmissionClient(self.dashboard_url, headers=dict(self.http.headers))
        env = dict(runtime_env)
        try:
            self._sdk._upload_working_dir_if_needed(env)
            self._sdk._upload_py_modules_if_needed(env)
        except (ValueError, OSError) as e:
            raise RuntimeError(f"runtime_env: could not package a local directory: {e}") from e
        return env

    def ensure_package(self, sha256: str, load) -> str:
        """The Ray URI of an uploaded package (``domain.packages``), handing its
        bytes to Ray's package store first if Ray has not got them: the same
        ``GET``/``PUT /api/packages/gcs/<name>`` that ``ray job submit
        --working-dir`` uses, so a package goes to Ray once per cluster, not once
        per job. ``load()`` gives the bytes, or None if the package is gone.

        Raises:
            RayUnavailable: the dashboard could not be reached.
            PackageMissing: Ray has not got it and ``load`` has nothing.
        """
        name = ray_package_name(sha256)
        path = f"/api/packages/gcs/{name}"
        r = self._req("GET", path)
        if r.status_code == 404:
            data = load()
            if data is None:
                raise PackageMissing(f"package {sha256} is no longer stored; upload it again and resubmit")
            r = self._req("PUT", path, content=data, timeout=max(HTTP_TIMEOUT_S, len(data) / PACKAGE_UPLOAD_BYTES_PER_S))
        if r.status_code != 200:
            # As for a submit: a 500 is Ray's own refusal (its traceback), a 502-504 a proxy's "not now".
            if r.status_code > 500:
                raise RayUnavailable(f"Ray's package store answered {r.status_code} for {name}")
            raise RuntimeError(f"Ray refused package {name} ({r.status_code}): {r.text[-2000:]}")
        return f"gcs://{name}"

    def get(self, submission_id: str) -> RayJob | None:
        r = self._req("GET", f"/api/jobs/{submission_id}")
        if r.status_code == 404:
            return None
        if r.status_code != 200:
            raise RayUnavailable(f"Ray Jobs API answered {r.status_code} for {submission_id}")
        rj = RayJob.from_json(r.json())
        if rj.ray_job_id:
            self._keep_ray_job_id(submission_id, rj.ray_job_id)
        return rj

    def _keep_ray_job_id(self, submission_id: str, ray_job_id: str) -> None:
        with self._lock:
            self._ray_job_ids[submission_id] = ray_job_id
            self._ray_job_ids.move_to_end(submission_id)
            while len(self._ray_job_ids) > RAY_JOB_IDS_KEPT:
                self._ray_job_ids.popitem(last=False)

    def ray_job_id(self, submission_id: str) -> str | None:
        """Ray's own job id (hex) of a submission once its driver started, or None:
        asked of the Jobs API until known, then kept (``RAY_JOB_IDS_KEPT``), as it
        never changes. The reconciler needs it only while a node drains, every pass."""
        with self._lock:
            known = self._ray_job_ids.get(submission_id)
            if known is not None:
                self._ray_job_ids.move_to_end(submission_id)
                return known
        rj = self.get(submission_id)
        return rj.ray_job_id if rj is not None else None

    def get_many(self, submission_ids: list[str]) -> dict[str, RayJob | None]:
        """Each job as ``get`` sees it but for ``ray_job_id`` (only if already known
        here: ask ``ray_job_id`` for it), read in one call to Ray's GCS; through the
        Jobs API without one."""
        gcs = self.find_gcs()
        if gcs is None:
            if len(submission_ids) > 16:  # one list beats many gets
                by_id = {j.submission_id: j for j in self.list()}
                return {sid: by_id.get(sid) for sid in submission_ids}
            return {sid: self.get(sid) for sid in submission_ids}
        try:
            records = gcs.job_records(submission_ids)
        except GcsUnavailable as e:
            raise RayUnavailable(str(e)) from e
        with self._lock:
            known = {sid: self._ray_job_ids.get(sid) for sid in submission_ids}
        # A record decoded on the last call and unchanged since is not decoded again: a
        # pass over 60 running attempts every 20 ms decoded 3,000 JSON records a second
        # to find the few that changed. What is kept is the asked ids' only.
        last, self._decoded = self._decoded, {}
        out: dict[str, RayJob | None] = {}
        for sid in submission_ids:
            raw = records.get(sid)
            if raw is None:
                out[sid] = None
                continue
            seen = last.get(sid)
            if seen is not None and seen[0] == raw and seen[1].ray_job_id == known[sid]:
                rj = seen[1]
            else:
                rj = RayJob.from_json({**json.loads(raw), "submission_id": sid, "job_id": known[sid]})
            out[sid] = rj
            self._decoded[sid] = (raw, rj)
        return out

    def list(self) -> list[RayJob]:
        r = self._req("GET", "/api/jobs/")
        if r.status_code != 200:
            raise RayUnavailable(f"Ray Jobs API answered {r.status_code}")
        return [RayJob.from_json(d) for d in r.json() if d.get("submission_id")]

    def stop(self, submission_id: str) -> bool:
        r = self._req("POST", f"/api/jobs/{submission_id}/stop")
        if r.status_code == 404:
            return False
        return r.status_code == 200 and bool(r.json().get("stopped"))

    def logs(self, submission_id: str) -> str | None:
        r = self._req("GET", f"/api/jobs/{submission_id}/logs")
        if r.status_code == 404:
            return None
        if r.status_code != 200:
            raise RayUnavailable(f"Ray Jobs API answered {r.status_code} for logs of {submission_id}")
        return r.json().get("logs", "")

    def result(self, submission_id: str) -> dict[str, Any] | None:
        """The result the attempt's runner left in Ray's key-value store
        (``raylane.orchestrator.domain.protocol.result_key``); None if it left none.

        While the GCS cannot be asked (unreachable, or its address neither
        configured nor found by ``gcs_address_from_nodes``) this raises
        ``ResultUnavailable``, asking again at most every ``RESULT_RETRY_S``, for
        ``result_patience_s`` after the first failed read of this attempt's
        result; after that, None, with an error logged: the attempt is recorded
        without its result rather than held."""
        now = time.monotonic()
        with self._lock:
            since, tried = self._result_failing.get(submission_id, (now, None))
        if tried is not None and now - tried < RESULT_RETRY_S:
            raise ResultUnavailable(f"result of {submission_id}: the GCS is asked again shortly")
        try:
            gcs = self.find_gcs()
            if gcs is None:
                raise GcsUnavailable("no GCS address: RAYLANE_RAY_ADDRESS is unset and Ray's node list "
                                     "does not show the head node's")
            result = gcs.result(submission_id)
        except GcsUnavailable as e:
            with self._lock:
                self._result_failing[submission_id] = (since, now)
            if now - since >= self.result_patience_s:
                log.error("gave up reading the result of %s after %.0f s: %s", submission_id, now - since, e)
                return None
            log.warning("result of %s unreadable for now (giving up after %.0f s): %s", submission_id,
                        self.result_patience_s, e)
            raise ResultUnavailable(f"result of {submission_id} unreadable for now: {e}") from e
        except ValueError as e:  # not JSON: no runner of ours wrote it (the job's own code did); no result
            log.warning("the result of %s in Ray's store is not JSON (%s); the attempt is recorded without one",
                        submission_id, e)
            result = None
        with self._lock:
            self._result_failing.pop(submission_id, None)
        return result

    def put_inputs(self, submission_id: str, env: dict[str, str]) -> str | None:
        """Leave an attempt's inputs in Ray's KV store; the key, or None where no
        GCS address is known (the inputs then ride on the driver's command line).
        ``RayUnavailable`` if the GCS is known but does not answer."""
        gcs = self.find_gcs()
        if gcs is None:
            return None
        try:
            gcs.put_inputs(submission_id, env)
        except GcsUnavailable as e:
            raise RayUnavailable(str(e)) from e
        return protocol.inputs_key(submission_id)

    def forget_result(self, submission_id: str) -> None:
        """The attempt's result is stored (or given up): Ray's copy goes. A copy
        that cannot be deleted now is left behind with a warning."""
        with self._lock:
            self._result_failing.pop(submission_id, None)
        self._forget(submission_id, "result")

    def live_trials(self, submission_id: str) -> list[dict] | None:
        """A running sweep's finished trials so far; None if none, or while the GCS cannot be asked."""
        gcs = self.find_gcs()
        if gcs is None:
            return None
        try:
            return gcs.trials(submission_id)
        except GcsUnavailable:
            return None

    def forget_trials(self, submission_id: str) -> None:
        self._forget(submission_id, "trials")

    def forget_inputs(self, submission_id: str) -> None:
        """The attempt ended: the inputs it was started with leave Ray's store."""
        self._forget(submission_id, "inputs")

    def _forget(self, submission_id: str, what: str) -> None:
        if self.gcs is None:
            return
        try:
            getattr(self.gcs, f"forget_{what}")(submission_id)
        except GcsUnavailable as e:
            log.warning("could not delete the %s of %s from Ray's store: %s", what, submission_id, e)

    def find_gcs(self):
        """The GCS client; without a configured address, one to the address in the
        head node's command line, looked for when first needed (and again at most
        every ``GCS_BACKOFF_S`` while Ray's node list does not show it)."""
        if self.gcs is not None or time.monotonic() < self._gcs_search_after:
            return self.gcs
        try:
            address = self.gcs_address_from_nodes()
        except RayUnavailable as e:
            log.debug("GCS address unknown: %s", e)  # the outage itself is said once, by reachability
            address = None
        if address is None:
            self._gcs_search_after = time.monotonic() + GCS_BACKOFF_S
            return None
        from raylane.orchestrator.backends.ray_gcs import RayGcs  # Ray's protobufs: only when used

        log.info("Ray's GCS is at %s (from the head node's command line)", address)
        self.gcs = RayGcs(address, self._token)
        return self.gcs

    def gcs_address_from_nodes(self) -> str | None:
        """The GCS address the head node's raylet was started with, from the
        process details in the dashboard's node list; None if not shown (yet)."""
        r = self._req("GET", "/nodes?view=summary")
        if r.status_code != 200:
            raise RayUnavailable(f"Ray dashboard answered {r.status_code} for nodes")
        for n in r.json()["data"]["summary"]:
            if not (n.get("raylet") or {}).get("isHeadNode"):
                continue
            m = GCS_ADDRESS_FLAG.search(" ".join(n.get("cmdline") or []))  # the raylet's
            if m:
                return m.group(1)
        return None

    # Cluster ---------------------------------------------------------------

    def version(self) -> dict[str, Any]:
        r = self._req("GET", "/api/version")
        r.raise_for_status()
        return r.json()

    def draining(self) -> set[str]:
        """Ids of alive nodes Ray is draining; empty without a GCS connection or when
        the GCS cannot be asked (the dashboard never shows a drain). One answer
        serves every caller for ``draining_ttl_s``; an unreachable GCS is asked
        again only after ``GCS_BACKOFF_S``, so a wrong address costs a warning, not
        a 5 s stall on every node listing."""
        if self.gcs is None:
            return set()
        now = time.monotonic()
        with self._lock:
            until, cached = self._draining_cache
            if now < until:
                return set(cached)
        try:
            draining, until = set(self.gcs.draining_nodes()), now + self.draining_ttl_s
        except GcsUnavailable as e:
            log.warning("draining nodes unknown (asking again in %.0f s): %s", GCS_BACKOFF_S, e)
            draining, until = set(), now + GCS_BACKOFF_S
        with self._lock:
            self._draining_cache = (until, draining)
            self._drained |= draining
        return set(draining)

    def actor_jobs_on(self, node_id: str) -> set[str]:
        """Ray job ids (hex) with alive actors on a node (Ray's state API)."""
        r = self._req("GET", "/api/v0/actors", params=[
            ("filter_keys", "node_id"), ("filter_predicates", "="), ("filter_values", node_id),
            ("filter_keys", "state"), ("filter_predicates", "="), ("filter_values", "ALIVE"),
            ("limit", "10000"), ("detail", "false")])
        if r.status_code != 200:
            raise RayUnavailable(f"Ray state API answered {r.status_code} for actors on {node_id}")
        return {a["job_id"] for a in r.json()["data"]["result"]["result"] if a.get("job_id")}

    def nodes(self, draining: set[str] | None = None) -> list[RayNode]:
        """Ray's nodes, alive and dead. ``draining``: the draining node ids if the
        caller has just asked the GCS (saves asking it again)."""
        return self._nodes(draining)[0]

    def _nodes(self, draining: set[str] | None = None) -> tuple[list[RayNode], bool]:
        """The nodes, and whether they came from the GCS.

        While Ray is reachable they come from the GCS, drains included, in one call
        (``RayGcs.all_nodes``): the dispatcher lists nodes every pass, and the
        dashboard's list took 4-25 ms of a job's submit-to-admission on a busy head
        against ~1-2 ms. From the dashboard otherwise: without a GCS address, for
        ``GCS_BACKOFF_S`` after the GCS failed to list them, during an outage (whose
        end is the dashboard, what submits go to, answering again: a GCS that
        answers while the dashboard does not must not end it on every pass), and
        once ``DASHBOARD_CHECK_S`` passed since the dashboard was last seen
        answering, so that a dashboard that died while the GCS lives is noticed
        by the next listing, as before."""
        gcs = self.gcs
        now = time.monotonic()
        state = self.reachability.now()
        if gcs is not None and state.state == REACHABLE and now - (state.checked_at or 0.0) < DASHBOARD_CHECK_S \
                and now >= self._gcs_nodes_after:
            try:
                raylets, drains = gcs.all_nodes()
            except Exception as e:  # GcsUnavailable, or an answer this Ray cannot read
                log.warning("listing Ray's nodes through its GCS failed (the dashboard's list is used for %.0f s): "
                            "%s: %s", GCS_BACKOFF_S, type(e).__name__, e)
                with self._lock:
                    self._gcs_nodes_after = now + GCS_BACKOFF_S
                    self._draining_cache = (now + GCS_BACKOFF_S, set())  # not asked again at once below
            else:
                with self._lock:
                    self._draining_cache = (now + self.draining_ttl_s, set(drains))
                    self._drained |= drains
                    return self._parse_nodes([{"raylet": r} for r in raylets], {r["nodeId"] for r in raylets},
                                             drains if draining is None else draining), True
        r = self._req("GET", "/nodes?view=summary")
        if r.status_code != 200:
            raise RayUnavailable(f"Ray dashboard answered {r.status_code} for nodes")
        if draining is None:
            draining = self.draining()
        summary = r.json()["data"]["summary"]
        # What is remembered of nodes lives as long as Ray lists them (it keeps a
        # bounded number of dead ones). The dispatcher, the reconciler and API
        # requests list nodes from their own threads.
        listed = {(n.get("raylet") or {}).get("nodeId") for n in summary}
        with self._lock:
            return self._parse_nodes(summary, listed, draining), False

    def _parse_nodes(self, summary: list[dict], listed: set[str], draining: set[str]) -> list[RayNode]:
        self._drained = (self._drained | draining) & listed
        self._labels = {k: v for k, v in self._labels.items() if k in listed}
        out = []
        for n in summary:
            rl = n.get("raylet", {})
            death = rl.get("deathInfo") or {}
            labels = dict(rl.get("labels") or {})
            nid = rl.get("nodeId")
            # Ray's list drops a dead node's labels; remember them while it is alive,
            # so a dead node can still be told spot (preempted) from on-demand.
            if labels.get(NODE_GROUP_LABEL):
                self._labels[nid] = {k: labels[k] for k in (NODE_GROUP_LABEL, MARKET_LABEL) if k in labels}
            elif nid in self._labels:
                labels.update(self._labels[nid])
            out.append(RayNode(
                node_id=nid, state=rl.get("state", "DEAD"), labels=labels,
                resources_total=rl.get("resourcesTotal") or {}, is_head=bool(rl.get("isHeadNode")),
                death_reason=death.get("reason"), death_message=death.get("reasonMessage"),
                draining=nid in draining, drained=nid in self._drained,
                resources_available=rl.get("resourcesAvailable"),  # the GCS's list only
            ))
        return out

    def cluster_view(self) -> ClusterView:
        nodes, via_gcs = self._nodes()
        if not via_gcs:  # the dashboard answered: the dispatcher lists every pass, how an outage is seen to end
            self.reachability.up()
        view, live, draining = view_of(nodes)
        with self._lock:
            self._group_nodes = live
            self._group_draining = draining
        return view

    def group_nodes(self, group: str) -> tuple[list[tuple[str, float]], list[str]]:
        """The group's live, undrained worker nodes as (node id, CPUs), and its
        draining nodes' ids, as the last ``cluster_view`` saw them (the dispatcher
        lists every pass); listed now if none has been yet (a control plane's first
        reconcile runs before its first dispatch)."""
        with self._lock:
            listed = self._group_nodes is not None
        if not listed:
            self.cluster_view()
        with self._lock:
            return list((self._group_nodes or {}).get(group, ())), list(self._group_draining.get(group, ()))
