"""The scheduler service: runs the pure reconciler for every job, places what needs a machine with
the allocator, and commits each step in one etcd transaction guarded by the mod revisions of the
records it read (the job, its tasks, every machine whose allocation changes, the entitlement when
it takes or returns machines). A lost race is a Conflict: the next pass sees the winner's write.

The same transaction keeps, per machine, the resources its tasks hold and its entitlement: a free
machine joins the entitlement when a task is placed on it, and returns to the free pool when its
last task leaves (paper Figure 7). Discovery records are written in the transaction that changes
the task they describe, so a task is disabled before its agent can see it stopped or moved.
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import time
from dataclasses import replace
from typing import Callable, Mapping

from controlplane.allocator import AllocationCache, AllocationError, JobRequest, Placement, SoftPreference, allocate
from controlplane.records import Endpoint, JobRec, TaskRec
from controlplane.scheduler.ratelimit import Limiter, Limits
from controlplane.scheduler.reconcile import Gate, JobPlan, MachineView, Maintenance, reconcile
from controlplane.taskcontrol.session import TaskControlSession, unhealthy
from controlplane.state import RegionState
from controlplane.store import Conflict, Store, TooLarge, Unavailable, Versioned
from controlplane.store.keys import Keys

log = logging.getLogger("twine.controld.scheduler")
Reports = Callable[[str], Mapping[tuple[str, int], dict] | None]
PASS_INTERVAL = 1.0
CREATE_RETRIES = 8
MAINTENANCE_GRACE = 120.0  # seconds after a maintenance for its silent machines to come back


def job_request(job: JobRec, replace: tuple[int, ...] = ()) -> JobRequest:
    """The allocator's request for a job; `replace`: tasks to move although their machine is fine
    (away from a machine in maintenance)."""
    cpus, mem = job.resources()
    prefs = None if job.preferences is None else tuple(
        SoftPreference(p.property, p.strategy, p.weight) for p in job.preferences)
    return JobRequest(job.handle, job.count, cpus, mem, machine_type=job.machine_type, dc=job.dc, preferences=prefs,
                      replace=replace)


class Scheduler:
    def __init__(self, state: RegionState, store: Store, keys: Keys, reports: Reports,
                 agent_errors: Mapping[str, str] | None = None, limits: Limits = Limits(),
                 taskcontrol_interval: float = 1.0, taskcontrol_timeout: float = 2.0,
                 maintenance_policy: str = "move"):
        self.state = state
        self.maintenance_policy = maintenance_policy  # for jobs without a TaskController, unless the event says
        self.limiter = Limiter(limits)
        self.sessions: dict[str, TaskControlSession] = {}
        self._held: dict[str, set[str]] = {}  # op ids the rate limit held in a job's last pass
        self.taskcontrol_interval = taskcontrol_interval
        self.taskcontrol_timeout = taskcontrol_timeout
        self._http: aiohttp.ClientSession | None = None
        self.agent_errors = agent_errors if agent_errors is not None else {}
        self.store = store
        self.keys = keys
        self.reports = reports
        self.cache = AllocationCache()
        self.lock = asyncio.Lock()  # one shard in this process: its commits do not race each other
        self.plans: dict[str, JobPlan] = {}
        self.messages: dict[str, str] = {}  # why a job's tasks cannot be placed, for job status
        self.counters = {"passes": 0, "commits": 0, "conflicts": 0, "placements": 0, "errors": 0,
                         "rate_limited": 0}

    # -- the loop ----------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            while True:
                self.state.changed.clear()
                if not self.state.stale:  # plans from a view behind etcd would only fail or conflict
                    await self.pass_all()
                try:
                    await asyncio.wait_for(self.state.changed.wait(), PASS_INTERVAL)
                except TimeoutError:
                    pass
        finally:
            for session in self.sessions.values():
                await session.close()
            if self._http is not None:
                await self._http.close()

    def http(self) -> aiohttp.ClientSession:
        if self._http is None:
            self._http = aiohttp.ClientSession()
        return self._http

    def session(self, job: JobRec) -> TaskControlSession | None:
        """The job's TaskController session: made when the job names a controller, replaced when
        the URL changes, dropped when it names none."""
        s = self.sessions.get(job.handle)
        if s is not None and (job.controller is None or s.url != job.controller or job.state != "active"):
            s.close_now()
            del self.sessions[job.handle]
            s = None
        if s is None and job.controller and job.state == "active":
            s = self.sessions[job.handle] = TaskControlSession(
                job.handle, job.controller, self.http, self.taskcontrol_interval, self.taskcontrol_timeout,
                on_answer=self.state.changed.set)
        return s

    async def pass_all(self) -> None:
        self.counters["passes"] += 1
        for handle in sorted(self.state.jobs):
            try:
                await self.pass_job(handle)
            except Conflict:
                self.counters["conflicts"] += 1
                self.state.changed.set()
            except TooLarge as e:
                self.counters["errors"] += 1
                if self.messages.get(handle) != str(e):
                    log.error("%s: %s", handle, e)
                self.messages[handle] = str(e)
            except Unavailable:  # no job can commit now; the index's fresh read after the outage wakes us
                self.counters["errors"] += 1
                return
            except Exception:  # one job's failure must not stop the others; the next pass retries
                self.counters["errors"] += 1
                log.exception("scheduling %s failed", handle)

    def view(self, mid: str, now: float) -> MachineView | None:
        m = self.state.machines.get(mid)
        if m is None:
            return None
        e = self.state.maintenance_of(mid, now)
        until = None if e is None else e.until
        if e is None and not m.healthy:
            # Still down when its maintenance ended (powered off for the work, say): a grace to come
            # back before its suspended tasks count as lost and move.
            e = self.state.maintenance_just_over(mid, now, MAINTENANCE_GRACE)
            until = None if e is None else e.until + MAINTENANCE_GRACE
        mt = None if e is None else Maintenance(e.id, now >= e.due, e.due, until, e.policy or self.maintenance_policy)
        return MachineView(m.id, m.healthy, m.health_reason, self.state.profile_ready(m),
                           self.state.desired_profile(m), m.address, self.agent_errors.get(mid, ""), self.reports(mid),
                           mt)

    def notices(self, tasks: Mapping[int, TaskRec], count: int, now: float) -> list[dict]:
        """Advance notices for a job: each maintenance not over that covers a machine one of its
        tasks holds, with the tasks it affects."""
        out = []
        for e in self.state.open_maintenance(now):
            hit = sorted(i for i, t in tasks.items() if i < count and t.machine in e.machines)
            if hit:
                out.append({"id": e.id, "machines": sorted({tasks[i].machine for i in hit}), "start": e.start,
                            "deadline": e.due, "duration": e.duration, "end": e.until,
                            "phase": e.phase(now), "reason": e.reason, "tasks": hit})
        return out

    async def pass_job(self, handle: str) -> None:
        async with self.lock:
            job = self.state.jobs.get(handle)
            if job is None or job.state == "stopped":
                self.limiter.forget(handle)  # per-job state ends with the job
                self.plans.pop(handle, None)
                self._held.pop(handle, None)
                return
            tasks = self.state.tasks.get(handle, {})
            now = time.time()
            views = {mid: v for mid in {t.machine for t in tasks.values() if t.machine} if (v := self.view(mid, now))}
            session = self.session(job)
            if session is not None:
                session.observe(tasks)
            gate = Gate(frozenset(session.approved) if session else None, self.limiter.available(handle))
            plan = reconcile(job, tasks, views, gate)
            self.plans[handle] = plan
            held = {op.id for op in plan.held if op.reason.endswith("rate limited")}
            # the metric counts operations held back, each once, not passes that saw them held
            self.counters["rate_limited"] += len(held - self._held.get(handle, set()))
            self._held[handle] = held
            if session is not None:
                session.offer(plan.proposed, unhealthy(tasks, job.count), self.notices(tasks, job.count, now))
            started = [op.id for op in plan.ops if op.id]
            if not plan.empty():
                for op in plan.ops:
                    log.info("%s %s", handle, op)
                rev = await self.commit(job, plan.changes, job_put=plan.job)
                self._started(handle, plan, started, session)
                await self.state.wait_for(rev)
                return
            if plan.place:
                try:
                    moving = tuple(i for i in plan.place if i in tasks and tasks[i].machine)
                    placement = allocate(self.state.snapshot(), job_request(job, moving), cache=self.cache)
                except AllocationError as e:
                    if self.messages.get(handle) != e.message:
                        log.warning("%s: %s", handle, e.message)
                    self.messages[handle] = e.message
                    return
                self.messages.pop(handle, None)
                rev = await self.commit_placement(job, placement, plan.place)
                self._started(handle, plan, started, session)
                await self.state.wait_for(rev)

    def _started(self, handle: str, plan: JobPlan, started: list[str], session: TaskControlSession | None) -> None:
        """After a commit: the rate-limit tokens of its stops and moves are spent, and the approved
        operations it carried out are in flight for the TaskController."""
        self.limiter.take(handle, plan.destructive)
        if session is not None and started:
            session.started(started, plan.ops)

    def rate_limit_note(self, handle: str) -> str:
        plan = self.plans.get(handle)
        if plan is None or not plan.rate_limited:
            return ""
        return f"{plan.rate_limited} stop/move operation(s) held by the {self.limiter.which(handle)} rate limit"

    # -- transactions ------------------------------------------------------------------------

    def new_tasks(self, job: JobRec, placement: Placement, indices: tuple[int, ...]) -> list[tuple[TaskRec | None, TaskRec]]:
        existing = self.state.tasks.get(job.handle, {})
        now = time.time()
        out = []
        for i in indices:
            mid = placement.machine_of(i)
            old = existing.get(i)
            why = f"moved from {old.machine}" if old is not None and old.machine and old.machine != mid else "placed"
            out.append((old, TaskRec(job.handle, i, job.spec_version, job.task, mid, "allocated", why, False, now)))
        return out

    async def commit_placement(self, job: JobRec, placement: Placement, indices: tuple[int, ...],
                               job_put: JobRec | None = None, deletes: tuple[TaskRec, ...] = ()) -> int:
        chosen = tuple(i for i in indices if i in set(placement.new_tasks))
        changes: list[tuple[TaskRec | None, TaskRec | None]] = list(self.new_tasks(job, placement, chosen))
        changes += [(t, None) for t in deletes]
        taken = {placement.machine_of(i) for i in chosen} & set(placement.machines_taken)
        rev = await self.commit(job, changes, job_put=job_put, taken=taken)
        self.counters["placements"] += 1
        for old, new in changes:
            if new is not None:
                log.info("%s #%d -> %s (%s)", job.handle, new.index, new.machine, new.reason)
        return rev

    async def commit(self, job: JobRec, changes: list[tuple[TaskRec | None, TaskRec | None]],
                     job_put: JobRec | None = None, taken: set[str] = frozenset()) -> int:
        """One transaction for a job's task changes and everything that follows from them."""
        keys, st = self.keys, self.state
        guards: dict[str, Versioned] = {keys.job(job.handle): st.guard(keys.job(job.handle))}
        puts: dict[str, dict] = {}
        deletes: list[str] = []
        if job_put is not None:
            puts[keys.job(job.handle)] = job_put.to_json()
        delta: dict[str, list[float]] = {}
        for old, new in changes:
            index = (old or new).index
            tkey = keys.task(job.handle, index)
            guards[tkey] = st.guard(tkey)
            for t, sign in ((old, -1), (new, 1)):
                if t is not None and t.machine:
                    cpus, mem = t.resources
                    d = delta.setdefault(t.machine, [0, 0.0, 0])
                    d[0] += sign
                    d[1] += sign * cpus
                    d[2] += sign * mem
            dkey = keys.discovery(job.handle) + f"{index:06d}"
            if new is None:
                puts.pop(tkey, None)
                deletes += [tkey, dkey]
            else:
                puts[tkey] = new.to_json()
                if old is None or (old.machine, old.discovery, old.spec_version) != (new.machine, new.discovery, new.spec_version):
                    m = st.machines.get(new.machine) if new.machine else None
                    puts[dkey] = Endpoint(job.handle, index, new.machine or "", m.address if m else "",
                                          new.discovery, new.spec_version).to_json()
        ent_touched = False
        for mid in set(delta) | set(taken):
            m = st.machines.get(mid)
            if m is None:
                continue  # a machine record that is gone holds nothing
            mkey = keys.machine(mid)
            guards[mkey] = st.guard(mkey)
            n, cpus, mem = delta.get(mid, (0, 0.0, 0))
            new_m = replace(m, alloc_tasks=m.alloc_tasks + n, alloc_cpus=round(m.alloc_cpus + cpus, 6),
                            alloc_memory_mb=m.alloc_memory_mb + mem)
            if mid in taken and m.entitlement is None:
                new_m = replace(new_m, entitlement=job.entitlement)
                ent_touched = True
                log.info("entitlement %s takes machine %s from the free pool", job.entitlement, mid)
            elif new_m.alloc_tasks <= 0 and m.entitlement is not None:
                new_m = replace(new_m, entitlement=None, alloc_tasks=0, alloc_cpus=0.0, alloc_memory_mb=0)
                ent_touched = True
                log.info("machine %s returns from %s to the free pool", mid, m.entitlement)
            puts[mkey] = new_m.to_json()
        if ent_touched:
            # Every change to what an entitlement holds writes its record: two such changes
            # race on it, so the quota is never overrun by concurrent allocations.
            ekey = keys.entitlement(job.entitlement)
            guards[ekey] = st.guard(ekey)
            puts[ekey] = st.entitlements[job.entitlement].to_json()
        rev = await self.store.commit(list(guards.values()), puts, deletes)
        self.counters["commits"] += 1
        return rev

    # -- front-end operations ----------------------------------------------------------------

    async def create(self, job: JobRec, read_revision: int) -> int:
        """Place a new job and commit it with its tasks in one transaction, provided the job's
        record is still as the front end read it (absent, or a stopped job: `read_revision`).
        AllocationError: it cannot fit; Conflict: someone else wrote the job. Nothing is written."""
        for attempt in range(CREATE_RETRIES):
            async with self.lock:
                if self.state.revs.get(self.keys.job(job.handle), 0) != read_revision:
                    raise Conflict(f"job {job.handle} was written concurrently")
                placement = allocate(self.state.snapshot(), job_request(job), cache=self.cache)
                old = tuple(t for t in self.state.tasks.get(job.handle, {}).values() if t.index >= job.count)
                try:
                    rev = await self.commit_placement(job, placement, tuple(range(job.count)), job_put=job, deletes=old)
                except Conflict:
                    # another writer (a replica) changed a machine we chose: see its write, place again
                    self.counters["conflicts"] += 1
                    await asyncio.sleep(0.01 * 2**attempt)
                    continue
            await self.state.wait_for(rev)
            return rev
        raise Conflict(f"{job.handle}: gave up after {CREATE_RETRIES} conflicting placements")

    async def check_fits(self, job: JobRec) -> None:
        """Raise AllocationError if the job (as it would be) cannot be placed now."""
        async with self.lock:
            allocate(self.state.snapshot(), job_request(job))

    async def put_job(self, job: JobRec, read_revision: int) -> int:
        """Write a job record the front end derived from the one it read at `read_revision`:
        Conflict if anything wrote the job since (no lost update)."""
        async with self.lock:
            key = self.keys.job(job.handle)
            rev = await self.store.commit([Versioned(key, None, read_revision)], {key: job.to_json()})
        await self.state.wait_for(rev)
        return rev
