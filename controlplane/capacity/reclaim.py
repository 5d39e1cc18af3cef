"""Reclaims: opportunistic machines taken back, with notice, for a guaranteed entitlement.

A guaranteed job whose tasks find no machine (the free pool has none that fits) while its
entitlement is under quota is *demand*. The shard leader that schedules it picks machines of
opportunistic entitlements that would fit, the emptiest first, within a disruption budget, and
writes a reclaim event per opportunistic entitlement: its machines take no new task (cordoned),
its jobs' TaskControllers get advance notices and a `reclaim` operation per task, with the
entitlement's `notice` as the deadline. A task whose controller acks stops at once; the others stop
at the deadline. A stopped task leaves the machine (pending: placed again where there is room), and
the transaction that takes the last task off it gives the machine to the guaranteed entitlement,
the *heir*, instead of the free pool (scheduler/txn.py); its profile follows. The event is over
once none of its machines is the opportunistic entitlement's any more.

The region's *reserve* (`twinectl capacity reserve N`): opportunistic entitlements leave N free
machines of each type in each dc (the allocator's Entitlement.reserve), so a guaranteed job's
growth finds machines at once; when fewer are free, the leader of an opportunistic entitlement's
shard reclaims its machines with notice to refill it (cause `reserve`, no heir: they go to the
pool), and ends the reclaim early once the reserve is full without them.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Mapping

from controlplane.allocator import AllocationError, Snapshot, allocate
from controlplane.allocator.model import tasks_fit
from controlplane.scheduler.ops import Maintenance
from controlplane.scheduler.periodic import every
from controlplane.store.records import EntitlementRec, EventRec, JobRec, MachineRec, TaskRec
from controlplane.capacity.index import in_flight
from controlplane.store.allocview import to_entitlement, to_machine, to_placed
from controlplane.store.state import RegionState

if TYPE_CHECKING:
    from controlplane.scheduler.writer import ShardWriter

log = logging.getLogger("twine.controld.capacity")
SETTLE = 10.0  # seconds of a shard's leadership before it cancels a reclaim for want of demand


@dataclass(frozen=True)
class Budget:
    """How much of an opportunistic entitlement may be in reclaim at once: at most `machines`, and
    at most `percent` of what it holds (at least one machine); and `cooldown` seconds after a
    reclaim of it begins before the next may (a failure's excepted: it waits for nothing)."""

    machines: int = 10
    percent: float = 50.0
    cooldown: float = 0.0

    def limit(self, held: int) -> int:
        return max(1, min(self.machines, int(held * self.percent / 100.0)))

    def of(self, ent: EntitlementRec | None) -> Budget:
        """The entitlement's own budget (`reclaim` on its record), these defaults where it sets none."""
        r = (ent.reclaim if ent is not None else None) or {}
        return Budget(int(r.get("max_machines", self.machines)), float(r.get("max_percent", self.percent)),
                      float(r.get("cooldown", self.cooldown)))


@dataclass(frozen=True)
class Demand:
    """A guaranteed job's tasks that found no machine, and their size."""

    tasks: int
    cpus: float
    memory_mb: int
    machine_type: str
    dc: str | None
    cause: str = "demand"  # failure: tasks of a failed machine to place again (reclaimed without notice)


def paused(state: RegionState) -> bool:
    """`twinectl capacity pause`: no reclaim begins (those begun go on)."""
    return bool(state.capacity_settings.get("", {}).get("paused"))


def governing(state: RegionState, m: MachineRec, now: float) -> Maintenance | None:
    """The reclaim that governs the machine's tasks now, as the reconciler sees it: one is open
    and the machine is still the opportunistic entitlement's."""
    e = state.reclaims.get(m.id)
    if e is None or m.entitlement != e.scope:
        return None
    return Maintenance(e.id, now >= e.due, e.due, e.until, "stop", kind="reclaim", heir=e.heir)


def notices(state: RegionState, tasks: Mapping[int, TaskRec], live, now: float) -> list[dict]:
    """Advance notices of the reclaims that cover the machines of the job's live tasks (paper
    Figure 8 `advanceNotices`, as maintenance's, with `kind: reclaim`)."""
    if not state.reclaims:  # (every pass of a job with a TaskController asks)
        return []
    out: dict[str, dict] = {}
    for i, t in sorted(tasks.items()):
        e = state.reclaims.get(t.machine) if t.machine else None
        m = state.machines.get(t.machine) if e is not None else None
        if e is None or m is None or m.entitlement != e.scope or i not in live:
            continue
        n = out.setdefault(e.id, {"id": e.id, "kind": "reclaim", "machines": [], "start": e.start, "deadline": e.due,
                                  "duration": None, "end": None, "phase": e.phase(now), "reason": e.reason,
                                  "tasks": []})
        if t.machine not in n["machines"]:
            n["machines"].append(t.machine)
        n["tasks"].append(i)
    return [dict(n, machines=sorted(n["machines"])) for n in out.values()]


def per_machine(m: MachineRec, cpus: float, memory_mb: int) -> int:
    """Tasks of that size the machine holds when empty."""
    return tasks_fit(float(m.capacity.get("cpus", 0)), int(m.capacity.get("memory_mb", 0)), cpus, memory_mb)


def free_slots(state: RegionState, m: MachineRec, cpus: float, memory_mb: int) -> int:
    """Tasks of that size the machine has room for now."""
    _, held_cpus, held_mb = state.allocated(m.id)
    return tasks_fit(float(m.capacity.get("cpus", 0)) - held_cpus,
                     int(m.capacity.get("memory_mb", 0)) - held_mb, cpus, memory_mb)


def emptiest(state: RegionState, machines) -> list[MachineRec]:
    """The machines, those holding fewest tasks (then cpus) first."""
    return sorted(machines, key=lambda m: (*state.allocated(m.id)[:2], m.id))


def choose(state: RegionState, handle: str, d: Demand, budget: Budget, now: float) -> dict[str, list[str]]:
    """Machines to take back for one guaranteed job's demand, by opportunistic entitlement: as
    many as its tasks need (less what is in flight for its entitlement already), within its
    entitlement's quota and each opportunistic entitlement's budget (its own, else `budget`: in
    flight, and for demand its cool-down since its last reclaim began), the emptiest first."""
    job = state.jobs.get(handle)
    ent = state.entitlements.get(job.entitlement) if job is not None else None
    if ent is None or ent.kind != "guaranteed":
        return {}
    pending = in_flight(state, heir=ent.name)
    room = ent.quota - len(state.machines_of(ent.name)) - pending
    fitting = [m for m in candidates(state, d.machine_type, d.dc, now) if per_machine(m, d.cpus, d.memory_mb) >= 1]
    if not fitting or room <= 0:
        return {}
    per = per_machine(fitting[0], d.cpus, d.memory_mb)
    # room on what it holds (a machine handed over by an earlier reclaim, not yet used) counts first
    slots = sum(free_slots(state, m, d.cpus, d.memory_mb) for m in state.machines_of(ent.name) if m.healthy)
    want = min(room, math.ceil(max(0, d.tasks - slots) / per) - pending)
    chosen: dict[str, list[str]] = {}
    for m in emptiest(state, fitting):
        if want <= 0:
            break
        name = m.entitlement
        own = budget.of(state.entitlements.get(name))
        if in_flight(state, scope=name) + len(chosen.get(name, ())) >= own.limit(len(state.machines_of(name))):
            continue
        if d.cause != "failure" and name not in chosen and now - state.reclaims.began.get(name, -math.inf) < own.cooldown:
            continue
        chosen.setdefault(name, []).append(m.id)
        want -= 1
    return chosen


class Reclaimer:
    """At a shard's leader: reclaims for its guaranteed jobs' demand (`demand`, kept by the
    scheduler's passes), and the end of its reclaims once their machines have left."""

    def __init__(self, state: RegionState, writer: "ShardWriter", shard: int, lock: asyncio.Lock,
                 demand: dict[str, Demand], budget: Budget = Budget(), interval: float = 1.0):
        self.state, self.writer, self.shard, self.lock = state, writer, shard, lock
        self.demand, self.budget, self.interval = demand, budget, interval
        self.began = time.monotonic()
        self.counters = {"reclaims": 0, "machines": 0, "ended": 0, "cancelled": 0, "conflicts": 0, "errors": 0}

    async def run(self) -> None:
        await every(self.interval, self.state, self.step, self.counters, log, f"shard {self.shard}: reclaims")

    def _mine(self, e: EventRec) -> bool:
        """Its heir's shard's; a reclaim for the reserve (no heir), its opportunistic entitlement's."""
        ent = self.state.entitlements.get(e.heir or e.scope or "")
        return ent is not None and ent.shard == self.shard

    def _needed(self, e: EventRec, wanting: set[str]) -> bool:
        """Whether what the reclaim was for still wants its machines: its heir's demand, or the
        reserve of its machines' type and dc not full without them."""
        if e.heir is not None:
            return e.heir in wanting
        m = next((m for mid in e.machines if (m := self.state.machines.get(mid)) is not None), None)
        return m is not None and free_in(self.state, m.labels.get("machine_type", ""), m.labels.get("dc", "")) \
            < self.state.reserve

    async def step(self, now: float) -> None:
        st = self.state
        wanting = {st.jobs[h].entitlement for h in self.demand if h in st.jobs}
        for e in sorted({e.id: e for e in st.reclaims.values()}.values(), key=lambda e: e.id):
            if not self._mine(e):
                continue
            if all((m := st.machines.get(mid)) is None or m.entitlement != e.scope for mid in e.machines):
                await self._write(replace(e, end=now))
                self.counters["ended"] += 1
                log.info("reclaim %s over: its machines left %s", e.id, e.scope)
            elif not self._needed(e, wanting) and time.monotonic() - self.began > SETTLE:
                # its heir's tasks found room (or went), or the reserve is full: the rest stay where
                # they are (not in a new leader's first seconds: its demand is known once its passes
                # have seen the jobs)
                await self._write(replace(e, end=now, reason=f"{e.reason}; ended: {e.heir or 'the reserve'} needs no more"))
                self.counters["cancelled"] += 1
                log.info("reclaim %s cancelled: %s needs no more machines", e.id, e.heir or "the reserve")
        if paused(st):
            return
        for handle, d in sorted(self.demand.items()):
            job = st.jobs.get(handle)
            if job is None or st.shard_of_job(handle) != self.shard:
                self.demand.pop(handle, None)
                continue
            for name, machines in sorted(choose(st, handle, d, self.budget, now).items()):
                opp = st.entitlements[name]
                notice = 0.0 if d.cause == "failure" else opp.notice  # a failure waits for no notice
                e = EventRec(f"reclaim-{int(now)}-{secrets.token_hex(3)}", "reclaim", tuple(sorted(machines)), now,
                             f"{handle}: {d.tasks} task(s) found no machine", None, now + notice, None, name,
                             None, now, heir=job.entitlement, cause=d.cause)
                await self._write(e, machines)
                self.counters["reclaims"] += 1
                self.counters["machines"] += len(machines)
                log.warning("reclaim %s: %d machine(s) of %s for %s (%s, %s), notice %.0f s", e.id, len(machines), name,
                            job.entitlement, e.reason, d.cause, notice)
        for (name, _, _), (machines, why) in sorted(refill(st, self.shard, self.budget, now).items()):
            e = EventRec(f"reclaim-{int(now)}-{secrets.token_hex(3)}", "reclaim", tuple(sorted(machines)), now, why,
                         None, now + st.entitlements[name].notice, None, name, None, now, heir=None, cause="reserve")
            await self._write(e, machines)
            self.counters["reclaims"] += 1
            self.counters["machines"] += len(machines)
            log.warning("reclaim %s: %d machine(s) of %s for the reserve (%s), notice %.0f s", e.id, len(machines),
                        name, why, e.due - now)

    async def _write(self, e: EventRec, machines=()) -> None:
        st, keys = self.state, self.state.keys
        async with self.lock:
            txn = self.writer.txn()
            key = keys.event(e.id)
            txn.guards[key] = st.guard(key)
            for mid in machines:  # read as they were chosen: one taken meanwhile fails the write
                mkey = keys.machine(mid)
                txn.guards[mkey] = st.guard(mkey)
            txn.puts[key] = e.to_json()
            rev = await self.writer.send(txn)
        await st.wait_for(rev)


def free_in(state: RegionState, machine_type: str, dc: str) -> int:
    """Free machines of the type in the dc that take tasks (the allocator's pool: healthy, not
    cordoned), counted from the snapshot's index (a pass over its msbs, not the machines)."""
    return sum(len(b) for p, b in state.snapshot().index.bins("msb", machine_type, None).items() if p[1] == dc)


def refill(state: RegionState, shard: int, budget: Budget,
           now: float) -> dict[tuple[str, str, str], tuple[list[str], str]]:
    """Machines to take back for the reserve, by (opportunistic entitlement of this shard, machine
    type, dc), with why: one reclaim each, so that `_needed` judges it by its own group. Per type
    and dc where they hold machines, as many as the free ones fall short of the reserve, less those
    coming back from reserve reclaims in flight; the emptiest first, within each entitlement's
    budget and cool-down."""
    reserve = state.reserve
    if reserve <= 0:
        return {}
    ours = {n for n, e in state.entitlements.items() if e.kind == "opportunistic" and e.shard == shard}
    coming: dict[tuple[str, str], int] = {}
    for mid, e in state.reclaims.items():
        if e.heir is None and (m := state.machines.get(mid)) is not None and m.entitlement == e.scope:
            key = (m.labels.get("machine_type", ""), m.labels.get("dc", ""))
            coming[key] = coming.get(key, 0) + 1
    groups = {(m.labels.get("machine_type", ""), m.labels.get("dc", "")) for n in ours for m in state.machines_of(n)}
    chosen: dict[tuple[str, str, str], tuple[list[str], str]] = {}
    for mtype, dc in sorted(groups):
        free = free_in(state, mtype, dc)
        want = reserve - free - coming.get((mtype, dc), 0)
        why = f"the reserve: {free} of {reserve} free {mtype} machine(s) in {dc}"
        for m in emptiest(state, (m for m in candidates(state, mtype, dc, now) if m.entitlement in ours)):
            if want <= 0:
                break
            own = budget.of(state.entitlements.get(m.entitlement))
            taking = sum(len(ms) for (name, _, _), (ms, _) in chosen.items() if name == m.entitlement)
            if in_flight(state, scope=m.entitlement) + taking >= own.limit(len(state.machines_of(m.entitlement))):
                continue
            if not taking and now - state.reclaims.began.get(m.entitlement, -math.inf) < own.cooldown:
                continue
            key = (m.entitlement, mtype, dc)
            chosen[key] = ([*chosen.get(key, ([], ""))[0], m.id], why)
            want -= 1
    return chosen


def candidates(state: RegionState, machine_type: str, dc: str | None, now: float) -> list[MachineRec]:
    """Opportunistic machines a reclaim could take: healthy, of the type (and dc), in no reclaim
    or maintenance."""
    out = []
    for name, opp in state.entitlements.items():
        if opp.kind != "opportunistic":
            continue
        for m in state.machines_of(name):
            if (m.healthy and m.id not in state.reclaims and m.labels.get("machine_type") == machine_type
                    and (dc is None or m.labels.get("dc") == dc) and state.maintenance.of(m.id, now) is None):
                out.append(m)
    return out


def fits_with_reclaims(state: RegionState, job: JobRec, now: float) -> bool:
    """Whether a guaranteed job that does not fit now would, on its entitlement's machines and the
    opportunistic machines a reclaim could give it (within its quota): then it is taken, its tasks
    pending until the reclaim hands the machines over. The allocator's own answer, on a snapshot of
    just those machines (the free pool left out: it did not fit there)."""
    ent = state.entitlements.get(job.entitlement)
    if ent is None or ent.kind != "guaranteed":
        return False
    mtype, dc = job.machine_type or ent.machine_type, job.dc or ent.spread.pinned_dc
    spare = candidates(state, mtype, dc, now)
    room = ent.quota - len(state.machines_of(ent.name)) - in_flight(state, heir=ent.name)
    if not spare or room <= 0:
        return False
    spare = emptiest(state, spare)[:room]
    own = state.machines_of(ent.name)
    machines = [to_machine(m, 0, m.id in state.reclaims) for m in own] + \
               [replace(to_machine(m, 0), entitlement=None) for m in spare]
    tasks = [p for m in own for t in state.tasks_on(m.id) if t.job != job.handle and (p := to_placed(t)) is not None]
    snap = Snapshot.build(machines, [replace(to_entitlement(ent), quota=len(own) + len(spare))], tasks)
    from controlplane.scheduler.placement import job_request  # (it imports the transaction, which imports this)

    try:
        allocate(snap, job_request(job))
    except AllocationError:
        return False
    return True
