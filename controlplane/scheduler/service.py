"""The scheduler service: runs the pure reconciler for every job, places what needs a machine with
the allocator, and commits each step in one etcd transaction guarded by the mod revisions of the
records it read (the job, its tasks, every machine whose allocation changes, the entitlement when
it takes or returns machines). A lost race is a Conflict: the next pass sees the winner's write.

The same transaction keeps, per machine, the resources its tasks hold and its entitlement: a free
machine joins the entitlement when a task is placed on it, and returns to the free pool when its
last task leaves (paper Figure 7); a task leaving an unhealthy machine stays there as a tombstone
until its agent reports its container gone (controlplane/tombstones.py). Discovery records are
written in the transaction that changes the task they describe, so a task is disabled before its
agent can see it stopped or moved.

One Scheduler is one shard (paper section 3.1): it schedules the jobs of the entitlements the
entitlement-to-shard map gives it, and runs only in the process that leads the shard
(controlplane/coordination.py). Every transaction it commits carries two more guards: the
leadership's fence (the leader key at its epoch: a deposed leader commits nothing) and the
entitlement's record (a move to another shard rewrites it: the old owner's next commit fails
before it acts on a job it no longer owns).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque

import aiohttp
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping

from controlplane.allocator import AllocationCache, AllocationError, JobRequest, Placement, SoftPreference, allocate
from controlplane.metrics import Lifecycle, Metrics
from controlplane.records import ApiError, Endpoint, JobRec, TaskRec, back_to_pool
from controlplane.sealing import TOKEN, SealingError
from controlplane.scheduler.ratelimit import Limiter, Limits
from controlplane.scheduler.reconcile import Gate, JobPlan, MachineView, Maintenance, Op, reconcile
from controlplane.taskcontrol.session import TaskControlSession, unhealthy
from controlplane.state import RegionState
from controlplane.store import Conflict, Store, TooLarge, Unavailable, Versioned
from controlplane.store.etcd import encode
from controlplane.store.keys import Keys

if TYPE_CHECKING:
    from controlplane.coordination import Fence

log = logging.getLogger("twine.controld.scheduler")
Reports = Callable[[str], Mapping[tuple[str, int], dict] | None]
PASS_INTERVAL = 1.0  # jobs not settled are looked at again this often
RESYNC_INTERVAL = 30.0  # every job is looked at once in this long, whatever the queue says (a safety net)
MAX_TXN_BYTES = 1024 * 1024  # about what one transaction may weigh: etcd's default request limit is 1.5 MiB
PASS_SLICE = 0.02  # seconds of passes over jobs between two chances for everything else to run
CREATE_RETRIES = 8
MAINTENANCE_GRACE = 120.0  # seconds after a maintenance for its silent machines to come back


def task_bytes(job: JobRec) -> int:
    """About what one task change of the job weighs in a transaction: its task record (which
    carries the template), its discovery record, its machine's record, their keys."""
    return 1024 + len(encode(job.task))


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
                 maintenance_policy: str = "move", shard: int = 0, fence: "Fence | None" = None,
                 max_txn_ops: int = 128, metrics: Metrics | None = None):
        self.state = state
        self.metrics = metrics or Metrics()
        self.lifecycle = Lifecycle(self.metrics)
        self.shard = shard
        self.fence = fence  # None: a lone scheduler with no election (tests of the scheduler alone)
        self.deposed = ""  # why this shard's leadership ended (set by the daemon)
        self.elected_at = time.time()
        self.first_commit_at: float | None = None  # wall time of the first commit as leader
        self.maintenance_policy = maintenance_policy  # for jobs without a TaskController, unless the event says
        self.limiter = Limiter(limits, shard)
        self.limiter.load(state.ratelimits)
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
        self.lock = asyncio.Lock()  # the shard's commits do not race each other
        self._creates: deque[tuple[JobRec, int, asyncio.Future]] = deque()  # creates waiting for a batch
        self._creator: asyncio.Task | None = None
        self.plans: dict[str, JobPlan] = {}
        self.messages: dict[str, str] = {}  # why a job's tasks cannot be placed, for job status
        self.unsettled: set[str] = set()  # jobs to look at again in PASS_INTERVAL
        self.max_txn_ops = max_txn_ops
        self.counters = {"passes": 0, "job_passes": 0, "commits": 0, "batches": 0, "conflicts": 0, "placements": 0, "errors": 0,
                         "rate_limited": 0}

    # -- the loop ----------------------------------------------------------------------------

    async def run(self) -> None:
        """A work queue, not a pass over every job after every change: the jobs a change reaches
        (the watch says which), plus every PASS_INTERVAL the jobs not settled (something pending,
        held, waiting for a time or a machine) and a slice of all of them, so that every job is
        looked at once per RESYNC_INTERVAL whatever the queue says (a safety net, spread out:
        no pause that grows with the number of jobs)."""
        queue = self.state.changed.subscribe()
        last_retry = time.monotonic()
        cursor = 0
        try:
            while not self.deposed:
                # A cancel a pass swallowed (the store turns an etcd call's error under a cancel
                # back into the cancel; another call might not) must still end the loop: else the
                # depose awaiting it never returns (issue #12: a scheduler frozen past its lease
                # went on failing its fenced commits and never led again).
                if (me := asyncio.current_task()) is not None and me.cancelling():
                    raise asyncio.CancelledError()
                jobs, everything = queue.take()
                now = time.monotonic()
                if self.state.stale:  # plans from a view behind etcd would only fail or conflict
                    pass
                elif everything:
                    await self.pass_all()
                    last_retry = now
                else:
                    if now - last_retry >= PASS_INTERVAL:
                        jobs |= self.unsettled
                        every = list(self.state.jobs)  # every shard's: a copy of the keys, no more
                        step = int(max(1, -(-len(every) * PASS_INTERVAL // RESYNC_INTERVAL)))
                        if cursor >= len(every):
                            cursor = 0
                        jobs.update(h for h in every[cursor:cursor + step] if self.owns(h))
                        cursor += step
                        last_retry = now
                    await self.pass_jobs(jobs)
                try:
                    await asyncio.wait_for(queue.event.wait(), max(0.0, last_retry + PASS_INTERVAL - time.monotonic()))
                except TimeoutError:
                    pass
        finally:
            # deposed or stopping: no call to a TaskController goes on after the leadership
            self.state.changed.unsubscribe(queue)
            for session in self.sessions.values():
                await session.close()
            if self._http is not None:
                await self._http.close()

    def owns(self, handle: str) -> bool:
        return self.state.shard_of_job(handle) == self.shard

    def http(self) -> aiohttp.ClientSession:
        if self._http is None:
            self._http = aiohttp.ClientSession()
        return self._http

    def session(self, job: JobRec) -> TaskControlSession | None:
        """The job's TaskController session: made when the job names a controller, replaced when
        the URL changes, dropped when it names none."""
        s = self.sessions.get(job.handle)
        if s is not None and job.controller_token != s.sealed_token:
            # the same controller, a new token: its state goes on
            s.token, s.sealed_token = self._token(job), job.controller_token
        if s is not None and (job.controller is None or s.url != job.controller or job.state != "active"):
            s.close_now()
            del self.sessions[job.handle]
            s = None
        if s is None and job.controller and job.state == "active":
            s = self.sessions[job.handle] = TaskControlSession(
                job.handle, job.controller, self.http, self.taskcontrol_interval, self.taskcontrol_timeout,
                on_answer=lambda h=job.handle: self.state.changed.set({h}), epoch=lambda: self.state.revision,
                token=self._token(job),
                round_trip=lambda seconds, ok: self.metrics.taskcontrol_round_trip.labels(
                    "ok" if ok else "error").observe(seconds))
            # operations a previous leader (or this daemon before a restart) started: the controller
            # approved them and waits to hear they completed
            for d in (self.state.taskcontrol.get(job.handle) or {}).get("in_flight", []):
                op = Op(d["kind"], d["index"], d.get("reason", ""), d["id"], d.get("machine"), d.get("cause", ""),
                        d.get("version"))
                s.in_flight[op.id] = op
            s.sealed_token = job.controller_token
        return s

    def _token(self, job: JobRec) -> str | None:
        """The job's controller_token, opened (sealed at rest). One this process cannot open is
        sent as none: the controller refuses the calls, and the job's status says so."""
        try:
            return self.state.sealer.open(job.handle, TOKEN, job.controller_token)
        except SealingError as e:
            log.error("job %s: %s; its controller is called without a token", job.handle, e)
            return None

    async def pass_all(self) -> None:
        self.counters["passes"] += 1
        # with the sessions of jobs whose entitlement moved away: pass_jobs closes those
        await self.pass_jobs({h for h in self.state.jobs if self.owns(h)} | set(self.sessions))

    async def pass_jobs(self, handles) -> None:
        slice_began = time.monotonic()
        for handle in sorted(handles):
            if self.deposed:
                return  # its commits are fenced off now: each would only conflict
            if time.monotonic() - slice_began > PASS_SLICE:
                await asyncio.sleep(0)  # a long pass lets the API and the watch in between jobs
                slice_began = time.monotonic()
            if handle in self.sessions and not self.owns(handle):
                # the job's entitlement moved to another shard: its new leader calls the controller
                self.sessions.pop(handle).close_now()
                self.plans.pop(handle, None)
            self.counters["job_passes"] += 1
            self.unsettled.add(handle)  # until its pass says otherwise
            try:
                await self.pass_job(handle)
            except Conflict:
                self.counters["conflicts"] += 1
                self.state.changed.set({handle})
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
            if job is not None and not self.owns(handle):
                self.unsettled.discard(handle)
                self.lifecycle.forget(handle)
                return
            if job is None or job.state == "stopped":
                self.lifecycle.forget(handle)
                self.limiter.forget(handle)  # per-job state ends with the job
                self.plans.pop(handle, None)
                self._held.pop(handle, None)
                self.unsettled.discard(handle)
                return
            tasks = self.state.tasks.get(handle, {})
            now = time.time()
            self.lifecycle.observe(job, tasks, self.state.machines, self.state.open_failures, now)
            views = {mid: v for mid in {t.machine for t in tasks.values() if t.machine} if (v := self.view(mid, now))}
            session = self.session(job)
            if session is not None:
                session.observe(tasks)
            gate = Gate(frozenset(session.approved) if session else None, self.limiter.available(handle))
            plan = reconcile(job, tasks, views, gate)
            if session is not None and session.withdraw_stale(plan.seen, job.count):
                # an approval given for a state that is gone starts nothing: plan again without it
                plan = reconcile(job, tasks, views, Gate(frozenset(session.approved), self.limiter.available(handle)))
            self.plans[handle] = plan
            held = {op.id for op in plan.held if op.reason.endswith("rate limited")}
            # the metric counts operations held back, each once, not passes that saw them held
            self.counters["rate_limited"] += len(held - self._held.get(handle, set()))
            self._held[handle] = held
            if session is not None:
                session.offer(plan.proposed, unhealthy(plan.view, job.count), self.notices(tasks, job.count, now))
            started = [op.id for op in plan.ops if op.id]
            tc = self._in_flight_record(handle, session, plan, started)
            if not plan.empty():
                for op in plan.ops:
                    log.info("%s %s", handle, op)
                rev = await self.commit(job, plan.changes, job_put=plan.job, destructive=plan.destructive, extra=tc)
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
                rev = await self.commit_placement(job, placement, plan.place, destructive=plan.destructive, extra=tc)
                self._started(handle, plan, started, session)
                await self.state.wait_for(rev)
                return
            if self._settled(job, tasks, views, plan, session):
                self.unsettled.discard(handle)

    def _settled(self, job: JobRec, tasks: Mapping[int, TaskRec], views: Mapping[str, MachineView], plan: JobPlan,
                 session: TaskControlSession | None) -> bool:
        """Nothing for the job to do until something changes (which the watch will say): every
        task runs at the job's version on a healthy machine with no maintenance, nothing is held
        or waiting, and its TaskController has nothing pending."""
        if job.state != "active" or job.handle in self.messages or plan.held or plan.waiting or plan.proposed \
                or plan.rate_limited:
            return False
        if session is not None and (session.pending or session.approved or session.in_flight or session.notices
                                    or session.completed):
            return False
        if len(tasks) != job.count:
            return False
        for t in tasks.values():
            v = views.get(t.machine) if t.machine else None
            # starting or allocated: waiting for the agent's report or the machine's profile, each
            # of which wakes the job when it changes (the watch, the broker), not for a time
            if t.state not in ("running", "starting", "allocated") or t.spec_version != job.spec_version \
                    or v is None or not v.healthy or v.maintenance is not None:
                return False
        return True

    def _in_flight_record(self, handle: str, session: TaskControlSession | None, plan: JobPlan,
                          started: list[str]) -> dict[str, dict]:
        """The job's TaskController operations in flight once this commit lands, written with it
        when they differ from etcd's: a new leader tells the controller when they complete."""
        if session is None:
            return {}
        by_id = {op.id: op for op in plan.ops}
        ops = {**session.in_flight, **{i: by_id[i] for i in started if i in by_id}}
        record = {"in_flight": [{"id": op.id, "kind": op.kind, "index": op.index, "reason": op.reason,
                                 "machine": op.machine, "cause": op.cause, "version": op.version}
                                for _, op in sorted(ops.items())]}
        if record == (self.state.taskcontrol.get(handle) or {"in_flight": []}):
            return {}
        return {self.keys.taskcontrol(handle): record}

    def _started(self, handle: str, plan: JobPlan, started: list[str], session: TaskControlSession | None) -> None:
        """After a commit: the approved operations it carried out are in flight for the
        TaskController (their rate-limit tokens were taken in the commit)."""
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
            # on a machine whose profile is already the one it will want (the reconciler's own
            # test), the task starts in this commit: one transaction, not a second one to start it
            state = "starting" if self._ready_for(job, mid) else "allocated"
            out.append((old, TaskRec(job.handle, i, job.spec_version, job.task, mid, state, why, False, now)))
        return out

    def _ready_for(self, job: JobRec, mid: str) -> bool:
        m = self.state.machines.get(mid)
        return m is not None and self.state.profile_ready(m, joining=job.entitlement)

    def placement_changes(self, job: JobRec, placement: Placement, indices: tuple[int, ...],
                          deletes: tuple[TaskRec, ...] = ()) -> tuple[list[tuple[TaskRec | None, TaskRec | None]], set[str]]:
        """The task changes a placement makes for tasks `indices` (with `deletes` removed), and
        the free machines it takes."""
        new_tasks = set(placement.new_tasks)  # once: per index it made a job's placement quadratic in its size
        chosen = tuple(i for i in indices if i in new_tasks)
        changes: list[tuple[TaskRec | None, TaskRec | None]] = list(self.new_tasks(job, placement, chosen))
        changes += [(t, None) for t in deletes]
        taken = {placement.machine_of(i) for i in chosen} & set(placement.machines_taken)
        return changes, taken

    async def commit_placement(self, job: JobRec, placement: Placement, indices: tuple[int, ...],
                               job_put: JobRec | None = None, deletes: tuple[TaskRec, ...] = (),
                               destructive: int = 0, extra: dict[str, dict] | None = None) -> int:
        changes, taken = self.placement_changes(job, placement, indices, deletes)
        rev = await self.commit(job, changes, job_put=job_put, taken=taken, destructive=destructive, extra=extra)
        self.counters["placements"] += 1
        for old, new in changes:
            if new is not None:
                log.info("%s #%d -> %s (%s)", job.handle, new.index, new.machine, new.reason)
        return rev

    async def commit(self, job: JobRec, changes: list[tuple[TaskRec | None, TaskRec | None]],
                     job_put: JobRec | None = None, taken: set[str] = frozenset(), destructive: int = 0,
                     extra: dict[str, dict] | None = None) -> int:
        """Commit a job's task changes in transactions that fit etcd's limit on operations
        (`max_txn_ops`, etcd's default 128): one when they fit, else bounded batches, each waited
        for before the next is computed. The job record is the recorded intent: a new job's goes in
        the first batch (no task ever exists without its job) and a stopped job's in the last (it
        is stopped once its tasks are gone). If a batch loses a race, what landed stays and the
        reconciler, level-triggered, does the rest from the job record on its next pass."""
        per_batch = max(1, (self.max_txn_ops - 8) // 5)  # a task: its record, discovery, machine; guards
        # and in bytes: each task's record carries the job's template
        per_batch = max(1, min(per_batch, MAX_TXN_BYTES // task_bytes(job)))
        if len(changes) <= per_batch:
            return await self._commit_one(job, changes, job_put, taken, destructive, extra)
        batches = [changes[i:i + per_batch] for i in range(0, len(changes), per_batch)]
        last = len(batches) - 1
        job_first = job_put is not None and job_put.state != "stopped"
        rev = 0
        for n, batch in enumerate(batches):
            machines = {t.machine for pair in batch for t in pair if t is not None and t.machine}
            rev = await self._commit_one(
                job, batch, job_put if (n == 0 if job_first else n == last) else None, set(taken) & machines,
                destructive if n == 0 else 0, extra if n == last else None)
            self.counters["batches"] += 1
            if n < last:
                await self.state.wait_for(rev)  # the next batch's guards are this one's results
        return rev

    async def _commit_one(self, job: JobRec, changes: list[tuple[TaskRec | None, TaskRec | None]],
                          job_put: JobRec | None = None, taken: set[str] = frozenset(), destructive: int = 0,
                          extra: dict[str, dict] | None = None) -> int:
        """One transaction for a job's task changes and everything that follows from them, fenced
        by this shard's leadership and the job's entitlement record (its shard)."""
        txn = Txn(self)
        txn.add(job, changes, job_put, taken, extra)
        if destructive:
            for scope, record in self.limiter.take(job.handle, destructive).items():
                rkey = self.keys.ratelimit(scope)
                txn.guards[rkey] = self.state.guard(rkey)  # the region's bucket is shared by every shard
                txn.puts[rkey] = record
        try:
            return await self._send(txn)
        except BaseException:
            if destructive:
                self.limiter.load(self.state.ratelimits)  # the tokens were not spent
            raise

    async def _send(self, txn: "Txn") -> int:
        rev = await self.store.commit(*txn.finish())
        self.counters["commits"] += 1
        if self.first_commit_at is None:
            self.first_commit_at = time.time()
            log.warning("shard %d: first commit as leader %.3fs after the election", self.shard,
                        self.first_commit_at - self.elected_at)
        return rev

    # -- front-end operations ----------------------------------------------------------------

    async def create(self, job: JobRec, read_revision: int) -> int:
        """Place a new job and commit it with its tasks, provided the job's record is still as the
        front end read it (absent, or a stopped job: `read_revision`). AllocationError: it cannot
        fit; Conflict: someone else wrote the job. Nothing is written then.

        Group commit: creates that arrive while a transaction is in flight go together into the
        next one, as many as fit in etcd's limits, each placed on the snapshot as the ones before
        it in the batch left it. One round trip to etcd and one watch event then serve them all,
        where one create at a time made the shard's creates wait for each other's round trip."""
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._creates.append((job, read_revision, fut))
        if self._creator is None or self._creator.done():
            self._creator = asyncio.create_task(self._create_batches(), name=f"creates-{self.shard}")
        return await fut

    def _beyond(self, job: JobRec) -> tuple[TaskRec, ...]:
        """A re-run job's tasks beyond its new count: its create deletes them."""
        return tuple(t for t in self.state.tasks.get(job.handle, {}).values() if t.index >= job.count)

    def _fits(self, txn: Txn, job: JobRec) -> bool:
        return txn.fits(job.count + len(self._beyond(job)), self.max_txn_ops, task_bytes(job))

    def _fail(self, members: list[tuple[JobRec, int, asyncio.Future]], e: BaseException) -> None:
        for _, _, fut in members:
            if not fut.done():
                fut.set_exception(e if isinstance(e, Exception) else self._deposed_error())

    async def _create_batches(self) -> None:
        try:
            while self._creates:
                job, read_revision, fut = self._creates[0]
                if fut.done():
                    self._creates.popleft()
                elif not self._fits(Txn(self), job):
                    self._creates.popleft()  # too large for one transaction: alone, in bounded batches
                    await _settle(fut, self._create_alone(job, read_revision))
                else:
                    head = self._creates[0]
                    try:
                        await self._create_batch()
                    except Exception as e:  # its creates have their answer; the next batch may fare better
                        log.warning("shard %d: a batch of creates failed: %s", self.shard, e)
                        if self._creates and self._creates[0] is head:  # failed before taking any: answer
                            self._creates.popleft()                    # the first, so that the loop moves on
                            if not head[2].done():
                                head[2].set_exception(e)
        finally:
            # cancelled (or a bug): no create waits for an answer that will not come
            while self._creates:
                fut = self._creates.popleft()[2]
                if not fut.done():
                    fut.set_exception(self._deposed_error())

    async def _create_batch(self) -> None:
        members: list[tuple[JobRec, int, asyncio.Future]] = []
        later: list[tuple[JobRec, int, asyncio.Future]] = []  # a second create of a job in the batch
        async with self.lock:
            txn = Txn(self)
            snap = self.state.snapshot()
            while self._creates:
                job, read_revision, fut = self._creates[0]
                if not self._fits(txn, job):
                    break
                self._creates.popleft()
                if fut.done():
                    continue
                if self.deposed:
                    fut.set_exception(self._deposed_error())
                    continue
                if job.handle in txn.jobs:
                    later.append((job, read_revision, fut))
                    continue
                if self.state.revs.get(self.keys.job(job.handle), 0) != read_revision:
                    fut.set_exception(Conflict(f"job {job.handle} was written concurrently"))
                    continue
                try:
                    placement = allocate(snap, job_request(job), cache=self.cache)
                    changes, taken = self.placement_changes(job, placement, tuple(range(job.count)), self._beyond(job))
                    txn.add(job, changes, job_put=job, taken=taken)
                except Exception as e:  # AllocationError, most often: this create's answer
                    fut.set_exception(e)
                    continue
                snap.apply_placement(placement)  # the next create in the batch sees these tasks
                members.append((job, read_revision, fut))
            self._creates.extendleft(reversed(later))
            if not members:
                return
            try:
                rev = await self._send(txn)
            except BaseException as e:
                # the snapshot drops the placements that did not land
                self.state.reread(txn.machines(), txn.tasks)
                if not isinstance(e, (Conflict, TooLarge)):
                    self._fail(members, e)
                    if not isinstance(e, Exception):
                        raise  # cancelled
                    return
                rev = 0
            else:
                self.counters["placements"] += len(members)
        if not rev:  # one create of the batch lost a race, or etcd found the batch too large: each alone
            self.counters["conflicts"] += 1
            for job, read_revision, fut in members:
                await _settle(fut, self._create_alone(job, read_revision))
            return
        try:
            await self.state.wait_for(rev)  # read-your-writes, as a create alone (TimeoutError: etcd went away)
        except BaseException as e:
            self._fail(members, e)
            raise
        for _, _, fut in members:
            if not fut.done():
                fut.set_result(rev)

    def _deposed_error(self) -> ApiError:
        return ApiError("unavailable", None, f"shard {self.shard}: this process no longer leads it "
                        f"({self.deposed}); retry")

    async def _create_alone(self, job: JobRec, read_revision: int) -> int:
        for attempt in range(CREATE_RETRIES):
            if self.deposed:
                raise self._deposed_error()
            async with self.lock:
                if self.state.revs.get(self.keys.job(job.handle), 0) != read_revision:
                    raise Conflict(f"job {job.handle} was written concurrently")
                placement = allocate(self.state.snapshot(), job_request(job), cache=self.cache)
                try:
                    rev = await self.commit_placement(job, placement, tuple(range(job.count)), job_put=job,
                                                      deletes=self._beyond(job))
                except Conflict:
                    if self.state.revs.get(self.keys.job(job.handle), 0) != read_revision \
                            and self.state.jobs.get(job.handle) == job:
                        # a batched create whose first batch (with the job) landed: the job exists;
                        # the scheduler places what a later batch could not
                        self.state.changed.set({job.handle})
                        return self.state.revision
                    # another writer (a replica) changed a machine we chose: see its write, place again
                    self.counters["conflicts"] += 1
                    await asyncio.sleep(0.01 * 2**attempt)
                    continue
            await self.state.wait_for(rev)
            return rev
        raise Conflict(f"{job.handle}: gave up after {CREATE_RETRIES} conflicting placements")


async def _settle(fut: asyncio.Future, work) -> None:
    """Await `work` and give its result or exception to `fut` (unless its waiter has gone)."""
    try:
        result = await work
    except Exception as e:
        if not fut.done():
            fut.set_exception(e)
    else:
        if not fut.done():
            fut.set_result(result)

class Txn:
    """One etcd transaction of a shard's scheduler, built from one or more jobs' task changes: the
    records they write, the guards on what they read (the fence, each job, its entitlement, each
    task, each machine whose allocation changes), and per machine the sum of the changes, so that
    two jobs of one transaction placing tasks on the same machine write its counters once."""

    def __init__(self, sched: Scheduler) -> None:
        self.sched = sched
        self.guards: dict[str, Versioned] = {}
        self.puts: dict[str, Any] = {}  # key -> a record's JSON dict, or the record (encoded as its to_json())
        self.deletes: list[str] = []
        self.delta: dict[str, list[float]] = {}  # machine -> [tasks, cpus, memory] it gains
        self.taken: dict[str, str] = {}  # free machine -> the entitlement it joins
        self.tombstones: dict[str, list[list]] = {}  # unhealthy machine -> tasks that left it (tombstones.py)
        self.entitlements: set[str] = set()  # entitlements whose jobs this transaction changes
        self.jobs: list[str] = []
        self.tasks: list[tuple[str, int]] = []
        self.bytes = 0  # about what the transaction's records weigh (task_bytes a task change)
        if sched.fence is not None:
            self.guards[sched.fence.key] = sched.fence.guard

    @staticmethod
    def size(count: int) -> tuple[int, int]:
        """The most guards and the most writes that a job of `count` task changes adds (etcd
        limits each list of a transaction to max-txn-ops)."""
        return 2 * count + 2, 3 * count + 2

    def fits(self, count: int, limit: int, each: int = 0) -> bool:
        """Whether `count` more task changes of `each` bytes (task_bytes) fit in this transaction."""
        g, w = self.size(count)
        return len(self.guards) + g <= limit and len(self.puts) + len(self.deletes) + w + 1 <= limit \
            and self.bytes + count * each <= MAX_TXN_BYTES

    def add(self, job: JobRec, changes: list[tuple[TaskRec | None, TaskRec | None]], job_put: JobRec | None = None,
            taken: set[str] | frozenset[str] = frozenset(), extra: dict[str, dict] | None = None) -> None:
        sched = self.sched
        keys, st = sched.keys, sched.state
        if not sched.owns(job.handle):
            raise Conflict(f"{job.handle}: its entitlement is no longer in shard {sched.shard}")
        jkey, ekey = keys.job(job.handle), keys.entitlement(job.entitlement)
        self.guards[jkey] = st.guard(jkey)
        self.guards[ekey] = st.guard(ekey)
        self.entitlements.add(job.entitlement)
        self.jobs.append(job.handle)
        self.bytes += len(changes) * task_bytes(job)
        self.puts.update(extra or {})
        if job_put is not None:
            self.puts[jkey] = job_put.to_json()
        for mid in taken:
            self.taken.setdefault(mid, job.entitlement)
        handle, guards, puts, delta = job.handle, self.guards, self.puts, self.delta
        for old, new in changes:
            index = (old or new).index
            self.tasks.append((handle, index))
            tkey = keys.task(handle, index)
            guards[tkey] = st.guard(tkey)
            for t, sign in ((old, -1), (new, 1)):
                if t is not None and t.machine:
                    cpus, mem = t.resources
                    if sign < 0 and (new is None or new.machine != t.machine) and self._unseen(t.machine):
                        # its container may still run there: the machine keeps it as a tombstone
                        self.tombstones.setdefault(t.machine, []).append([handle, index, cpus, mem, time.time()])
                        continue
                    d = delta.get(t.machine)
                    if d is None:
                        d = delta[t.machine] = [0, 0.0, 0]
                    d[0] += sign
                    d[1] += sign * cpus
                    d[2] += sign * mem
            dkey = keys.endpoint(handle, index)
            if new is None:
                puts.pop(tkey, None)
                self.deletes += [tkey, dkey]
            else:
                # records as they are: the store encodes them (the same JSON as their to_json())
                puts[tkey] = new
                if old is None or (old.machine, old.discovery, old.spec_version) != (new.machine, new.discovery, new.spec_version):
                    m = st.machines.get(new.machine) if new.machine else None
                    puts[dkey] = Endpoint(handle, index, new.machine or "", m.address if m else "",
                                          new.discovery, new.spec_version)

    def _unseen(self, mid: str) -> bool:
        """Whether the machine is one the control plane cannot see now (unhealthy): a task leaving it
        leaves a tombstone. Its record's guard makes the commit fail if that changed meanwhile."""
        m = self.sched.state.machines.get(mid)
        return m is not None and not m.healthy

    def machines(self) -> set[str]:
        return set(self.delta) | set(self.taken) | set(self.tombstones)

    def finish(self) -> tuple[list[Versioned], dict[str, Any], list[str]]:
        """The guards, puts and deletes, with each touched machine's record written once."""
        keys, st = self.sched.keys, self.sched.state
        touched: set[str] = set()
        for mid in self.machines():
            m = st.machines.get(mid)
            if m is None:
                continue  # a machine record that is gone holds nothing
            mkey = keys.machine(mid)
            self.guards[mkey] = st.guard(mkey)
            n, cpus, mem = self.delta.get(mid, (0, 0.0, 0))
            # the record as JSON, its allocation fields changed there (no second record object)
            new_m = m.to_json()
            new_m.update(alloc_tasks=m.alloc_tasks + n, alloc_cpus=round(m.alloc_cpus + cpus, 6),
                         alloc_memory_mb=m.alloc_memory_mb + mem)
            if mid in self.tombstones:
                new_m["tombstones"] = [*new_m.get("tombstones", ()), *self.tombstones[mid]]
            if mid in self.taken and m.entitlement is None:
                new_m["entitlement"] = self.taken[mid]
                touched.add(self.taken[mid])
                log.info("entitlement %s takes machine %s from the free pool", self.taken[mid], mid)
            elif (left := back_to_pool(new_m)) is not None:
                touched.add(left)
                log.info("machine %s returns from %s to the free pool", mid, left)
            self.puts[mkey] = new_m
        for name in touched:
            # Every change to what an entitlement holds writes its record: two such changes
            # race on it, so the quota is never overrun by concurrent allocations.
            if name in st.entitlements:
                ekey = keys.entitlement(name)
                self.guards.setdefault(ekey, st.guard(ekey))
                self.puts[ekey] = st.entitlements[name].to_json()
        return list(self.guards.values()), self.puts, self.deletes
