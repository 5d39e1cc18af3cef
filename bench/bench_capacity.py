"""Opportunistic capacity on a week of a region (issue #37): what the tier adds, against the same
region without it and against what a Kubernetes user runs, on the same trace.

A simulated region on a simulated clock (bench_srm.py's simulator: no daemon, no containers).
Guaranteed services: bench_srm.py's built-in diurnal week (its jobs, scales and shifts, its AR(1)
noise, the flash crowd), each job its own entitlement on machines of SLOTS one-core slots. A
backlog of opportunistic batch work that never runs dry: tasks of one core each, using BATCH_USE of
it once started (STARTUP after they are asked for), checkpointing every CHECKPOINT_EVERY seconds and
on a notice or a SIGTERM (ACK seconds). The region holds as many machines as the services need at
their week's peak minute at the target, and a tenth more (U counts the machines batch holds, V only
the services': a larger region lends more and raises U, not V). On Thursday at 15:00 one MSB of five is
lost for an hour: a fifth of every service's machines and of the batch machines (for Kubernetes, of
every node), their tasks with them.

Three ways, on the same trace and region:

- tier: the services autoscaled by the SRM as the daemon runs it (bench_srm.decide); every machine
  the region does not need now (the free pool) runs batch work, a whole machine at a time, as an
  opportunistic entitlement's; a service whose growth finds no free machine makes the region
  reclaim opportunistic machines (controlplane/capacity/reclaim.py's Budget: at most 10 machines
  or 50 % of the entitlement in flight), with the entitlement's notice (NOTICE, 120 s) as the
  deadline: the batch TaskController checkpoints and acks after ACK seconds and the machine goes to
  the service then. With no free machine the SRM's forecast looks that notice further ahead (the
  daemon's rule, srm/service.py's reclaim_lead, with the bench's one group), so that growth it
  foresees is asked for in time. A failure's replacements reclaim at once, without notice (the batch tasks
  killed lose their work since their last checkpoint). The region keeps a reserve of RESERVED free
  machines from batch (`twinectl capacity reserve 2`; --reserve): growth takes those at once, and
  reclaims with notice (no heir: to the pool) refill it, as capacity/reclaim.py's refill does.
- no tier: the same services and SRM; freed machines idle in the pool.
- k8s: the services under the HPA (bench/hpa.py); batch as pods of a low PriorityClass above the
  Cluster Autoscaler's expendable cutoff, so the autoscaler grows the cluster to the region for
  them and they fill every free slot of every node, service nodes included (pods, not machines:
  the strongest packing Kubernetes gives). A service pod with no free slot preempts a batch pod,
  the newest first (the scheduler prefers victims that started last), with no notice: SIGTERM and
  the 30 s grace period (the pod checkpoints on it in ACK s and exits, so no work is lost; generous
  to the baseline); the service pod binds when the slot is free. No node is ever under half
  requested, so the Cluster Autoscaler's scale-down never acts.
- oracle (a row, not a way anyone can run): the tier with each service sized from the true load
  until its new tasks would serve (a step, a reclaim's ack and a start-up ahead), at the target, with no tolerance, no scale-in delay and
  no flap budget (oracle_size()): the ceiling of whole-machine lending with the services at their
  target, to read U >= K against.

Figures: utilisation = cores used by useful work (what the services' serving tasks used of their
load, and what the batch tasks used, less batch work lost to kills) over the cores of machines held
by anyone (a service, batch, a reclaim in flight; k8s: every node up); opportunistic availability =
the share of the measured week's hours that had at least the machines offered for them
(controlplane/capacity/slo.py as the daemon runs it: free machines beyond the reserve and batch's
machines; the pool's hourly history, the week before simulated the same way with the history
loads, forecast every hour, the 99 % line less the failure-domain buffer offered, each hour judged
against the offer made earliest); reclaims with
>= 120 s notice (k8s: preemptions, with none; the tier gives every reclaim for demand the
entitlement's notice as its deadline and never cuts it short, a service waiting for the ack
instead, which the over-target minutes count: only a failure's reclaims go without); guaranteed
over-target minutes (a job's minute with load per serving task over target x 1.1). When the
tier's utilisation is below Kubernetes', a line splits the gap in two (gap()): the slots of service
machines left empty, which Kubernetes fills with batch pods and whole-machine lending cannot, and
the slots the SRM's service tasks took beyond the HPA's.

    .venv/bin/python bench/bench_capacity.py [--jobs 10] [--days 7] [--seed 26] [--ack 10] [--budget 10,50] [--reserve 2] [--no-lead]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_srm import (MEASURE_DELAY, POLICY, SLOTS, STARTUP, STEP, T0, TARGET, WEEK, JobSim, Pool,  # noqa: E402
                       Side, builtin_trace, decide, job_loads, new_job, over_target_minute)

from controlplane.capacity import slo  # noqa: E402
from controlplane.capacity.reclaim import Budget  # noqa: E402

NOTICE = 120.0  # seconds: an opportunistic entitlement's notice (the default)
ACK = 10.0  # seconds from a notice (or SIGTERM) to the batch task's checkpoint and ack (or exit)
GRACE = 30.0  # seconds: Kubernetes' default terminationGracePeriodSeconds
BATCH_USE = 0.95  # of its core a running batch task uses
CHECKPOINT_EVERY = 600.0  # seconds between a batch task's own checkpoints
HEADROOM = 0.10  # the region's machines beyond the services' peak need
FAILURE_AT = 3 * 1440 + 15 * 60  # minute of the measured week an MSB is lost (Thursday 15:00)
FAILURE_FOR = 60  # minutes it stays lost
FAILURE_SHARE = 0.2  # one MSB of five
GROUP = "generic/dc1"
RESERVE = -1  # the heir of a reclaim that refills the reserve (the free pool)
RESERVED = 2  # free machines the region keeps unlent (`twinectl capacity reserve`)


def region_size(loads: list[list[float]], minutes: int) -> int:
    """Machines for the services' week's peak minute at the target, and HEADROOM more."""
    peak = sum(math.ceil(max(POLICY.min, math.ceil(max(load[:minutes]) / TARGET - 1e-9)) / SLOTS) for load in loads)
    return math.ceil(peak * (1 + HEADROOM))


def lost_work(started: float, now: float) -> float:
    """Core-seconds a batch task killed now loses: what it did since its last checkpoint."""
    ran = max(0.0, now - started)
    return (ran % CHECKPOINT_EVERY) * BATCH_USE


@dataclass
class Tally:
    name: str
    useful: float = 0.0  # core-seconds of useful work
    held: float = 0.0  # core-seconds of machines held by anyone
    over: int = 0
    reclaims: int = 0
    noticed: int = 0  # reclaims (preemptions) with a notice of NOTICE or more
    lost: float = 0.0  # core-seconds of batch work lost to kills
    empty: float = 0.0  # slot-seconds held by a service with no task in them (no batch there either)
    serving: float = 0.0  # task-seconds of the services' tasks (placed, starting or serving)
    hours: dict[int, int] = field(default_factory=dict)  # hour -> the least available seen in it
    starts: dict[int, int] = field(default_factory=dict)  # hour -> available at its start
    buffers: dict[int, int] = field(default_factory=dict)  # hour -> the failure-domain buffer at its start
    over_in: dict[int, int] = field(default_factory=dict)  # hour of the week -> over-target minutes in it

    @property
    def utilisation(self) -> float:
        return self.useful / self.held if self.held else 0.0


class TierPool(Pool):
    """The free pool of a region with (or without) the opportunistic tier: what the services do
    not hold, the batch entitlement holds, a machine at a time; reclaims take it back."""

    def __init__(self, machines: int, tier: bool, budget: Budget = Budget(), ack: float = ACK, reserve: int = 0):
        super().__init__(machines)
        self.tier, self.budget, self.ack, self.reserve = tier, budget, ack, reserve
        self.batch: dict[int, float] = {}  # batch machine -> when its tasks started
        self.reclaiming: deque[tuple[float, int, float, int]] = deque()  # (ack at, machine, its tasks' start, heir job)
        self.promised = 0  # machines acked to a service, not yet taken by it
        self.down = 0  # machines lost (the failure)
        self.ids = 0

    def take(self) -> str | None:
        got = super().take()
        if got is not None and self.promised:
            self.promised -= 1
        return got

    def available(self) -> int:
        """slo.pool()'s figure: free (not promised to an heir) beyond the reserve, and opportunistic
        not reclaiming."""
        return max(0, self.free - self.promised - self.reserve) + len(self.batch)

    def fill(self, now: float) -> None:
        """Batch takes every free machine no service is owed, but the reserve."""
        if not self.tier:
            return
        while self.free - self.promised > self.reserve:
            self.free -= 1
            self.ids += 1
            self.batch[self.ids] = now

    def reclaim(self, n: int, now: float, t: Tally, failure: bool, heir: int = 0) -> None:
        """n batch machines taken back for a service: with the entitlement's notice as the deadline
        (the machine changes hands when the controller acks, `ack` seconds in, or at the deadline),
        or, for a failure, at once (the tasks killed). The product never cuts a notice short for
        demand: a service waits for the ack instead (what the over-target minutes measure)."""
        limit = self.budget.limit(len(self.batch) + len(self.reclaiming))
        for mid in sorted(self.batch, key=lambda m: -self.batch[m])[:max(0, n)]:  # the newest: least work at stake
            if not failure and len(self.reclaiming) >= limit:
                break
            started = self.batch.pop(mid)
            t.reclaims += 1
            if failure:
                t.lost += SLOTS * lost_work(started + STARTUP, now)
                self.free += 1
                self.promised += 1
            else:
                t.noticed += 1  # its deadline is the entitlement's notice, NOTICE
                self.reclaiming.append((now + min(self.ack, NOTICE), mid, started, heir))

    def acks(self, now: float, jobs: list[dict] = ()) -> None:
        """The reclaims acked by now: each machine to its heir, whose tasks waiting for it are
        placed there at the ack (the shard leader's pass places a job's pending tasks as the
        machine changes hands, not at the SRM's next interval)."""
        while self.reclaiming and self.reclaiming[0][0] <= now:
            at, _, _, heir = self.reclaiming.popleft()
            self.free += 1
            if heir == RESERVE:
                continue  # to the free pool: the reserve again
            self.promised += 1
            if jobs and (k := need_of(jobs[heir])):
                jobs[heir]["sim"].grow(min(k, SLOTS), at)

    def refill(self, now: float, t: Tally) -> None:
        """The reserve, short of what the region keeps free: reclaims with notice for it (the
        reclaimer's refill), less those already coming."""
        if self.tier and (short := self.reserve - (self.free - self.promised) - self.owed(RESERVE)) > 0:
            self.reclaim(short, now, t, failure=False, heir=RESERVE)

    def owed(self, heir: int) -> int:
        """Machines in reclaim for that job."""
        return sum(1 for r in self.reclaiming if r[3] == heir)


def fail(side: Side, pool: TierPool, now: float, t: Tally) -> dict[int, int]:
    """The MSB's loss: a fifth of each job's machines (the last ones taken) and of the batch
    machines go down with their tasks (batch's work since its last checkpoint lost). Returns each
    job's tasks lost."""
    k = round(len(pool.batch) * FAILURE_SHARE)
    for mid in sorted(pool.batch)[len(pool.batch) - k:]:
        t.lost += SLOTS * lost_work(pool.batch.pop(mid) + STARTUP, now)
        pool.down += 1
    lost = {}
    for n, job in enumerate(side.jobs):
        sim: JobSim = job["sim"]
        gone = sorted(sim.machines, key=lambda m: int(m[1:]))[-round(len(sim.machines) * FAILURE_SHARE):] \
            if round(len(sim.machines) * FAILURE_SHARE) else []
        lost[n] = 0
        for m in gone:
            for i in sorted(sim.machines.pop(m)):
                del sim.tasks[i]
                lost[n] += 1
            pool.held -= 1
            pool.down += 1
    return lost


def run_twine(loads, history, minutes: int, machines: int, tier: bool, predictive: bool = True,
              failure_at: int | None = FAILURE_AT, budget: Budget = Budget(), ack: float = ACK,
              lead: bool = True, reserve: int = RESERVED, oracle: bool = False) -> Tally:
    """tier / no tier: the SRM's services, with batch on the free machines or without.
    failure_at: the minute the MSB is lost (None: never). oracle: each service sized by
    oracle_size() instead of the SRM (the ceiling of whole-machine lending)."""
    t = Tally(("oracle" if oracle else "tier") if tier else "no tier")
    pool = TierPool(machines, tier, budget, ack, reserve if tier else 0)
    side = Side(t.name, "srm")
    side.pool = pool
    if not predictive:
        side.policy = replace(POLICY, predictive=False)
    side.jobs = [new_job(side, j, load, history) for j, load in enumerate(loads)]
    pool.fill(-STARTUP)
    steps_per_minute = int(60 // STEP)
    back_at = None
    for step in range(int(minutes * 60 // STEP)):
        now = step * STEP
        minute = int(now // 60)
        seen_minute = int((now - MEASURE_DELAY) // 60)
        pool.acks(now, side.jobs)
        if minute == failure_at and back_at is None:
            for n, k in fail(side, pool, now, t).items():
                sim = side.jobs[n]["sim"]
                before = sim.size()
                sim.grow(k, now)  # the scheduler places the lost tasks again at once
                if short := k - (sim.size() - before):  # and takes machines from batch for the rest
                    pool.reclaim(math.ceil(short / SLOTS), now, t, failure=True, heir=n)
                    sim.grow(short, now)
            back_at = (failure_at + FAILURE_FOR) * 60
        if back_at is not None and now >= back_at and pool.down:
            pool.free += pool.down  # the MSB is back: its machines return to the pool
            pool.down = 0
        # with no free machine, growth takes machines back with notice: the forecast looks that much further
        side.lead = NOTICE if tier and lead and pool.free - pool.promised <= pool.reserve else 0.0
        for n, job in enumerate(side.jobs):
            sim: JobSim = job["sim"]
            size = sim.size()
            new = oracle_size(job, now) if oracle else decide(side, job, now, seen_minute, 1.0)
            if new > size:
                sim.grow(new - size, now)
            elif new < size:
                sim.stop(sim.srm_victims(size - new, now))
            if new != size:
                job["mem"].changed(T0 + now, size, sim.size())
            job["want"] = new
            if tier and (short := new - sim.size()) > 0:  # its demand: machines to reclaim, less those coming
                pool.reclaim(math.ceil(short / SLOTS) - pool.owed(n), now, t, failure=False, heir=n)
        pool.refill(now, t)
        pool.fill(now)
        for job in side.jobs:
            load, serving = job["load"][minute], job["sim"].serving(now)
            t.useful += min(load, serving) * STEP
        t.useful += sum(SLOTS * BATCH_USE * STEP for started in pool.batch.values() if now >= started + STARTUP)
        t.useful += sum(SLOTS * BATCH_USE * STEP for _, _, started, _ in pool.reclaiming
                        if now >= started + STARTUP)  # they work on until they checkpoint
        t.held += (pool.held + len(pool.batch) + len(pool.reclaiming) + pool.promised) * SLOTS * STEP
        tasks = sum(job["sim"].size() for job in side.jobs)
        t.serving += tasks * STEP
        t.empty += ((pool.held + pool.promised) * SLOTS - tasks) * STEP
        hour = int((T0 + now) // 3600)
        t.hours[hour] = min(t.hours.get(hour, machines), pool.available())
        if hour not in t.starts:
            t.starts[hour] = pool.available()
            t.buffers[hour] = buffer(side)
        if (step + 1) % steps_per_minute == 0:
            minute_end(side, minute, t)
    t.over = side.result.over
    t.useful -= t.lost
    return t


def oracle_size(job: dict, now: float) -> int:
    """What a sizer that knew the load would ask for now: the most of the true load (not the
    measured, MEASURE_DELAY late) from this minute to the one its new tasks serve in if asked for
    at the next step (a reclaim's ack and STARTUP later), at the target, every STEP, with no
    tolerance, no scale-in delay and no flap budget. Not a policy anyone can run: the most
    whole-machine lending can give with the services at their target."""
    minute = int(now // 60)
    job["ready"].append(job["sim"].serving(now))  # the minute's over-target test, as decide() keeps it
    ahead = job["load"][minute:int((now + STEP + ACK + STARTUP) // 60) + 1]
    return max(POLICY.min, math.ceil(max(ahead) / TARGET - 1e-9))


def buffer(side: Side) -> int:
    """slo.pool()'s failure-domain buffer: the guaranteed machines of the largest MSB. Every
    service is spread over the five MSBs as evenly as it can be, and the one lost takes each
    service's share (fail()): that share, summed."""
    return sum(round(len(job["sim"].machines) * FAILURE_SHARE) for job in side.jobs)


def minute_end(side: Side, minute: int, t: Tally) -> None:
    before = side.result.over
    over_target_minute(side, minute)
    if side.result.over > before:
        t.over_in[minute // 60] = t.over_in.get(minute // 60, 0) + side.result.over - before


def need_of(job: dict) -> int:
    """Tasks a job asked for that have no machine yet."""
    return max(0, job.get("want", job["sim"].size()) - job["sim"].size())


def run_k8s(loads, minutes: int, machines: int, failure_at: int | None = FAILURE_AT, ack: float = ACK) -> Tally:
    """HPA services and low-priority batch pods sharing every node, slot by slot."""
    t = Tally("k8s")
    slots = machines * SLOTS
    side = Side("k8s", "hpa")
    side.pool = Pool(machines)  # unused for placement: pods are placed by slot below
    jobs = []
    for j, load in enumerate(loads):
        job = new_job(side, j, load, None)
        jobs.append(job)
    side.jobs = jobs
    for job in jobs:  # the pods, without machines: serving from (a slot each)
        job["pods"] = [-1.0] * job["sim"].size()
        job["pending"] = deque()  # (its slot free at, the preempted batch pod's start): a pod waiting to bind
    # batch pods (started at) in every slot the services leave, running as the week begins (as the tier's)
    batch: list[float] = [-STARTUP] * (slots - sum(len(j["pods"]) for j in jobs))
    down = 0
    back_at = None
    steps_per_minute = int(60 // STEP)
    for step in range(int(minutes * 60 // STEP)):
        now = step * STEP
        minute = int(now // 60)
        seen_minute = int((now - MEASURE_DELAY) // 60)
        if minute == failure_at and back_at is None:
            down = round(slots * FAILURE_SHARE)
            lost = []
            for job in jobs:  # a fifth of every node's pods: the services'
                k = round(len(job["pods"]) * FAILURE_SHARE)
                del job["pods"][len(job["pods"]) - k:]
                lost.append(k)
            k = round(len(batch) * FAILURE_SHARE)  # and batch's
            free = slots - down - sum(len(j["pods"]) + len(j["pending"]) for j in jobs) - (len(batch) - k)
            k += max(0, -free)  # (rounding: no pod is left on a slot that is down)
            batch.sort()
            for started in batch[max(0, len(batch) - k):]:
                t.lost += lost_work(started + STARTUP, now)
            del batch[max(0, len(batch) - k):]
            free = max(0, free)
            for job, k in zip(jobs, lost):  # the ReplicaSet makes the lost pods again at once
                free = place(job, k, free, batch, now, t, ack)
            back_at = (failure_at + FAILURE_FOR) * 60
        if back_at is not None and now >= back_at:
            down = 0
        for job in jobs:
            sim: JobSim = job["sim"]
            while job["pending"] and job["pending"][0][0] <= now:  # a victim exited: the pod binds
                at, _ = job["pending"].popleft()
                job["pods"].append(at + STARTUP)
            sim.tasks = {i: ("n", at) for i, at in enumerate(job["pods"] + [math.inf] * len(job["pending"]))}
            size = sim.size()
            new = decide(side, job, now, seen_minute, 1.0)
            if new < size:  # a ReplicaSet's order: not yet bound, not ready, then the newest
                drop = size - new
                while drop and job["pending"]:
                    job["pending"].pop()
                    drop -= 1
                job["pods"].sort()
                del job["pods"][len(job["pods"]) - drop:]
            job["want"] = new
        used = sum(len(j["pods"]) + len(j["pending"]) for j in jobs)
        free = slots - down - used - len(batch)
        for job in jobs:
            free = place(job, job["want"] - len(job["pods"]) - len(job["pending"]), free, batch, now, t, ack)
        if free > 0:
            batch += [now] * free  # the backlog's pending pods take every free slot
        for job in jobs:
            serving = sum(1 for at in job["pods"] if at <= now)
            t.useful += min(job["load"][minute], serving) * STEP
        t.useful += sum(BATCH_USE * STEP for started in batch if now >= started + STARTUP)
        t.useful += sum(BATCH_USE * STEP for j in jobs for _, started in j["pending"]
                        if now >= started + STARTUP)  # victims at work until they checkpoint
        t.held += (slots - down) * STEP  # every node up is held (batch pods on all of them)
        t.serving += sum(len(j["pods"]) + len(j["pending"]) for j in jobs) * STEP  # (no slot is left empty)
        if (step + 1) % steps_per_minute == 0:
            minute_end(side, minute, t)
    t.over = side.result.over
    t.useful -= t.lost
    return t


def place(job: dict, n: int, free: int, batch: list[float], now: float, t: Tally, ack: float = ACK) -> int:
    """n more pods of a service: each in a free slot, else in the slot of the newest batch pod,
    preempted (SIGTERM: it checkpoints and exits after ACK, within GRACE). Returns the slots left
    free."""
    for _ in range(max(0, n)):
        if free > 0:
            free -= 1
            job["pods"].append(now + STARTUP)
        elif batch:
            batch.sort()
            t.reclaims += 1
            job["pending"].append((now + min(ack, GRACE), batch.pop()))
    return free


def availability(before: Tally, measured: Tally, machines: int, hours_measured: list[int], buffers: bool = True
                 ) -> tuple[float, int, list[tuple[int, int, int]], float]:
    """The measured hours delivered (available >= offered), in percent, and how many were
    judged: the history the week before's hours, then each measured hour's own as it closes; at
    each hour's start the forecast from what was kept, its 99 % line less the failure-domain
    buffer then (buffers=False: the 99 % line itself) offered for 24 hours. And the machines
    offered for an hour, on average over those judged."""
    h = slo.History()
    for hour, avail in sorted(before.hours.items()):
        h.put(hour, {"groups": {GROUP: {"machines": machines, "available": avail}}})
    for hour in hours_measured:
        now_pool = {GROUP: {"machines": machines, "available": measured.starts[hour],
                            "buffer": measured.buffers[hour] if buffers else 0}}
        h.offered[hour] = slo.offer(slo.forecast(h, now_pool, hour, {GROUP}))
        h.hours[hour] = {GROUP: {"machines": machines, "available": measured.hours[hour]}}
    judged = [(t, o, a) for t, o, a, _ in slo.judged(h, GROUP) if t in set(hours_measured)]
    missed = [(t, o, a) for t, o, a in judged if a < o]
    mean = sum(o for _, o, _ in judged) / len(judged) if judged else 0.0
    return (100.0 * (len(judged) - len(missed)) / len(judged) if judged else 0.0), len(judged), missed, mean


def gap(tier: Tally, k8s: Tally) -> str:
    """The two parts of the tier's utilisation short of Kubernetes', each as the batch work a slot
    would have done (BATCH_USE of a core) over the tier's held cores: the slots of service machines
    left empty (the tier lends whole machines, Kubernetes puts batch pods in those slots), and the
    slots the services' own tasks took beyond what the HPA ran (with its over-target minutes)."""
    empty = 100 * tier.empty * BATCH_USE / tier.held
    more = tier.serving / tier.held * SLOTS - k8s.serving / k8s.held * SLOTS  # tasks a held machine, tier - k8s
    sized = 100 * more / SLOTS * BATCH_USE
    return (f"about {empty:.1f} from the service machines' empty slots (the tier lends whole machines: "
            f"{tier.empty / tier.held * 100:.1f} % of the held slots were a service's and empty; with batch in them "
            f"the tier would be at {100 * tier.utilisation + empty:.1f} %), and about {sized:.1f} from the services' "
            f"sizes (their tasks took {100 * tier.serving / tier.held:.1f} % of the held slots under the SRM, "
            f"{100 * k8s.serving / k8s.held:.1f} % under the HPA, which was over target {k8s.over} minutes against "
            f"the SRM's {tier.over})")


def when(hour: int) -> str:
    """An hour of the measured week (on the history's clock) as its day and time."""
    h = hour - T0 // 3600
    return f"{('Mon', 'Tue', 'Wed', 'Thu', 'Fri', 'Sat', 'Sun')[h // 24 % 7]} {h % 24:02d}:00"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=10)
    p.add_argument("--days", type=float, default=7.0, help="of the measured week (default all of it)")
    p.add_argument("--seed", type=int, default=26)
    p.add_argument("--ack", type=float, default=ACK,
                   help="seconds from a notice (or SIGTERM) to the batch task's checkpoint and ack (default %(default)s)")
    p.add_argument("--no-lead", action="store_true",
                   help="the SRM's forecast does not look a reclaim's notice further when no machine is free")
    p.add_argument("--reserve", type=int, default=RESERVED,
                   help="free machines the region keeps unlent, refilled by reclaims with notice (default %(default)s)")
    p.add_argument("--budget", default=f"{Budget().machines},{Budget().percent:g}",
                   help="the reclaims' disruption budget: MACHINES,PERCENT in flight (reclaim.Budget; default %(default)s)")
    args = p.parse_args()
    try:
        n, pct = args.budget.split(",")
        budget = Budget(int(n), float(pct))
    except ValueError:
        p.error(f"--budget {args.budget!r}: want MACHINES,PERCENT, e.g. 10,50")
    began = time.perf_counter()
    minutes = min(WEEK, int(args.days * 1440))
    base = builtin_trace(args.seed)
    before = builtin_trace(args.seed + 1, flash=False, level=0.9, drift=40)
    loads = job_loads(base, args.jobs, args.seed, args.seed)
    history = job_loads(before, args.jobs, args.seed, args.seed + 2)
    machines = region_size(loads, minutes)
    # the pool's history: the week before, the same region and tier, with the history's loads (the
    # srm's own forecast off there: it has no week before that)
    week_before = run_twine(history, None, WEEK, machines, tier=True, predictive=False, failure_at=None, budget=budget,
                            ack=args.ack, reserve=args.reserve)
    shift = WEEK // 60  # its hours are the week before the measured one's
    week_before.hours = {hour - shift: a for hour, a in week_before.hours.items()}
    tier = run_twine(loads, history, minutes, machines, tier=True, budget=budget, ack=args.ack, lead=not args.no_lead,
                     reserve=args.reserve)
    none = run_twine(loads, history, minutes, machines, tier=False)
    k8s = run_k8s(loads, minutes, machines, ack=args.ack)
    best = run_twine(loads, history, minutes, machines, tier=True, budget=budget, ack=args.ack, reserve=args.reserve,
                     oracle=True)
    hours = sorted(tier.hours)
    o, judged, missed, offered = availability(week_before, tier, machines, hours)
    o_bare, _, missed_bare, offered_bare = availability(week_before, tier, machines, hours, buffers=False)
    s = round(slo.LEVELS[0] * 100)
    print(f"the built-in diurnal week ({args.jobs} guaranteed services, flash crowd, {minutes / 60:.0f} h measured) on "
          f"{machines} machines of {SLOTS} one-core slots (the services' peak + {HEADROOM:.0%}); an MSB (a fifth of "
          f"the machines) lost for {FAILURE_FOR} min on Thursday 15:00; batch backlog of one-core tasks using "
          f"{BATCH_USE:g} core, checkpoint every {CHECKPOINT_EVERY:g} s and in {args.ack:g} s on a notice or SIGTERM")
    print(f"{'way':8} {'utilisation':>11} {'useful core-h':>13} {'held core-h':>11} {'over-target min':>15} "
          f"{'reclaims':>8} {'noticed':>7} {'batch core-h lost':>17}")
    for r in (tier, none, k8s, best):
        print(f"{r.name:8} {100 * r.utilisation:10.1f}% {r.useful / 3600:13.0f} {r.held / 3600:11.0f} {r.over:15d} "
              f"{r.reclaims:8d} {r.noticed:7d} {r.lost / 3600:17.1f}")
    print(f"opportunistic availability: {judged} hours judged against the {s} % line offered for them (from the "
          f"pool's hourly history, the week before simulated with its own loads); missed: "
          + (", ".join(f"{when(h)} (offered {o}, available {a})" for h, o, a in missed) or "none"))
    print(f"offered: {offered:.0f} machines an hour on average, the 99 % line less the failure-domain buffer of "
          f"{sum(tier.buffers.values()) / len(tier.buffers):.0f} (lent, not offered); the 99 % line itself offered "
          f"would have been {offered_bare:.0f} an hour at {o_bare:.1f}%, missing "
          + (", ".join(f"{when(h)} (offered {o}, available {a})" for h, o, a in missed_bare) or "none"))
    worse = sorted(((tier.over_in.get(h, 0) - none.over_in.get(h, 0), h) for h in set(tier.over_in) | set(none.over_in)),
                   reverse=True)[:5]
    print("over-target minutes the tier added, its worst hours: "
          + ", ".join(f"{when(h + T0 // 3600)} +{d}" for d, h in worse if d > 0))
    print(f"simulated in {time.perf_counter() - began:.0f} s of wall time")
    p_notice = 100.0 * tier.noticed / tier.reclaims if tier.reclaims else 100.0
    u, v, k = 100 * tier.utilisation, 100 * none.utilisation, 100 * k8s.utilisation
    goals = [("U >= 1.4 V", u >= 1.4 * v), ("U >= K", u >= k), ("O >= S >= 99", o >= s >= 99),
             ("P >= 95", p_notice >= 95), ("A <= 1.05 B", tier.over <= 1.05 * none.over)]
    if k > u:
        print(f"where the tier's utilisation is below k8s's ({k - u:.1f} points): {gap(tier, k8s)}")
    print(f"the ceiling of whole-machine lending (oracle: each service sized every {STEP:g} s from the true load "
          f"until tasks it asks for would serve, at the target, no tolerance, no delay, no flap budget): utilisation "
          f"{100 * best.utilisation:.1f}% "
          f"with {best.over} over-target minutes, against k8s's {k:.1f}% with {k8s.over}"
          + ("; U >= K asks more than this oracle gives at the target"
             if best.utilisation * 100 < k else ""))
    print("issue #37's goals: " + "; ".join(f"{g} {'met' if ok else 'NOT MET'}" for g, ok in goals))
    print(f"capacity: utilisation {u:.0f}% (no opportunistic tier {v:.0f}%, k8s priority {k:.0f}%); opportunistic "
          f"availability {o:.1f}% (offered SLO {s}%); reclaims with >= {NOTICE:.0f} s notice {p_notice:.0f}% (k8s 0%); "
          f"guaranteed over-target minutes {tier.over} (without the tier {none.over})")


if __name__ == "__main__":
    main()
