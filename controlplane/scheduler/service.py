"""A scheduler shard (paper 3.1): the jobs of the entitlements the entitlement-to-shard map gives
it, run only in the process that leads the shard (coordination/coordinator.py).

Each pass over a job reads three ways and acts once:
- observe: the job, its tasks, what is known of their machines (health, profile, the agent's
  report, maintenance), its TaskController session;
- decide: the pure reconciler (reconcile.py) turns that into a plan, gated by the controller's
  approvals and by the destructive rate limits' budget;
- act: the controller is offered what needs its approval, and the plan is committed in one etcd
  transaction guarded by the revisions it was computed from (writer.py, txn.py), or, for tasks
  that need a machine, placed by the allocator and committed so. A lost race is a Conflict: the
  next pass sees the winner's write.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable, Mapping

from controlplane.allocator import AllocationError, Placement, allocate
from controlplane.allocator.errors import AllocatorInconsistency, NoPlacement
from controlplane.capacity import reclaim
from controlplane.opsplanner.notices import advance_notices, governing
from controlplane.scheduler.creates import Creates
from controlplane.scheduler.dryrun import dry_run, moved_off
from controlplane.scheduler.lifecycle import Lifecycle, LifecycleMetrics
from controlplane.scheduler.moves import move_id
from controlplane.scheduler.moverecords import moves_of, moves_written, reprofile_moves, vet_requests
from controlplane.scheduler.placement import job_request
from controlplane.scheduler.ratelimit import Limiter, Limits
from controlplane.rollouts.driver import RolloutDriver
from controlplane.rollouts.record import reprofile_of
from controlplane.scheduler.reconcile import Gate, JobPlan, MachineStatus, Maintenance, reconcile
from controlplane.scheduler.writer import ShardWriter
from controlplane.store import Conflict, Store, TooLarge, Unavailable
from controlplane.store.keys import Keys
from controlplane.store.records import EventRec, JobRec, TaskRec
from controlplane.store.state import RegionState
from controlplane.taskcontrol.reach import Reach
from controlplane.taskcontrol.session import TaskControlSession, unhealthy
from controlplane.taskcontrol.sessions import Sessions

if TYPE_CHECKING:
    from controlplane.coordination.coordinator import Fence

log = logging.getLogger("twine.controld.scheduler")
Reports = Callable[[str], Mapping[tuple[str, int], dict] | None]
PASS_INTERVAL = 1.0  # jobs not idle are looked at again this often
RESYNC_INTERVAL = 30.0  # every job is looked at once in this long, whatever the queue says (a safety net)
PASS_SLICE = 0.02  # seconds of passes over jobs between two chances for everything else to run


@dataclass(frozen=True)
class Observed:
    """What one pass over a job starts from."""

    job: JobRec
    tasks: Mapping[int, TaskRec]
    machines: dict[str, MachineStatus]  # the machines its tasks are on
    session: TaskControlSession | None
    now: float
    requests: Mapping[int, dict] = field(default_factory=dict)  # the ReBalancer's move requests (moves.py)


class Scheduler:
    def __init__(self, state: RegionState, store: Store, keys: Keys, reports: Reports,
                 agent_errors: Mapping[str, str] | None = None, limits: Limits = Limits(),
                 taskcontrol_interval: float = 1.0, taskcontrol_timeout: float = 2.0,
                 maintenance_policy: str = "move", shard: int = 0, fence: "Fence | None" = None,
                 max_txn_ops: int = 128, metrics: LifecycleMetrics | None = None, reach: Reach | None = None,
                 rollout_interval: float = 1.0):
        self.state = state
        self.store = store
        self.keys = keys
        self.shard = shard
        self.fence = fence  # None: a lone scheduler with no election (tests of the scheduler alone)
        self.deposed = ""  # why this shard's leadership ended (set by the daemon)
        self.reports = reports  # machine -> its agent's latest task report
        self.agent_errors = agent_errors if agent_errors is not None else {}
        self.maintenance_policy = maintenance_policy  # for jobs without a TaskController, unless the event says
        self.metrics = metrics or LifecycleMetrics()
        self.lifecycle = Lifecycle(self.metrics)
        rkey = keys.ratelimit("region")
        self.limiter = Limiter(limits, shard, region=lambda: (state.ratelimits.get("region"), state.revs.get(rkey, 0)))
        self.limiter.load(state.ratelimits)
        self.lock = asyncio.Lock()  # the shard's commits do not race each other
        self.counters = {"passes": 0, "job_passes": 0, "commits": 0, "batches": 0, "conflicts": 0, "placements": 0,
                         "errors": 0, "rate_limited": 0}
        self.writer = ShardWriter(state, store, keys, shard, self.owns, self.limiter, self.counters, fence, max_txn_ops)
        self.creates = Creates(self.writer, self.lock, lambda: self.deposed, self._allocated)
        # its entitlements' profile rollouts
        self.rollouts = RolloutDriver(state, self.writer, shard, self.lock, rollout_interval, reports)
        self.sessions = Sessions(state, keys, taskcontrol_interval, taskcontrol_timeout, round_trip=lambda seconds, ok:
                                 self.metrics.taskcontrol_round_trip.labels("ok" if ok else "error").observe(seconds),
                                 reach=reach)
        self.plans: dict[str, JobPlan] = {}
        self._held: dict[str, set[str]] = {}  # op ids the rate limit held in a job's last pass
        self.messages: dict[str, str] = {}  # why a job's tasks cannot be placed, for job status
        self.busy: set[str] = set()  # jobs not idle: looked at again in PASS_INTERVAL
        self.demand: dict[str, reclaim.Demand] = {}  # guaranteed jobs whose tasks found no machine
        self.reclaimer = reclaim.Reclaimer(state, self.writer, shard, self.lock, self.demand)

    @property
    def elected_at(self) -> float:
        return self.writer.elected_at

    @property
    def first_commit_at(self) -> float | None:
        """Wall time of the first commit as leader."""
        return self.writer.first_commit_at

    def _allocated(self, why: str, seconds: float) -> None:
        self.metrics.allocate_seconds.labels(why).observe(seconds)

    def owns(self, handle: str) -> bool:
        return self.state.shard_of_job(handle) == self.shard

    # -- the loop ----------------------------------------------------------------------------

    async def run(self) -> None:
        """A work queue, not a pass over every job after every change: the jobs a change reaches
        (the watch says which), plus every PASS_INTERVAL the busy jobs (something pending, held,
        waiting for a time or a machine) and a slice of all of them, so that every job is looked
        at once per RESYNC_INTERVAL whatever the queue says (a safety net, spread out: no pause
        that grows with the number of jobs)."""
        queue = self.state.changed.subscribe()
        rollouts = asyncio.get_running_loop().create_task(self.rollouts.run())
        reclaims = asyncio.get_running_loop().create_task(self.reclaimer.run())
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
                        jobs |= self.busy
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
            rollouts.cancel()
            reclaims.cancel()
            self.state.changed.unsubscribe(queue)
            await self.sessions.close()  # deposed or stopping: no call to a TaskController goes on

    async def pass_all(self) -> None:
        self.counters["passes"] += 1
        # with the sessions of jobs whose entitlement moved away: pass_jobs closes those
        await self.pass_jobs({h for h in self.state.jobs if self.owns(h)} | set(self.sessions.by_job))

    async def pass_jobs(self, handles) -> None:
        slice_began = time.monotonic()
        for handle in sorted(handles):
            if self.deposed:
                return  # its commits are fenced off now: each would only conflict
            if time.monotonic() - slice_began > PASS_SLICE:
                await asyncio.sleep(0)  # a long pass lets the API and the watch in between jobs
                slice_began = time.monotonic()
            if handle in self.sessions and not self.owns(handle):
                self.sessions.drop(handle)  # its entitlement moved to another shard
                self.plans.pop(handle, None)
            self.counters["job_passes"] += 1
            self.busy.add(handle)  # until its pass says otherwise
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

    # -- one job's pass: observe, decide, act ---------------------------------------------------

    async def pass_job(self, handle: str) -> None:
        async with self.lock:
            seen = self.observe(handle)
            if seen is None:
                return
            plan = self.decide(seen)
            await self.act(seen, plan)

    def machine_status(self, mid: str, now: float) -> MachineStatus | None:
        """What the reconciler knows of a machine."""
        m = self.state.machines.get(mid)
        if m is None:
            return None
        return MachineStatus(m.id, m.healthy, m.health_reason, self.state.profile_ready(m),
                             self.state.desired_profile(m), m.address, self.agent_errors.get(mid, ""),
                             self.reports(mid),
                             governing(self.state.maintenance, mid, m.healthy, now, self.maintenance_policy)
                             or reclaim.governing(self.state, m, now),
                             reprofile_of(self.state.rollouts.get(m.entitlement or ""), mid))

    def observe(self, handle: str) -> Observed | None:
        """The job as this pass finds it; None when it is not this shard's to schedule (stopped,
        gone, or its entitlement moved away), after forgetting what the shard kept of it."""
        job = self.state.jobs.get(handle)
        if job is not None and not self.owns(handle):
            self.busy.discard(handle)
            self.lifecycle.forget(handle)
            return None
        if job is None or job.state == "stopped":
            self.lifecycle.forget(handle)
            self.limiter.forget(handle)  # per-job state ends with the job
            self.plans.pop(handle, None)
            self.demand.pop(handle, None)
            self._held.pop(handle, None)
            self.busy.discard(handle)
            return None
        tasks = self.state.tasks.get(handle, {})
        now = time.time()
        self.lifecycle.observe(job, tasks, self.state.machines, self.state.open_failures, now)
        requests = moves_of(self.state.rebalance.get(handle))
        wanted = {mid for t in tasks.values() for mid in t.holds()} | {r.get("target") for r in requests.values()}
        machines = {mid: v for mid in wanted if isinstance(mid, str) and (v := self.machine_status(mid, now))}
        session = self.sessions.of(job)
        if job.reprofile == "move" and any(m.reprofile is not None and m.reprofile.stops for m in machines.values()):
            for i, req in reprofile_moves(self.state, job, tasks, machines, session).items():
                requests = {**requests, i: req}
                machines.setdefault(req["target"], self.machine_status(req["target"], now))
        if session is not None:
            session.observe(tasks)
        return Observed(job, tasks, machines, session, now, requests)

    def decide(self, seen: Observed) -> JobPlan:
        """The pure reconciler's plan, gated by the controller's approvals and the rate limits."""
        job, session = seen.job, seen.session
        requests, dropped = vet_requests(seen.requests, seen.tasks, session, self.state.snapshot) \
            if seen.requests else ({}, {})
        gate = Gate(frozenset(session.approved) if session else None, self.limiter.available(job.handle))
        plan = reconcile(job, seen.tasks, seen.machines, gate, requests, seen.now)
        if session is not None and session.withdraw_stale(plan.seen, job.live_set()):
            # an approval given for a state that is gone starts nothing: plan again without it
            gate = Gate(frozenset(session.approved), self.limiter.available(job.handle))
            plan = reconcile(job, seen.tasks, seen.machines, gate, requests, seen.now)
        plan.dropped.update(dropped)
        return plan

    async def act(self, seen: Observed, plan: JobPlan) -> None:
        """Keep the plan for the job's status, offer the controller what needs its approval, then
        commit the plan's changes, or place the tasks that need a machine."""
        job, session, handle = seen.job, seen.session, seen.job.handle
        self.plans[handle] = plan
        if not plan.place:
            self.demand.pop(handle, None)
        held = {op.id for op in plan.held if op.reason.endswith("rate limited")}
        # the metric counts operations held back, each once, not passes that saw them held
        self.counters["rate_limited"] += len(held - self._held.get(handle, set()))
        self._held[handle] = held
        if session is not None:
            live = job.live_set()
            session.offer(plan.proposed, unhealthy(plan.after, live),
                          advance_notices(self.state.maintenance, seen.tasks, live, seen.now)
                          + reclaim.notices(self.state, seen.tasks, live, seen.now))
        started = [op.id for op in plan.ops if op.id]
        if session is not None:
            for index, _, mv, outcome in plan.ended:
                if outcome != "done":  # the task stays where it was: the operation is over
                    session.finish(move_id(index, mv.machine), "failed")
        tc = self.sessions.in_flight_record(handle, session, plan, started)
        if not plan.empty():
            for op in plan.ops:
                log.info("%s %s", handle, op)
            for i, why in sorted(plan.dropped.items()):
                log.info("%s rebalance move of #%d dropped: %s", handle, i, why)
            extra, guarded = {**tc}, ()
            if plan.begun or plan.dropped or plan.ended:
                extra.update(moves_written(self.keys, handle, self.state.rebalance.get(handle), plan, seen.now,
                                           seen.requests))
                guarded = (self.keys.rebalance(handle),)
            # a swap's move takes its free target into the entitlement (its profile follows)
            taking = {seen.requests[i]["target"] for i in plan.begun if seen.requests[i].get("take")}
            rev = await self.writer.commit(job, plan.changes, job_put=plan.job, taken=taking,
                                           destructive=plan.destructive, extra=extra, guarded=guarded)
        elif plan.place:
            try:
                moving = tuple(i for i in plan.place if i in seen.tasks and seen.tasks[i].machine)
                snap = self.state.snapshot()  # moved forward to the view first: not the allocator's time
                began = time.perf_counter()
                try:
                    placement = allocate(snap, job_request(job, moving))
                finally:
                    self._allocated("place", time.perf_counter() - began)
            except AllocationError as e:
                if self.messages.get(handle) != e.message:
                    log.warning("%s: %s", handle, e.message)
                self.messages[handle] = e.message
                ent = self.state.entitlements[job.entitlement]
                if isinstance(e, NoPlacement) and ent.kind == "guaranteed":  # it may take opportunistic machines back
                    lost = any(seen.tasks[i].state == "lost" for i in plan.place if i in seen.tasks)
                    self.demand[handle] = reclaim.Demand(
                        len(plan.place), *job.resources(), job.machine_type or ent.machine_type, job.dc or ent.spread.pinned_dc,
                        "failure" if lost else "demand")
                return
            except AllocatorInconsistency as e:  # a bug: each pass retries it, the log has it once
                self.counters["errors"] += 1
                if self.messages.get(handle) != str(e):
                    log.error("%s: %s", handle, e, exc_info=e)
                self.messages[handle] = str(e)
                return
            self.messages.pop(handle, None)
            self.demand.pop(handle, None)
            rev = await self.writer.commit_placement(job, placement, plan.place, destructive=plan.destructive, extra=tc)
        elif tc and session is not None and not session.unreported():
            # the controller heard of every completion: the record forgets the operations a next
            # leader would tell it of again (it lists them until then, in flight or kept)
            rev = await self.writer.commit(job, [], extra=tc)
        else:
            if self._idle(seen, plan):
                self.busy.discard(handle)
            return
        if session is not None and started:
            # the approved operations it carried out are in flight for the TaskController (their
            # rate-limit tokens were taken in the commit)
            session.started(started, plan.ops)
        await self.state.wait_for(rev)

    def _idle(self, seen: Observed, plan: JobPlan) -> bool:
        """Nothing for the job to do until something changes (which the watch will say): every
        task runs at the job's version on a healthy machine with no maintenance, nothing is held
        or waiting, and its TaskController has nothing pending."""
        job, session = seen.job, seen.session
        if job.state != "active" or job.handle in self.messages or plan.held or plan.waiting or plan.proposed \
                or plan.rate_limited:
            return False
        if session is not None and (session.pending or session.approved or session.in_flight or session.notices
                                    or session.completed):
            return False
        if len(seen.tasks) != job.count:
            return False
        for t in seen.tasks.values():
            v = seen.machines.get(t.machine) if t.machine else None
            # starting or allocated: waiting for the agent's report or the machine's profile, each
            # of which wakes the job when it changes (the watch, the broker), not for a time
            if t.state not in ("running", "starting", "allocated") or t.spec_version != job.spec_version \
                    or v is None or not v.healthy or v.maintenance is not None:
                return False
        return True

    # -- for the front end -----------------------------------------------------------------------

    async def create(self, job: JobRec, read_revision: int) -> int:
        """Place a new job and commit it with its tasks (creates.py)."""
        return await self.creates.create(job, read_revision)

    async def commit_placement(self, job: JobRec, placement: Placement, indices: tuple[int, ...], **kw) -> int:
        return await self.writer.commit_placement(job, placement, indices, **kw)

    async def dry_run(self, job: JobRec) -> dict:
        """What an update to `job` (its new record, not written) would do: the rounds its
        TaskController would ack (dryrun.py). Writes nothing."""
        now = time.time()
        tasks = dict(self.state.tasks.get(job.handle, {}))
        machines = {mid: v for t in tasks.values() for mid in t.holds() if (v := self.machine_status(mid, now))}
        session = self.sessions.for_dry_run(job)
        return await dry_run(job, tasks, machines, session.dry_call if session is not None else None)

    async def dry_run_maintenance(self, job: JobRec, e: EventRec) -> dict:
        """What the job's TaskController would do before maintenance `e` (an event not written)
        reaches its deadline: the moves off its machines it would ack, round by round."""
        now = time.time()
        tasks = dict(self.state.tasks.get(job.handle, {}))
        mt = Maintenance(e.id, False, e.due, e.until, e.policy or self.maintenance_policy)
        machines = {mid: replace(v, maintenance=mt) if mid in e.machines else v
                    for t in tasks.values() for mid in t.holds() if (v := self.machine_status(mid, now))}
        session = self.sessions.for_dry_run(job)
        return await dry_run(job, tasks, machines, session.dry_call if session is not None else None,
                             moved_off(job, set(e.machines)), f"before maintenance of {', '.join(e.machines)}")

    def status(self, handle: str) -> dict:
        """What the job's status shows of this shard's work on it: its operations (held, waiting,
        rate limited), its TaskControl session, and why its tasks cannot be placed, if so."""
        plan = self.plans.get(handle)
        session = self.sessions.get(handle)
        message = self.messages.get(handle) or self.rate_limit_note(handle)
        if session is not None and session.status["ok"] is False:
            message = message or f"TaskController {session.url} acks nothing: {session.status['error']}"
        return {
            "message": message,
            "operations": {
                "held": [str(op) for op in plan.held] if plan else [],
                "waiting": list(plan.waiting) if plan else [],
                "rate_limited": plan.rate_limited if plan else 0,
            },
            "taskcontrol": session.answer() if session is not None else None,
        }

    def rate_limit_note(self, handle: str) -> str:
        plan = self.plans.get(handle)
        if plan is None or not plan.rate_limited:
            return ""
        return f"{plan.rate_limited} stop/move operation(s) held by the {self.limiter.which(handle)} rate limit"
