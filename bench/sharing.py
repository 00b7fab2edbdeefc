"""Two projects' bursts on the 2-GPU group under strict quotas and under
borrowing with preemption, in one run (issue 46, docs/sharing.md):

- ``strict``: a and b each ``{gpu: {max_gpus: 1}}``, ``RAYLANE_PREEMPTION`` off:
  a project never holds more than its one GPU, whatever the other leaves idle;
- ``sharing``: a and b each ``{gpu: {max_gpus: 1, borrow_gpus: 1}}``, preemption
  on, ``preempt_grace_s`` 60, ``preempt_min_run_s`` 120 (the shipped defaults):
  a project may borrow the other's idle GPU, and a job within its share takes it
  back by preemption.

    python bench/sharing.py [--seed 46] [--quick] [--burst-jobs LO HI]

Words used here:

- *trace*: the jobs (``trace()``), the same for both policies: each project
  sends bursts of training jobs (1 worker x 1 GPU) at its own times of an 8-hour
  window (``BURSTS_PER_PROJECT`` bursts each, at uniform random times, of 1 to 5
  jobs a few minutes apart), so that often one project is idle while the other
  has a backlog, and sometimes both are busy. Durations are lognormal, median
  ``MEDIAN_MIN`` virtual minutes, clipped to [5, 90].
- *virtual time*: the window's clock; a tick is ``TICK_S`` virtual seconds.
- *within its guarantee*: a job that, when it arrived, found every earlier job of
  its project finished: its project held nothing of the group (less than its
  1-GPU share) and had none of its own jobs queued ahead of it. Such a job is
  owed its GPU: under ``sharing`` it may have to preempt a borrower for it.
- *one job start*: what the sim needs to start a job once Raylane may: one tick
  (``TICK_S``): the next dispatcher pass admits it and Ray starts it in that
  same tick. The goal for the p95 wait within the guarantee is therefore
  ``preempt_grace_s + TICK_S`` (70 virtual s).

How it replays. As bench/fleet_trace.py: everything of Raylane is real
(``ControlPlane.submit``, quotas set through ``Access.set_quota``, the
dispatcher's admission and claim with preemption, the reconciler's
checkpoint request and stop, retries) on a real SQLite database in a temp
directory; Ray is the in-memory ``orchestrator.testing.FakeRay`` (the default
profile: group ``gpu`` is one node of 2 GPUs), attached with
``assembly.attach_backend``, and moved by ``Sim``: each tick it advances every
running attempt's progress; a job checkpoints every ``CKPT_S`` of progress; when
Raylane asks an attempt to checkpoint (``gcs.checkpoint_request``) it saves
``SAVE_S`` after the request and says so (``checkpointed_key``, as
``raylane.jobs.base.checkpoint_saved`` does); it succeeds once its progress
reaches its duration. An attempt Raylane stopped (Ray's status STOPPED) loses
its progress since its last checkpoint; the job's next attempt resumes from that
checkpoint after ``RESTART_S`` of restart, both counted as GPU-seconds lost.
Ray starts every submitted attempt at once (Raylane admits only what fits the
node; the sim checks it and fails loudly if not).

Each tick the bench sets the virtual clock (``store.transitions.utcnow``,
patched where it was imported, as fleet_trace does), submits the tick's
arrivals at their own second, moves the sim, turns the dispatcher, lets Ray
start what it submitted, then turns the reconciler (``turn`` in
tests/test_loops_on_fake_ray.py). Stretches with no job arrived and unfinished are
skipped to the next arrival. The figures are a function of the seed alone.

Figures, per policy: GPU utilisation (GPU-seconds held by running attempts /
(2 x the makespan, first arrival to last finish)), the same counting only
useful work (progress kept), and utilisation over the ticks in which some job
waited (arrived, unfinished, not running); wait from arrival to first start,
p50 / p95 in virtual seconds, of all jobs and of jobs within their guarantee;
preemptions (attempts ended PREEMPTED_BY_PRIORITY); GPU-seconds lost
(progress since the last checkpoint at a stop, plus restarts); jobs retried
(more than one attempt).

The last line printed is one JSON object keyed ``strict``, ``sharing``,
``ratios`` and ``goals`` (issue 46: sharing's utilisation at least 1.3x
strict's; sharing's p95 wait within the guarantee at most the grace period
plus one job start).
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
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.fleet_trace import (VirtualClock, _patch_clock, _pct, _unpatch_clock, percentile,  # noqa: E402
                               policy_table)

PROJECTS = ("a", "b")
GPUS = 2  # the default profile's group gpu: one node of 2 GPUs
WINDOW_S = 8 * 3600
QUICK_WINDOW_S = 2 * 3600
BURSTS_PER_PROJECT = 4  # per 8 hours (scaled with the window)
BURST_JOBS = (1, 5)  # jobs in a burst, uniform: about 60% of the group's GPU-hours over the window
BURST_GAP_S = (30, 300)  # between two jobs of a burst, uniform
MEDIAN_MIN = 20.0  # a job's duration, lognormal (sigma 0.6), clipped to [5, 90] min
TICK_S = 10  # one pass of each loop per 10 virtual s
QUICK_TICK_S = 30
DRAIN_S = 24 * 3600  # after the window, at most this long for every job to finish
CKPT_S = 600  # a job checkpoints every 10 min of progress
SAVE_S = 10  # ... and saves one this long after Raylane asks (a preemption)
RESTART_S = 30  # a resumed attempt's restart (loading its checkpoint) before it progresses again
GRACE_S = 60.0  # RAYLANE_PREEMPT_GRACE_S (the default)
MIN_RUN_S = 120.0  # RAYLANE_PREEMPT_MIN_RUN_S (the default)
START = datetime(2026, 1, 5, 9, tzinfo=timezone.utc)
POLICIES = {
    "strict": ({"max_gpus": 1}, False),
    "sharing": ({"max_gpus": 1, "borrow_gpus": 1}, True),
}


@dataclass
class TraceJob:
    at_s: int
    project: str
    duration_s: int
    spec: dict


def trace(seed: int, *, window_s: int = WINDOW_S, burst_jobs: tuple[int, int] = BURST_JOBS) -> list[TraceJob]:
    """The window's jobs in arrival order; the same for the same seed."""
    rng = random.Random(seed)
    jobs: list[TraceJob] = []
    bursts = max(1, round(BURSTS_PER_PROJECT * window_s / WINDOW_S))
    for project in PROJECTS:
        for _ in range(bursts):
            at = rng.uniform(0, window_s * 0.9)
            for _ in range(rng.randint(*burst_jobs)):
                dur = int(60 * min(90.0, max(5.0, rng.lognormvariate(math.log(MEDIAN_MIN), 0.6))))
                name = f"{project}-{len(jobs)}"
                spec = {"name": name, "kind": "training", "entrypoint": "examples.train:main",
                        "resources": {"num_workers": 1, "gpus_per_worker": 1, "cpus_per_worker": 1}}
                jobs.append(TraceJob(int(at), project, dur, spec))
                at += rng.uniform(*BURST_GAP_S)
    jobs.sort(key=lambda j: (j.at_s, j.spec["name"]))
    return jobs


# Ray's side, moved by the bench -------------------------------------------------------


@dataclass
class _Job:
    tj: TraceJob
    progress: float = 0.0
    ckpt: float = 0.0
    first_start: int | None = None
    finished: int | None = None
    attempts: int = 0


@dataclass
class _Attempt:
    job_id: str
    restart_left: float
    asked_at: int | None = None  # when Raylane's checkpoint request was first seen
    saved: bool = False


class Sim:
    """The GPU node and the jobs' progress around a ``FakeRay`` (module docstring)."""

    def __init__(self, ray):
        self.ray = ray
        self.jobs: dict[str, _Job] = {}
        self.running: dict[str, _Attempt] = {}  # submission id -> its attempt
        self.gpu_s = 0.0  # GPU-seconds held by running attempts
        self.lost_s = 0.0  # progress lost at stops, plus restarts
        self.stops = 0

    def advance(self, now: int, dt: int) -> None:
        """``dt`` seconds went by: progress, checkpoints asked for and periodic, ends."""
        ray = self.ray
        for sid, a in list(self.running.items()):
            j = self.jobs[a.job_id]
            if ray.jobs[sid].job.status == "STOPPED":  # stopped at the last pass: held until then
                self.lost_s += j.progress - j.ckpt
                j.progress = j.ckpt
                self.stops += 1
                del self.running[sid]
                continue
            run = min(dt, a.restart_left + j.tj.duration_s - j.progress)
            self.gpu_s += run
            restart = min(a.restart_left, run)
            a.restart_left -= restart
            self.lost_s += restart
            j.progress += run - restart
            j.ckpt = max(j.ckpt, CKPT_S * math.floor(j.progress / CKPT_S))
            if ray.gcs.checkpoint_request(sid) and a.asked_at is None:
                a.asked_at = now - dt  # asked at the last pass
            if a.asked_at is not None and not a.saved and now >= a.asked_at + SAVE_S:
                a.saved = True
                j.ckpt = j.progress
                ray.gcs.kv[_checkpointed_key(sid)] = b"saved"
            if j.progress >= j.tj.duration_s - 1e-9:
                ray.finish(sid, result={"loss": 0.1})
                j.finished = now - dt + run
                del self.running[sid]

    def start(self, now: int) -> None:
        """Ray starts every submitted attempt (Raylane admits only what fits)."""
        for sid in self.ray.running():
            rj = self.ray.jobs[sid]
            if rj.job.status != "PENDING":
                continue
            if len(self.running) >= GPUS:
                raise AssertionError(f"{sid} submitted with both GPUs held: admission let in more than fits")
            job_id = rj.submission.metadata["raylane_job_id"]
            j = self.jobs[job_id]
            self.ray.start(sid)
            j.attempts += 1
            if j.first_start is None:
                j.first_start = now
            self.running[sid] = _Attempt(job_id, RESTART_S if j.attempts > 1 else 0.0)

    def held(self, project: str | None = None) -> int:
        return sum(1 for a in self.running.values() if project is None or self.jobs[a.job_id].tj.project == project)


def _checkpointed_key(sid: str) -> str:
    from raylane.orchestrator.domain import protocol

    return protocol.checkpointed_key(sid)


# One policy's run ----------------------------------------------------------------------


def run_policy(policy: str, jobs: list[TraceJob], *, tick_s: int, window_s: int, tmp: Path) -> dict:
    from raylane.orchestrator.domain.specs import JobSpec
    from raylane.orchestrator.domain.views import GroupLimits
    from raylane.orchestrator.services import assembly
    from raylane.orchestrator.services.controlplane import ControlPlane
    from raylane.orchestrator.settings import Settings
    from raylane.orchestrator.store import migrate
    from raylane.orchestrator.testing import FakeRay

    quota, preemption = POLICIES[policy]
    url = f"sqlite:///{tmp / f'{policy}.db'}"
    migrate.upgrade(url)
    settings = Settings(database_url=url, data_dir=tmp, auto_migrate=False, loops_enabled=False,
                        admin_token="rl_bench-admin-token-0123456789", submit_rate_per_s=0, fast_lane=False,
                        gc_freeze=False, preemption=preemption, preempt_grace_s=GRACE_S,
                        preempt_min_run_s=MIN_RUN_S)
    clock = VirtualClock()
    clock.now = START
    _patch_clock(clock)
    plane = ControlPlane(settings)
    try:
        ray = FakeRay()
        assembly.attach_backend(plane, ray, ray.profile)
        for p in PROJECTS:
            plane.access.create_project(p, description=None, actor="bench")
            plane.access.set_quota(p, {"gpu": GroupLimits(**quota)}, actor="bench")
        sim = Sim(ray)
        within: dict[str, bool] = {}
        pending = list(jobs)
        wait_ticks = held_waiting = lopsided = 0.0
        t = 0
        while t < window_s + DRAIN_S:
            if not pending and all(j.finished is not None for j in sim.jobs.values()):
                break
            if pending and all(j.finished is not None for j in sim.jobs.values()) and pending[0].at_s >= t + tick_s:
                t = (pending[0].at_s // tick_s) * tick_s  # nothing to do until the next arrival
            t_next = t + tick_s
            while pending and pending[0].at_s < t_next:  # this tick's arrivals, each at its own second
                tj = pending.pop(0)
                clock.now = START + timedelta(seconds=max(tj.at_s, t))
                # Within its guarantee: every earlier job of its project has finished.
                ok = all(j.finished is not None for j in sim.jobs.values() if j.tj.project == tj.project)
                job, _ = plane.submit(JobSpec.model_validate(tj.spec), project=tj.project, actor="bench")
                sim.jobs[job.id] = _Job(tj)
                within[job.id] = ok
            t = t_next
            clock.now = START + timedelta(seconds=t)
            before = sim.gpu_s
            sim.advance(t, tick_s)
            active = {p: sum(1 for j in sim.jobs.values() if j.tj.project == p and j.finished is None and j.tj.at_s < t)
                      for p in PROJECTS}  # arrived, unfinished
            if sum(active.values()) > sim.held():  # some job waited (queued, or stopped and queued again)
                wait_ticks += tick_s
                held_waiting += sim.gpu_s - before
            if min(active.values()) == 0 and max(active.values()) > 1:
                lopsided += tick_s  # one project has nothing, the other a backlog (more than its share)
            sim.start(t)
            _patch_clock(clock)
            plane.dispatcher.run_once()
            sim.start(t)  # Ray starts what was just submitted (in the same tick)
            plane.reconciler.run_once()
        return _figures(plane, sim, within, wait_ticks=wait_ticks, held_waiting=held_waiting, lopsided=lopsided,
                        ended_s=t)
    finally:
        _unpatch_clock()
        plane.close()


def _figures(plane, sim: Sim, within: dict[str, bool], *, wait_ticks: float, held_waiting: float,
             lopsided: float, ended_s: int) -> dict:
    from sqlalchemy import select

    from raylane.orchestrator.store import db
    from raylane.orchestrator.store.tables import attempts as attempts_t, jobs as jobs_t

    with db.read(plane.sessions) as s:
        rows = {r.id: r for r in s.execute(select(jobs_t.c.id, jobs_t.c.status, jobs_t.c.attempts))}
        causes = [c for (c,) in s.execute(select(attempts_t.c.cause))]
    first = min(j.tj.at_s for j in sim.jobs.values())
    last = max(j.finished if j.finished is not None else ended_s for j in sim.jobs.values())
    makespan = last - first
    work = sum(j.tj.duration_s for j in sim.jobs.values() if j.finished is not None)
    waits = {jid: (j.first_start if j.first_start is not None else ended_s) - j.tj.at_s
             for jid, j in sim.jobs.items()}
    owed = [w for jid, w in waits.items() if within[jid]]
    statuses: dict[str, int] = {}
    for r in rows.values():
        statuses[r.status] = statuses.get(r.status, 0) + 1
    return {
        "jobs": len(sim.jobs),
        "finished": statuses.get("SUCCEEDED", 0),
        "statuses": statuses,
        "makespan_h": round(makespan / 3600, 2),
        "gpu_util": round(sim.gpu_s / (GPUS * makespan), 3),
        "gpu_util_useful": round(work / (GPUS * makespan), 3),
        "gpu_util_while_waiting": round(held_waiting / (GPUS * wait_ticks), 3) if wait_ticks else None,
        "wait_share_of_makespan": round(wait_ticks / makespan, 3),
        "one_idle_other_backlog_share": round(lopsided / makespan, 3),
        "wait_s": {"p50": percentile(list(waits.values()), 0.5), "p95": percentile(list(waits.values()), 0.95),
                   "max": max(waits.values()), "n": len(waits)},
        "wait_within_guarantee_s": {"p50": percentile(owed, 0.5), "p95": percentile(owed, 0.95),
                                    "max": max(owed) if owed else None, "n": len(owed)},
        "preemptions": sum(1 for c in causes if c == "PREEMPTED_BY_PRIORITY"),
        "sim_stops": sim.stops,
        "gpu_s_lost": round(sim.lost_s, 1),
        "retried": sum(1 for r in rows.values() if (r.attempts or 0) > 1),
        "gpu_s": round(sim.gpu_s, 1),
        "virtual_h": round(ended_s / 3600, 2),
    }


def goals(res: dict, *, tick_s: int) -> tuple[dict, dict]:
    st, sh = res["strict"], res["sharing"]
    ratios = {
        "gpu_util": round(sh["gpu_util"] / st["gpu_util"], 3) if st["gpu_util"] else None,
        "gpu_util_useful": round(sh["gpu_util_useful"] / st["gpu_util_useful"], 3) if st["gpu_util_useful"] else None,
        "gpu_util_while_waiting": round(sh["gpu_util_while_waiting"] / st["gpu_util_while_waiting"], 3)
        if st["gpu_util_while_waiting"] and sh["gpu_util_while_waiting"] is not None else None,
        "wait_p95": round(sh["wait_s"]["p95"] / st["wait_s"]["p95"], 3) if st["wait_s"]["p95"] else None,
    }
    bound = GRACE_S + tick_s
    p95 = sh["wait_within_guarantee_s"]["p95"]
    return ratios, {
        "sharing_gpu_util_vs_strict": {"ratio": ratios["gpu_util"], "goal": ">= 1.3",
                                       "met": ratios["gpu_util"] is not None and ratios["gpu_util"] >= 1.3},
        # The same goal over the ticks in which work waited: whether the GPUs are
        # used when there is work for them, whatever the trace's idle hours.
        "sharing_gpu_util_while_waiting_vs_strict": {
            "ratio": ratios["gpu_util_while_waiting"], "goal": ">= 1.3",
            "met": ratios["gpu_util_while_waiting"] is not None and ratios["gpu_util_while_waiting"] >= 1.3},
        "sharing_p95_wait_within_guarantee_s": {
            "value": p95, "goal": f"<= {bound:g} (grace {GRACE_S:g} s + one job start, a tick of {tick_s} s)",
            "met": p95 is not None and p95 <= bound},
    }


def table(res: dict) -> str:
    rows = [("jobs finished / all", lambda f: f"{f['finished']} / {f['jobs']}"),
            ("makespan h", lambda f: f"{f['makespan_h']}"),
            ("GPU util, makespan", lambda f: _pct(f["gpu_util"])),
            ("GPU util, useful work only", lambda f: _pct(f["gpu_util_useful"])),
            ("GPU util, while a job waits", lambda f: _pct(f["gpu_util_while_waiting"])),
            ("share of makespan a job waits", lambda f: _pct(f["wait_share_of_makespan"])),
            ("... one project idle, the other backlogged", lambda f: _pct(f["one_idle_other_backlog_share"])),
            ("wait p50 / p95 s, all", lambda f: f"{f['wait_s']['p50']} / {f['wait_s']['p95']}"),
            ("wait p50 / p95 / max s, within guarantee",
             lambda f: f"{f['wait_within_guarantee_s']['p50']} / {f['wait_within_guarantee_s']['p95']} / "
                       f"{f['wait_within_guarantee_s']['max']} (n {f['wait_within_guarantee_s']['n']})"),
            ("preemptions", lambda f: f"{f['preemptions']}"),
            ("GPU-s lost (since checkpoint + restarts)", lambda f: f"{f['gpu_s_lost']}"),
            ("jobs retried", lambda f: f"{f['retried']}")]
    return policy_table(res, rows, POLICIES, col=28)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=46)
    ap.add_argument("--burst-jobs", type=int, nargs=2, default=list(BURST_JOBS), metavar=("LO", "HI"),
                    help="jobs in a burst, uniform (default %(default)s; 2 7 overloads the group)")
    ap.add_argument("--quick", action="store_true",
                    help="a 2-hour window, a pass every 30 virtual s (seconds, for a smoke run)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    window_s, tick_s = (QUICK_WINDOW_S, QUICK_TICK_S) if args.quick else (WINDOW_S, TICK_S)
    jobs = trace(args.seed, window_s=window_s, burst_jobs=tuple(args.burst_jobs))
    per = ", ".join(f"{p}: {sum(j.project == p for j in jobs)}" for p in PROJECTS)
    print(f"sharing: seed {args.seed}, {len(jobs)} jobs ({per}), "
          f"{sum(j.duration_s for j in jobs) / 3600:.1f} GPU-h over a {window_s / 3600:g} h window, "
          f"a pass every {tick_s} virtual s, load {os.getloadavg()[0]:.2f}", flush=True)
    res: dict = {}
    with tempfile.TemporaryDirectory(prefix="raylane-sharing-") as tmp:
        for policy in POLICIES:
            t0 = time.monotonic()
            res[policy] = run_policy(policy, jobs, tick_s=tick_s, window_s=window_s, tmp=Path(tmp))
            res[policy]["wall_s"] = round(time.monotonic() - t0, 1)
            print(f"  {policy}: {res[policy]['wall_s']} s wall, {res[policy]['virtual_h']} virtual h, "
                  f"load {os.getloadavg()[0]:.2f}", flush=True)
    res["ratios"], res["goals"] = goals(res, tick_s=tick_s)
    res["seed"], res["quick"], res["tick_s"], res["burst_jobs"] = args.seed, args.quick, tick_s, args.burst_jobs
    res["settings"] = {"preempt_grace_s": GRACE_S, "preempt_min_run_s": MIN_RUN_S, "ckpt_s": CKPT_S,
                       "save_s": SAVE_S, "restart_s": RESTART_S}
    print(table(res))
    for k, g in res["goals"].items():
        print(f"goal {k}: {g.get('ratio', g.get('value'))} (goal {g['goal']}): {'met' if g['met'] else 'NOT met'}")
    print(json.dumps(res, sort_keys=True))
    return res


if __name__ == "__main__":
    main()
