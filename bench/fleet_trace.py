"""A seeded, compressed day of mixed work replayed on the local hybrid fleet
under three policies, in one run (issue 45):

- ``owned``: the owned cluster alone (``onprem``), as Raylane ran before fleets;
- ``rented``: the rented cluster alone (``cloud``, scaling from zero);
- ``hybrid``: both, behind one queue, placed by Raylane's fleet placer.

    python bench/fleet_trace.py [--seed 45] [--quick]

Words used here:

- *trace*: the day's jobs (``trace()``), the same for every policy: training
  (2 workers x 1 GPU co-located, or 1 x 1 GPU; hours long), sweeps (CPU
  trials), batch inference (on 1 GPU or 2 CPUs), small commands; arriving as a
  Poisson process whose rate has a night floor, a morning peak (10:00) and an
  afternoon one (15:00); priorities high / normal / low (80 / 50 / 20).
- *virtual time*: the day's clock. A tick is ``TICK_S`` virtual seconds.
- *the fleet*: bench/fleets/trace-hybrid.yaml (the shipped local-hybrid
  shapes, with prices whose sources that file gives); a policy's fleet is that
  file with only its clusters.

How it replays. Everything of Raylane is real: ``ControlPlane.submit``, the
fleet placer, each cluster's dispatcher (admission, scale-ahead) and reconciler
(classifying failures, retries), on a real SQLite database in a temp directory,
attached with ``services.fleetdispatch.attach_fleet`` even for a one-cluster
policy (one code path for the three). The clusters are in memory
(``orchestrator.testing.FakeRay``), each driven by a ``SimCluster``: a
submitted attempt starts when a node of its group has room for its placement's
``total`` (Ray's own queue), runs until the job's progress reaches its trace
duration, and succeeds; a scaling
group with attempts that do not fit boots nodes (``SCALE_UP_S`` later they are
alive, up to ``max_nodes``), and removes a node idle for ``IDLE_S``; spot nodes
are reclaimed at a seeded rate (``SPOT_RECLAIM_PER_H``): their attempts fail
as Ray reports a dead node, and Raylane classifies and retries them. A job
runs on one node (every job of the trace fits one node of its group); the
attempt's driver is not counted apart from its ``total``. Each node's free
CPUs and GPUs are what the cluster tells Raylane it has free, as Ray's GCS does
(memory is not modelled: all of it free).

Checkpoints, as Raylane's runners keep them (``kinds.KINDS``' ``checkpoints``:
training and sweeps, into the job's storage, which every cluster of the fleet
reaches): such a job checkpoints every ``CKPT_S`` of progress, saves one
``SAVE_S`` after Raylane asks (a preemption, a draining node) and says so, as
``raylane.jobs.base.checkpoint_saved`` does; an attempt that ends before the
job is done (a spot reclaim, a preemption, a lost cluster) loses the progress
since the last checkpoint, and the next one, on any cluster, resumes from it
after ``RESTART_S``. Batch inference and commands start over. Both losses are
reported as GPU-hours lost.

Why a driver loop on a virtual clock, not the loops' threads on wall time: a
compressed day makes one wall second many virtual minutes, so every deadline
the loops read from ``utcnow`` (the scale-up deadline, leases, when a job was
created or started) would be off by the compression, and thread timing would
change the figures from run to run. So each tick the bench sets the virtual
clock (``store.transitions.utcnow``, patched where it was imported), moves the
clusters (``SimCluster.advance``, ``schedule``), turns the placer and every
dispatcher once, lets Ray start what they submitted (``schedule`` again), then
turns every reconciler. Arrivals are submitted at their own virtual second.
The figures are then a function of the seed alone (the same seed gives the
same JSON), and wall time only decides how long the run takes: about a minute
for the three policies on 2 shared cores (``--quick``: seconds). The
placer's one-second cache of a cluster's node list (``VIEW_CACHE_S``) is a wall
bound; here it would hide a whole tick's changes, so the bench sets it to 0.
Jobs give no ``timeout_s``: whether the owned cluster starts a job soon enough
is judged from past runs of each kind there, the jobs queued ahead of it
included (docs/fleet.md), within the settings' wait budget
(``RAYLANE_FLEET_OWNED_SOON_S``, ``RAYLANE_FLEET_OWNED_WAIT_SHARE``: their
defaults, or what the environment sets, to replay another budget).

Figures, per policy: owned GPU utilisation over the day and over the ticks in
which a GPU job waited (arrived, not started anywhere); rented GPU node-hours
and cost (every node-hour a rented node was booting or alive, at its group's
price, plus the rented head); total cost (the owned cluster's fixed cost for
the 24 hours, when the policy has it, plus rented); wait from arrival to the
first start in Ray, p50 / p95 by priority, in virtual minutes; jobs retried
(more than one attempt) and finished. The day runs on past 24 h until every
job ends (at most ``DRAIN_S`` more), so late jobs' waits count too; a job
still not started then counts its wait until the end (a lower bound).

The last line printed is one JSON object keyed ``owned``, ``rented``,
``hybrid`` and ``goals`` (issue 45: the hybrid's total cost at most 0.8x
rented-only, its p95 wait at most 0.5x owned-only, owned GPUs at least 70%
used while work waits).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

FLEET_FILE = ROOT / "bench" / "fleets" / "trace-hybrid.yaml"
POLICIES = {"owned": ["onprem"], "rented": ["cloud"], "hybrid": ["onprem", "cloud"]}
PRIORITIES = {"high": 80, "normal": 50, "low": 20}
DAY_S = 24 * 3600
TICK_S = 60  # one pass of every loop per virtual minute: a wait is known to the minute
QUICK_TICK_S = 240
DRAIN_S = 12 * 3600  # after the day, at most this long for the queue to empty (then the rest is reported unfinished)
SCALE_UP_S = 150  # a cloud node asked for is alive this long after (a GPU VM's boot and Ray's join: 2-3 min)
IDLE_S = 600  # a cloud node with nothing on it for this long is removed (Ray's autoscaler's idle_timeout_minutes)
SPOT_RECLAIM_PER_H = 0.05  # a spot node's chance of being reclaimed in an hour (about one in 20 node-hours)
CKPT_S = 600  # a checkpointing job (training, sweep) saves a checkpoint every 10 min of progress
SAVE_S = 10  # ... and one this long after Raylane asks for it
RESTART_S = 60  # a resumed attempt loads its checkpoint this long before it progresses again
START = datetime(2026, 1, 5, tzinfo=timezone.utc)  # a Monday, 00:00 UTC: the day's clock starts here

# Jobs a day by class (before --quick's share), and how each is drawn.
DAILY = {"training": 14, "sweep": 10, "batch": 20, "command": 60}
BURSTS = [(10.0, 1.2, 1.0), (15.0, 1.5, 0.8)]  # (hour of the peak, its spread in hours, its weight)
NIGHT = 0.08  # the rate's floor, as a share of the morning peak's


@dataclass
class TraceJob:
    """One job of the day: when it arrives (virtual seconds), how long it runs, its spec."""

    at_s: int
    cls: str  # training, sweep, batch, command
    priority: str  # high, normal, low
    duration_s: int
    gpus: int
    spec: dict


def rate(hour: float) -> float:
    """The arrival rate's shape over the day (its peak is 1 + the floor)."""
    return NIGHT + sum(w * math.exp(-0.5 * ((hour - h) / s) ** 2) for h, s, w in BURSTS)


def arrivals(rng: random.Random, per_day: float, day_s: int) -> list[int]:
    """A Poisson process of ``per_day`` arrivals a day on average, shaped by ``rate``
    (thinning: candidates at the peak rate, each kept with rate(t) / peak)."""
    peak = max(rate(h / 10) for h in range(240))
    mean = sum(rate(h / 10) for h in range(240)) / 240
    lam = per_day / day_s * peak / mean
    out, t = [], 0.0
    while True:
        t += rng.expovariate(lam)
        if t >= day_s:
            return out
        if rng.random() < rate(t / day_s * 24) / peak:
            out.append(int(t))


def _lognormal_s(rng: random.Random, median_min: float, lo_min: float, hi_min: float) -> int:
    return int(60 * min(hi_min, max(lo_min, rng.lognormvariate(math.log(median_min), 0.6))))


def _priority(rng: random.Random, high: float, normal: float) -> str:
    x = rng.random()
    return "high" if x < high else "normal" if x < high + normal else "low"


def trace(seed: int, *, share: float = 1.0, day_s: int = DAY_S) -> list[TraceJob]:
    """The day's jobs, in arrival order; the same for the same seed. ``share``: a
    fraction of each class's jobs (``--quick``)."""
    rng = random.Random(seed)
    jobs: list[TraceJob] = []
    for cls, per_day in DAILY.items():
        for i, at in enumerate(arrivals(rng, per_day * share, day_s)):
            name = f"{cls}-{len(jobs)}"
            if cls == "training":
                workers = 2 if rng.random() < 0.75 else 1
                spec = {"name": name, "kind": "training", "entrypoint": "examples.train:main",
                        "resources": {"num_workers": workers, "gpus_per_worker": 1, "cpus_per_worker": 1},
                        "placement": {"node_group": "auto", "colocate": True}}
                jobs.append(TraceJob(at, cls, _priority(rng, 0.3, 0.5), _lognormal_s(rng, 120, 30, 360), workers, spec))
            elif cls == "sweep":
                trials = rng.choice([2, 3])  # with the driver, on one 4-CPU node (the sim places a job on one node)
                spec = {"name": name, "kind": "sweep", "entrypoint": "examples.sweep:objective",
                        "resources": {"cpus_per_worker": 1},
                        "sweep": {"metric": "loss", "mode": "min", "num_samples": 4 * trials,
                                  "max_concurrent_trials": trials,
                                  "search_space": {"lr": {"loguniform": [1e-5, 1e-2]}}}}
                jobs.append(TraceJob(at, cls, _priority(rng, 0.2, 0.5), _lognormal_s(rng, 45, 15, 150), 0, spec))
            elif cls == "batch":
                gpu = rng.random() < 0.5
                resources = {"num_workers": 1, "gpus_per_worker": 1, "cpus_per_worker": 1} if gpu else \
                    {"num_workers": 2, "cpus_per_worker": 1}
                spec = {"name": name, "kind": "batch_inference", "entrypoint": "examples.predict:Linear",
                        "resources": resources,
                        "batch": {"input_uri": "/tmp/raylane-trace-input.parquet",
                                  "output_uri": f"/tmp/raylane-trace-output/{name}", "batch_size": 100}}
                jobs.append(TraceJob(at, cls, _priority(rng, 0.1, 0.4), _lognormal_s(rng, 25, 8, 90), int(gpu), spec))
            else:
                spec = {"name": name, "kind": "command", "entrypoint": "python -c 'print(1)'",
                        "resources": {"cpus_per_worker": rng.choice([0.5, 1.0])}}
                jobs.append(TraceJob(at, cls, _priority(rng, 0.4, 0.4), _lognormal_s(rng, 4, 1, 20), 0, spec))
    jobs.sort(key=lambda j: (j.at_s, j.spec["name"]))
    for j in jobs:
        j.spec["priority"] = PRIORITIES[j.priority]
    return jobs


# The clusters, moved by the bench ------------------------------------------------------


@dataclass
class _Progress:
    """How far a job got, across its attempts and clusters."""

    duration_s: int
    checkpoints: bool  # its kind checkpoints (and resumes from its last one)
    done: float = 0.0
    ckpt: float = 0.0
    attempt: str | None = None  # the submission id of its attempt that runs (or last ran)


@dataclass
class _Run:
    """An attempt running on a node."""

    node: str
    job_id: str
    restart_left: float
    asked_at: int | None = None  # when Raylane's checkpoint request was first seen
    saved: bool = False


@dataclass
class _Node:
    group: str
    price: float
    free: dict[str, float]
    since_s: int  # when it was asked for (billed from then: a VM bills from its boot)
    alive: bool = False
    idle_since_s: int = 0
    jobs: set[str] = field(default_factory=set)


class SimCluster:
    """One cluster's nodes and Ray's queue, around its ``FakeRay``: what Ray and its
    autoscaler would do with the attempts Raylane submits (docstring above)."""

    def __init__(self, cluster, ray, *, rng: random.Random, demand: dict[str, dict[str, float]],
                 progress: dict[str, _Progress], starts: dict[str, int]):
        self.cluster = cluster
        self.ray = ray
        self.rng = rng
        self.demand = demand  # job id -> what it holds on its node (its placement's total)
        self.progress = progress  # job id -> how far it got (shared by the clusters: its checkpoints are in storage)
        self.starts = starts  # job id -> the virtual second its first attempt started (shared by the clusters)
        self.scales = {g.name for g in cluster.profile.workers if g.max_nodes > g.min_nodes}
        self.groups = {g.name: g for g in cluster.profile.workers}
        self.nodes: dict[str, _Node] = {}
        self.booting: list[_Node] = []
        self.running: dict[str, _Run] = {}  # submission id -> where it runs, its restart, checkpoint request
        self.billed_s: dict[str, float] = {}  # group -> node-seconds asked for or alive
        self.reclaimed = 0
        self.lost_gpu_s = 0.0  # progress lost since a checkpoint, and restarts, x the job's GPUs
        for g in cluster.profile.workers:
            for nid in ray.node_ids(g.name):
                if g.name in self.scales:  # a rented group scales from zero: no node until a job asks
                    ray.kill_node(nid, reason="AUTOSCALER_SCALE_DOWN", message="scaled to zero")
                else:
                    self.nodes[nid] = _Node(g.name, 0.0, self._capacity(g), 0, alive=True)

    @staticmethod
    def _capacity(g) -> dict[str, float]:
        cap = {"CPU": float(g.cpus)}
        if g.accelerator:
            cap["GPU"] = float(g.accelerator.count)
        return cap

    def gpus_held(self) -> float:
        return sum(self._capacity(self.groups[n.group]).get("GPU", 0.0) - n.free.get("GPU", 0.0)
                   for n in self.nodes.values() if n.alive)

    def advance(self, now: int, dt: int) -> None:
        """``dt`` seconds went by: bill the nodes, move the running attempts on (their
        restart, progress, checkpoints), end what is done or was stopped, reclaim spot
        nodes, let booted nodes join."""
        ray = self.ray
        for node in [*self.booting, *(n for n in self.nodes.values() if n.alive)]:
            self.billed_s[node.group] = self.billed_s.get(node.group, 0.0) + dt
        for sid, run in list(self.running.items()):
            status = ray.jobs[sid].job.status
            if status == "RUNNING":
                status = self._run(sid, run, now, dt)
            if status != "RUNNING":  # done, or Raylane stopped it: it leaves its node
                self._release(sid, run.node, now)
        # Spot reclaims: the node dies, and with it its attempts (Ray says so on the next read).
        for nid, node in list(self.nodes.items()):
            if node.alive and self.groups[node.group].market == "SPOT" and node.group in self.scales \
                    and self.rng.random() < SPOT_RECLAIM_PER_H * dt / 3600:
                self.reclaimed += 1
                ray.kill_node(nid, reason="NODE_TERMINATED", message="spot instance reclaimed by the cloud")
                for sid in list(node.jobs):
                    self._release(sid, nid, now)
                node.alive = False
        # Booted nodes join.
        for node in [n for n in self.booting if now >= n.since_s + SCALE_UP_S]:
            self.booting.remove(node)
            node.alive, node.idle_since_s = True, now
            self.nodes[ray.add_node(node.group)] = node

    def _run(self, sid: str, run: _Run, now: int, dt: int) -> str:
        """One running attempt's ``dt`` seconds: its restart, then progress, periodic
        checkpoints and one saved when Raylane asks; finished when the job is done."""
        from raylane.orchestrator.domain import protocol

        j, gpus = self.progress[run.job_id], self.demand[run.job_id].get("GPU", 0.0)
        step = min(dt, run.restart_left + j.duration_s - j.done)
        restart = min(run.restart_left, step)
        run.restart_left -= restart
        self.lost_gpu_s += restart * gpus
        j.done += step - restart
        if j.checkpoints:
            j.ckpt = max(j.ckpt, CKPT_S * math.floor(j.done / CKPT_S))
            gcs = self.ray.gcs
            if run.asked_at is None and gcs.checkpoint_request(sid):
                run.asked_at = now - dt  # asked at the last pass
            if run.asked_at is not None and not run.saved and now >= run.asked_at + SAVE_S:
                # Saved SAVE_S after the request: what it did since then is not in it.
                run.saved, j.ckpt = True, max(j.ckpt, j.done - (now - run.asked_at - SAVE_S))
                gcs.kv[protocol.checkpointed_key(sid)] = b"saved"
        if j.done >= j.duration_s - 1e-9:
            self.ray.finish(sid, result={"loss": 0.1})
            return "SUCCEEDED"
        return "RUNNING"

    def schedule(self, now: int) -> None:
        """Ray's queue and its autoscaler, now: start what fits, ask for nodes for
        what does not, remove the idle."""
        ray = self.ray
        # Ray's queue: each waiting attempt, in submit order, starts on the first node with room.
        waiting: dict[str, list[dict[str, float]]] = {}
        for sid in ray.running():
            j = ray.jobs[sid]
            if j.job.status != "PENDING":
                continue
            job_id = j.submission.metadata["raylane_job_id"]
            group, need = j.submission.metadata["raylane_node_group"], self.demand[job_id]  # the group it was placed on
            nid = next((nid for nid, n in self.nodes.items() if n.alive and n.group == group
                        and all(n.free.get(k, 0.0) >= v - 1e-9 for k, v in need.items())), None)
            if nid is None:
                waiting.setdefault(group, []).append(need)
                continue
            node = self.nodes[nid]
            for k, v in need.items():
                node.free[k] = node.free.get(k, 0.0) - v
            node.jobs.add(sid)
            ray.start(sid, node=nid)
            self.running[sid] = _Run(nid, job_id, RESTART_S if self.progress[job_id].ckpt > 0 else 0.0)
            self.progress[job_id].attempt = sid
            self.starts.setdefault(job_id, now)
        # The autoscaler: a node more for what waits beyond what is already booting, up to max_nodes.
        for group, needs in waiting.items():
            if group not in self.scales:
                continue
            g = self.groups[group]
            cap = self._capacity(g)
            key = "GPU" if "GPU" in cap else "CPU"
            want = math.ceil(sum(n.get(key, 0.0) for n in needs) / cap[key] - 1e-9)
            have = sum(1 for n in self.booting if n.group == group)
            alive = sum(1 for n in self.nodes.values() if n.alive and n.group == group)
            for _ in range(max(0, min(want - have, g.max_nodes - alive - have))):
                self.booting.append(_Node(group, g.price_per_hour, dict(cap), now))
        # Idle nodes go.
        for nid, node in self.nodes.items():
            if node.alive and node.group in self.scales and not node.jobs and now - node.idle_since_s >= IDLE_S:
                node.alive = False
                ray.kill_node(nid, reason="AUTOSCALER_SCALE_DOWN", message="idle")
        # What each node has free, as Ray's GCS tells Raylane (a co-located gang needs one node).
        for nid, node in self.nodes.items():
            if node.alive:
                ray.set_free(nid, {**node.free, "memory": self.groups[node.group].memory_gb * 2 ** 30})

    def _release(self, sid: str, nid: str, now: int) -> None:
        """Attempt ``sid`` left node ``nid``; unless the job is done, its progress since
        its last checkpoint is lost (all of it for a kind that does not checkpoint)."""
        run = self.running.pop(sid, None)
        if run is not None:
            j = self.progress[run.job_id]
            # An attempt given up on (its cluster lost) may end after the next one started elsewhere.
            if j.attempt == sid and j.done < j.duration_s - 1e-9:
                self.lost_gpu_s += (j.done - j.ckpt) * self.demand[run.job_id].get("GPU", 0.0)
                j.done = j.ckpt
        node = self.nodes[nid]
        if sid in node.jobs:
            node.jobs.discard(sid)
            job_id = self.ray.jobs[sid].submission.metadata["raylane_job_id"]
            for k, v in self.demand[job_id].items():
                node.free[k] = node.free.get(k, 0.0) + v
            if not node.jobs:
                node.idle_since_s = now

    def rented_cost(self) -> tuple[float, float, float]:
        """(GPU node-hours, GPU-hours, $) of this rented cluster's worker nodes."""
        node_h = sum(s for g, s in self.billed_s.items() if self.groups[g].accelerator) / 3600
        gpu_h = sum(s * self.groups[g].accelerator.count for g, s in self.billed_s.items()
                    if self.groups[g].accelerator) / 3600
        cost = sum(s / 3600 * self.groups[g].price_per_hour for g, s in self.billed_s.items())
        return node_h, gpu_h, cost


# One policy's day ----------------------------------------------------------------------


class VirtualClock:
    """``utcnow`` for the whole control plane: the day's virtual time."""

    def __init__(self):
        self.now = START

    def __call__(self) -> datetime:
        return self.now


def _patch_clock(clock: VirtualClock) -> None:
    """Every raylane module that imported ``utcnow`` reads the virtual clock (run each
    tick: a module imported lazily since is patched too)."""
    from raylane.orchestrator.store import transitions

    real = transitions.__dict__.setdefault("_bench_real_utcnow", transitions.utcnow)
    for name, mod in list(sys.modules.items()):
        if name.startswith("raylane.") and mod is not None and \
                (getattr(mod, "utcnow", None) is real or isinstance(getattr(mod, "utcnow", None), VirtualClock)):
            mod.utcnow = clock


def _unpatch_clock() -> None:
    from raylane.orchestrator.store import transitions

    real = transitions.__dict__.get("_bench_real_utcnow")
    for name, mod in list(sys.modules.items()):
        if name.startswith("raylane.") and isinstance(getattr(mod, "utcnow", None), VirtualClock):
            mod.utcnow = real


def percentile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return round(xs[lo] + (xs[hi] - xs[lo]) * (k - lo), 1)


def run_policy(policy: str, jobs: list[TraceJob], *, seed: int, tick_s: int, tmp: Path) -> dict:
    from raylane.orchestrator.domain.fleet import Fleet
    from raylane.orchestrator.domain.kinds import traits
    from raylane.orchestrator.domain.specs import JobSpec
    from raylane.orchestrator.services import fleetdispatch
    from raylane.orchestrator.services.controlplane import ControlPlane
    from raylane.orchestrator.settings import Settings
    from raylane.orchestrator.store import migrate
    from raylane.orchestrator.testing import FakeRay

    doc = yaml.safe_load(FLEET_FILE.read_text())
    doc = {**doc, "name": f"trace-{policy}", "clusters": [c for c in doc["clusters"] if c["name"] in POLICIES[policy]]}
    fleet_file = tmp / f"{policy}.yaml"
    fleet_file.write_text(yaml.safe_dump(doc))
    fleet = Fleet.load(fleet_file)
    url = f"sqlite:///{tmp / f'{policy}.db'}"
    migrate.upgrade(url)
    settings = Settings(database_url=url, data_dir=tmp, auto_migrate=False, loops_enabled=False,
                        admin_token="rl_bench-admin-token-0123456789", submit_rate_per_s=0, fast_lane=False,
                        fleet=str(fleet_file), gc_freeze=False)
    clock = VirtualClock()
    fleetdispatch.VIEW_CACHE_S = 0.0  # a wall second is many virtual minutes here (module docstring)
    plane = ControlPlane(settings)
    try:
        rays = {c.name: FakeRay(c.profile, name=c.name) for c in fleet.members}
        fd = fleetdispatch.attach_fleet(plane, fleet, rays, POLICIES[policy][0])
        demand: dict[str, dict[str, float]] = {}
        progress: dict[str, _Progress] = {}
        starts: dict[str, int] = {}
        sims = {c.name: SimCluster(c, rays[c.name], rng=random.Random(f"{seed}/{policy}/{c.name}"), demand=demand,
                                   progress=progress, starts=starts) for c in fleet.members}
        by_id: dict[str, TraceJob] = {}
        _patch_clock(clock)
        end_s = DAY_S + DRAIN_S
        pending = list(jobs)
        gpu_ticks = owned_gpu_held = wait_ticks = owned_gpu_held_waiting = 0.0
        owned = sims.get("onprem")
        owned_gpus = sum(SimCluster._capacity(g).get("GPU", 0.0) * g.max_nodes
                         for g in owned.cluster.profile.workers) if owned else 0.0
        t = 0
        while t < end_s:
            t_next = t + tick_s
            while pending and pending[0].at_s < t_next:  # this tick's arrivals, each at its own second
                tj = pending.pop(0)
                clock.now = START + timedelta(seconds=max(tj.at_s, t))
                job, _ = plane.submit(JobSpec.model_validate(tj.spec), project="default", actor="bench")
                by_id[job.id] = tj
                progress[job.id] = _Progress(tj.duration_s, traits(tj.spec["kind"]).checkpoints)
                demand[job.id] = dict(job.placement.total)  # the same on every group it may go to: same shapes
            t = t_next
            clock.now = START + timedelta(seconds=t)
            for sim in sims.values():
                sim.advance(t, tick_s)
                sim.schedule(t)
            _patch_clock(clock)
            fd.placer.run_once()
            for m in fd.members.values():
                m.dispatcher.run_once()
            for sim in sims.values():  # Ray starts what was just submitted (in seconds, not a tick later)
                sim.schedule(t)
            for m in fd.members.values():
                m.reconciler.run_once()
            if t <= DAY_S and owned is not None:
                held = owned.gpus_held()
                gpu_ticks += 1
                owned_gpu_held += held
                if any(tj.gpus and jid not in starts for jid, tj in by_id.items()):
                    wait_ticks += 1
                    owned_gpu_held_waiting += held
            if not pending and t >= DAY_S and _all_ended(plane):
                break
        return _figures(policy, plane, fleet, sims, by_id, starts, owned_gpus=owned_gpus, gpu_ticks=gpu_ticks,
                        owned_gpu_held=owned_gpu_held, wait_ticks=wait_ticks,
                        owned_gpu_held_waiting=owned_gpu_held_waiting, ended_s=t)
    finally:
        _unpatch_clock()
        plane.close()


def _all_ended(plane) -> bool:
    from sqlalchemy import func, select

    from raylane.orchestrator.domain.states import TERMINAL
    from raylane.orchestrator.store import db
    from raylane.orchestrator.store.tables import jobs as jobs_t

    with db.read(plane.sessions) as s:
        left = s.execute(select(func.count()).select_from(jobs_t)
                         .where(jobs_t.c.status.not_in([x.value for x in TERMINAL]))).scalar()
    return left == 0


def _figures(policy, plane, fleet, sims, by_id, starts, *, owned_gpus, gpu_ticks, owned_gpu_held, wait_ticks,
             owned_gpu_held_waiting, ended_s) -> dict:
    from sqlalchemy import select

    from raylane.orchestrator.store import db
    from raylane.orchestrator.store.tables import jobs as jobs_t

    with db.read(plane.sessions) as s:
        rows = {r.id: r for r in s.execute(select(jobs_t.c.id, jobs_t.c.status, jobs_t.c.attempts))}
    waits: dict[str, list[float]] = {p: [] for p in PRIORITIES}
    for jid, tj in by_id.items():  # a job never started counts its wait until the run ended (a lower bound)
        waits[tj.priority].append((starts.get(jid, ended_s) - tj.at_s) / 60)
    everyone = [w for ws in waits.values() for w in ws]
    rented_node_h = rented_gpu_h = rented_cost = 0.0
    for c in fleet.members:
        if not c.owned:
            nh, gh, cost = sims[c.name].rented_cost()
            rented_node_h += nh
            rented_gpu_h += gh
            rented_cost += cost + (ended_s / 3600) * sum(g.price_per_hour for g in c.profile.groups
                                                         if g.role == "head")
    fixed = sum(c.fixed_per_hour for c in fleet.members if c.owned) * DAY_S / 3600
    statuses: dict[str, int] = {}
    for r in rows.values():
        statuses[r.status] = statuses.get(r.status, 0) + 1
    return {
        "jobs": len(by_id),
        "finished": statuses.get("SUCCEEDED", 0),
        "statuses": statuses,
        "retried": sum(1 for r in rows.values() if (r.attempts or 0) > 1),
        "spot_reclaims": sum(s.reclaimed for s in sims.values()),
        "gpu_hours_lost": round(sum(s.lost_gpu_s for s in sims.values()) / 3600, 2),
        "owned_gpu_util": round(owned_gpu_held / (gpu_ticks * owned_gpus), 3) if owned_gpus and gpu_ticks else None,
        "owned_gpu_util_while_waiting": (round(owned_gpu_held_waiting / (wait_ticks * owned_gpus), 3)
                                         if owned_gpus and wait_ticks else None),
        "gpu_wait_share_of_day": round(wait_ticks / gpu_ticks, 3) if gpu_ticks else None,
        "never_started": sum(1 for jid in by_id if jid not in starts),
        "rented_node_hours_by_group": {f"{c.name}/{g}": round(sec / 3600, 2) for c in fleet.members if not c.owned
                                       for g, sec in sorted(sims[c.name].billed_s.items())},
        "rented_gpu_node_hours": round(rented_node_h, 2),
        "rented_gpu_hours": round(rented_gpu_h, 2),
        "rented_cost": round(rented_cost, 2),
        "owned_fixed_cost": round(fixed, 2),
        "total_cost": round(fixed + rented_cost, 2),
        "wait_min": {**{p: {"p50": percentile(w, 0.5), "p95": percentile(w, 0.95), "n": len(w)}
                        for p, w in waits.items()},
                     "all": {"p50": percentile(everyone, 0.5), "p95": percentile(everyone, 0.95), "n": len(everyone)}},
        "virtual_hours": round(ended_s / 3600, 2),
    }


def goals(res: dict) -> dict:
    h, r, o = res["hybrid"], res["rented"], res["owned"]
    cost_ratio = h["total_cost"] / r["total_cost"] if r["total_cost"] else None
    hp95, op95 = h["wait_min"]["all"]["p95"], o["wait_min"]["all"]["p95"]
    wait_ratio = hp95 / op95 if op95 else None
    util = h["owned_gpu_util_while_waiting"]
    return {
        "hybrid_cost_vs_rented": {"ratio": round(cost_ratio, 3) if cost_ratio is not None else None, "goal": "<= 0.8",
                                  "met": cost_ratio is not None and cost_ratio <= 0.8},
        "hybrid_p95_wait_vs_owned": {"ratio": round(wait_ratio, 3) if wait_ratio is not None else None,
                                     "goal": "<= 0.5", "met": wait_ratio is not None and wait_ratio <= 0.5},
        "hybrid_owned_gpu_util_while_waiting": {"value": util, "goal": ">= 0.7",
                                                "met": util is not None and util >= 0.7},
    }


def table(res: dict) -> str:
    rows = [("jobs finished / all (never started)", lambda f: f"{f['finished']} / {f['jobs']} ({f['never_started']})"),
            ("jobs retried (spot reclaims)", lambda f: f"{f['retried']} ({f['spot_reclaims']})"),
            ("GPU-hours lost (since a checkpoint, restarts)", lambda f: f"{f['gpu_hours_lost']}"),
            ("owned GPU util, day", lambda f: _pct(f["owned_gpu_util"])),
            ("owned GPU util, while GPU work waits", lambda f: _pct(f["owned_gpu_util_while_waiting"])),
            ("share of the day a GPU job waited", lambda f: _pct(f["gpu_wait_share_of_day"])),
            ("rented GPU-hours (node-hours)", lambda f: f"{f['rented_gpu_hours']} ({f['rented_gpu_node_hours']})"),
            ("rented cost $", lambda f: f"{f['rented_cost']:.2f}"),
            ("owned fixed cost $ (24 h)", lambda f: f"{f['owned_fixed_cost']:.2f}"),
            ("total cost $", lambda f: f"{f['total_cost']:.2f}")]
    for p in [*PRIORITIES, "all"]:
        rows.append((f"wait p50 / p95 min, {p}",
                     lambda f, p=p: f"{f['wait_min'][p]['p50']} / {f['wait_min'][p]['p95']}"))
    return policy_table(res, rows, POLICIES, col=16)


def policy_table(res: dict, rows: list, policies, col: int) -> str:
    """One row per figure, one column per policy (``rows``: name and how to show
    it from a policy's figures); bench/sharing.py prints its table with it too."""
    width = max(len(r[0]) for r in rows)
    lines = [f"{'':{width}}  " + "".join(f"{p:>{col}}" for p in policies)]
    for name, fmt in rows:
        lines.append(f"{name:{width}}  " + "".join(f"{fmt(res[p]):>{col}}" for p in policies))
    return "\n".join(lines)


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=45)
    ap.add_argument("--quick", action="store_true",
                    help="a quarter of the jobs, a pass every 4 virtual minutes (seconds, for a smoke run)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    share, tick_s = (0.25, QUICK_TICK_S) if args.quick else (1.0, TICK_S)
    jobs = trace(args.seed, share=share)
    counts = {c: sum(1 for j in jobs if j.cls == c) for c in DAILY}
    print(f"fleet_trace: seed {args.seed}, {len(jobs)} jobs {counts}, a pass every {tick_s} virtual s, "
          f"load {os.getloadavg()[0]:.2f}", flush=True)
    res: dict = {}
    with tempfile.TemporaryDirectory(prefix="raylane-fleet-trace-") as tmp:
        for policy in POLICIES:
            t0 = time.monotonic()
            res[policy] = run_policy(policy, jobs, seed=args.seed, tick_s=tick_s, tmp=Path(tmp))
            res[policy]["wall_s"] = round(time.monotonic() - t0, 1)
            print(f"  {policy}: {res[policy]['wall_s']} s wall, {res[policy]['virtual_hours']} virtual h, "
                  f"load {os.getloadavg()[0]:.2f}", flush=True)
    res["goals"] = goals(res)
    res["seed"], res["quick"], res["tick_s"] = args.seed, args.quick, tick_s
    print(table(res))
    for k, g in res["goals"].items():
        print(f"goal {k}: {g.get('ratio', g.get('value'))} (goal {g['goal']}): {'met' if g['met'] else 'NOT met'}")
    print(json.dumps(res, sort_keys=True))
    return res


if __name__ == "__main__":
    main()
