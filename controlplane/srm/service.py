"""The SRM at each shard leader: every `interval` seconds (--srm-interval), each autoscaled job of the
shards this process leads gets a size from recommend.py, and a change is written as the job record
(fenced by the shard's leadership, guarded by the job's revision): the scheduler does the rest as for
any resize. A scale-in names the tasks to stop (victims.py: whole machines empty first); their stops
are TaskControl operations, and a task whose controller answers without letting it stop is swapped
for another. Emptied machines return to the free pool (the broker), where another entitlement's
growth takes them and the sidekick re-tunes them (paper Figure 18).

What it decided and why is kept per job (status(), GET /v1/jobs/{h}/autoscale): the decision, the
last resizes (the job's autoscale events) and its size and recommendation over time (Figure 15),
also in etcd under /twine-usage/<region>/srm/<job> at each resize, so that a new leader shows them.
Measurements missing or stale for any of a shard's autoscaled jobs raise an unavailability-style
event (kind "autoscale") until they are back."""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from collections import deque
from dataclasses import replace
from typing import TYPE_CHECKING, Callable

from controlplane.allocator.model import tasks_fit
from controlplane.capacity import slo
from controlplane.srm.forecast import EVERY as FORECAST_EVERY, refresh
from controlplane.srm.load import Loads
from controlplane.srm.recommend import Decision, Memory, Reading, budget_left, recommend, usage_reading
from controlplane.srm.victims import choose, frees
from controlplane.store import Conflict
from controlplane.store.records import EventRec, JobRec
from controlplane.store.state import RegionState
from controlplane.taskcontrol.session import DECLINED
from controlplane.usage.recorder import UsageKeys
from controlplane.usage.region import RegionUsage

if TYPE_CHECKING:
    from controlplane.daemon.shards import ShardHost
    from controlplane.usage.recorder import Recorder

log = logging.getLogger("twine.controld.srm")
INTERVAL = 15.0  # seconds between two passes (--srm-interval)
EVENTS = 20  # resizes kept per job
STEPS = 576  # (t, size, recommended) changes kept per job: 48 hours of one each 5 minutes
STEP_EVERY = 300  # seconds: a recommendation's changes within it are one step (a resize is its own)
AVOID = 600.0  # seconds a task its controller would not stop is not chosen again


class JobView:
    """What the SRM shows of one job."""

    __slots__ = ("decision", "events", "steps", "reading", "per_task", "avoid", "at")

    def __init__(self) -> None:
        self.decision: Decision | None = None
        self.events: deque = deque(maxlen=EVENTS)
        self.steps: deque = deque(maxlen=STEPS)
        self.reading: Reading | None = None
        self.per_task = 0.0
        self.avoid: dict[int, float] = {}  # task index -> until when it is not chosen
        self.at = 0.0


class Autoscaler:
    def __init__(self, state: RegionState, usage: RegionUsage, shards: "ShardHost", recorder: "Recorder | None" = None,
                 interval: float = INTERVAL, sample: float = 10.0, loads: Loads | None = None,
                 clock: Callable[[], float] = time.time):
        self.state, self.usage, self.shards, self.recorder = state, usage, shards, recorder
        self.interval, self.sample, self.clock = interval, sample, clock
        self.loads = loads or Loads(state)
        self.memory: dict[str, Memory] = {}
        self.views: dict[str, JobView] = {}
        self.stale_event: dict[int, str] = {}  # shard -> its open autoscale event's id
        self.counters = {"passes": 0, "resizes_out": 0, "resizes_in": 0, "swaps": 0, "conflicts": 0,
                         "decide_seconds": 0.0, "recommendations": 0}
        self._keys_root = UsageKeys(state.keys.region).srm()
        self._caps: dict[str, tuple[float, int]] = {}  # machine type -> a machine's (cpus, MiB)
        self._free: dict[tuple[str, str], int] = {}  # (type, dc) -> healthy free machines, at the same look
        self._notice: dict[str, float] = {}  # type -> the longest notice of the opportunistic machines of it
        self._caps_until = -math.inf

    @property
    def stale_after(self) -> float:
        return 2 * self.interval + self.sample

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.tick()
            except Exception as e:  # etcd away longer than its retries: the next pass tries again
                log.warning("srm: %s: %s", type(e).__name__, e)

    def led(self, job: JobRec):
        """The scheduler of the job's shard when this process leads it."""
        return self.shards.scheduler_for(job.handle)

    async def tick(self, now: float | None = None) -> None:
        now = self.clock() if now is None else now
        st = self.state
        self.counters["passes"] += 1
        if not self.shards.schedulers:
            self.memory.clear()
            return
        jobs = [j for j in st.jobs.values() if j.autoscale is not None and j.state == "active" and self.led(j)]
        await self.loads.refresh([j for j in jobs if j.autoscale.metric is not None], now)
        usage = self.usage.jobs()
        if now >= self._caps_until:
            self.look(now)
        reserved: dict[str, list[float]] = {}  # entitlement -> [cpus, MiB] its active jobs reserve
        for j in st.jobs.values():
            if j.state == "active":
                cpus, mem = j.resources()
                r = reserved.setdefault(j.entitlement, [0.0, 0.0])
                r[0] += cpus * j.count
                r[1] += mem * j.count
        stale: dict[int, list[str]] = {}
        for n, job in enumerate(jobs):
            if n and n % 2000 == 0:
                await asyncio.sleep(0)  # heartbeats and requests go on between slices of a large region
            job = st.jobs.get(job.handle)
            if job is None or job.autoscale is None or job.state != "active":
                continue
            began = time.perf_counter()  # decide() does no I/O: its wall time is its CPU's (and cheaper to read)
            d = self.decide(job, now, usage, reserved)
            self.counters["decide_seconds"] += time.perf_counter() - began
            self.counters["recommendations"] += 1
            if d.stale:
                stale.setdefault(st.shard_of_job(job.handle), []).append(job.handle)
            if d.size != job.count:
                await self.resize(job, d, now)
            else:
                await self.swap_declined(job, now)
        wanted = {j.handle for j in jobs}
        for h in [h for h in self.memory if h not in wanted]:
            del self.memory[h]
        for h in [h for h in self.views if h not in wanted]:  # gone, not autoscaled, or led elsewhere now
            del self.views[h]
        await self.stale_events(stale, now)

    # -- one job ---------------------------------------------------------------------------------

    def reading(self, job: JobRec, usage: dict, running: int, now: float) -> Reading:
        p = job.autoscale
        if p.metric is not None:
            value, at = self.loads.value(job.handle)
            return Reading(value, now - at if value is not None else math.inf, running)
        u = usage.get(job.handle)
        return usage_reading(None, 0, running) if u is None else usage_reading(u[0], u[2], running)

    def room(self, job: JobRec, reserved: dict[str, list[float]]) -> int | None:
        """Tasks of this job the entitlement's quota holds, beside its other jobs' reservations:
        quota x the capacity of a machine of its type (None: no machine of that type is known)."""
        ent = self.state.entitlements.get(job.entitlement)
        if ent is None:
            return None
        cap = self._caps.get(job.machine_type or ent.machine_type)
        if cap is None:
            return None
        cpus, mem = job.resources()
        others = reserved.get(job.entitlement, [0.0, 0.0])
        free_cpu = ent.quota * cap[0] - (others[0] - cpus * job.count)
        free_mem = ent.quota * cap[1] - (others[1] - mem * job.count)
        per_machine = tasks_fit(cap[0], cap[1], cpus, mem)
        return max(0, min(int(free_cpu / cpus + 1e-9), int(free_mem / mem) if mem else 10**9,
                          ent.quota * per_machine))

    def look(self, now: float) -> None:
        """Now and then, from the machines' sums kept as they change (store/cells.py): the machine
        types' capacity; the healthy free machines in no maintenance per (type, dc); and per type,
        the longest notice of the opportunistic entitlements holding machines (what a reclaim for
        growth would wait)."""
        st = self.state
        free = {slo.of_group(g): f["free"] for g, f in slo.pool(st, now).items()}  # the capacity tier's count
        notice: dict[str, float] = {}
        for name, e in st.entitlements.items():
            if e.kind == "opportunistic" and st.cells.held.get(name):
                notice[e.machine_type] = max(notice.get(e.machine_type, 0.0), float(e.notice))
        self._caps, self._free, self._notice = dict(st.cells.capacity), free, notice
        self._caps_until = now + FORECAST_EVERY

    def reclaim_lead(self, job: JobRec) -> float:
        """Seconds more the job's forecast looks ahead when its growth would take machines back from
        opportunistic work (at the last look, no free machine of its type beyond the region's
        reserve, in its dc if it is pinned to one, and opportunistic machines of that type): the
        longest notice such a reclaim gives. Growth the forecast sees coming is then asked for in
        time for the reclaim's whole notice, and the machines are there when the load comes (issue #37)."""
        ent = self.state.entitlements.get(job.entitlement)
        if ent is None or ent.kind != "guaranteed":
            return 0.0
        mtype, dc, reserve = job.machine_type or ent.machine_type, job.dc or ent.spread.pinned_dc, self.state.reserve
        if any(n > reserve for (t, d), n in self._free.items() if t == mtype and dc in (None, d)):
            return 0.0
        return self._notice.get(mtype, 0.0)

    def decide(self, job: JobRec, now: float, usage: dict, reserved: dict[str, list[float]]) -> Decision:
        h, p = job.handle, job.autoscale
        mem = self.memory.get(h)
        if mem is None:
            mem = self.memory[h] = Memory()
        view = self.views.get(h)
        if view is None:
            view = self.views[h] = JobView()
        tasks = self.state.tasks.get(h, {})
        running = sum(1 for t in tasks.values() if t.state == "running")
        mem.ran(now, running)
        cpus, _ = job.resources()
        per_task = p.metric.target if p.metric is not None else p.target_cpu * cpus
        if p.predictive and now >= mem.forecast_until:
            series = self.recorder.series.get(("job", h)) if self.recorder is not None else None
            refresh(mem, series, now, mem.startup + self.interval + self.sample + self.reclaim_lead(job))
        reading = self.reading(job, usage, running, now)
        d = recommend(p, mem, now, job.count, reading, per_task, p.target_cpu * cpus, self.room(job, reserved),
                      self.stale_after, lambda: self._frees(job, view, now))
        view.decision, view.reading, view.per_task, view.at = d, reading, per_task, now
        steps = view.steps
        if not steps or (steps[-1][1], steps[-1][2]) != (job.count, d.recommended):
            if steps and steps[-1][1] == job.count and now - steps[-1][0] < STEP_EVERY and \
                    (len(steps) < 2 or steps[-2][1] == job.count):
                steps[-1] = (steps[-1][0], job.count, d.recommended)  # the same step, its latest recommendation
            else:
                steps.append((int(now), job.count, d.recommended))
        return d

    def _stopping(self, job: JobRec) -> bool:
        return any(t.state == "stopping" for t in self.state.tasks.get(job.handle, {}).values())

    async def resize(self, job: JobRec, d: Decision, now: float) -> None:
        """The job at d.size: growth fills its gaps first; a scale-in stops the tasks whose removal
        empties machines first. Not while an earlier scale-in's tasks are still stopping."""
        if self._stopping(job):
            return
        h, old = job.handle, job.count
        view = self.views[h]
        stopped: list[int] = []
        if d.size > old:
            new = job.resized(d.size)
        else:
            view.avoid = {i: t for i, t in view.avoid.items() if t > now}
            stopped = self._victims(job, old - d.size, set(view.avoid))
            new = job.without(stopped)
        if await self._write(job, replace(new, updated_at=time.time())):
            self.memory[h].changed(now, old, new.count)
            self.counters["resizes_out" if new.count > old else "resizes_in"] += 1
            view.events.append({"at": now, "was": old, "to": new.count, "reason": d.reason,
                                **({"stopped": stopped} if stopped else {})})
            log.info("srm: %s %d -> %d: %s%s", h, old, new.count, d.reason,
                     f" (stopping {stopped})" if stopped else "")
            view.steps.append((int(now), new.count, d.recommended))
            await self._keep(h)

    def _on(self, tasks: dict) -> dict[str, int]:
        st = self.state
        return {t.machine: st.allocated(t.machine)[0] for t in tasks.values()
                if t.machine and t.machine in st.machines}  # a machine's tasks are all its entitlement's

    def _victims(self, job: JobRec, k: int, avoid: set[int]) -> list[int]:
        tasks = self.state.tasks.get(job.handle, {})
        return choose(tasks, job.indices(), self._on(tasks), k, avoid)

    def _frees(self, job: JobRec, view: JobView, now: float) -> list[int]:
        """The sizes at which the job's scale-in, as _victims would stop, empties a machine."""
        tasks = self.state.tasks.get(job.handle, {})
        avoid = {i for i, t in view.avoid.items() if t > now}
        return frees(tasks, job.indices(), self._on(tasks), avoid)

    async def swap_declined(self, job: JobRec, now: float) -> None:
        """A task chosen to stop whose TaskController answered DECLINED times without letting it
        (and let no other stop meanwhile) stays, and another task is offered in its place."""
        if not job.gaps:
            return
        sched = self.led(job)
        session = sched.sessions.get(job.handle) if sched is not None else None
        if session is None or session.in_flight or session.approved:
            return
        refused = [int(op_id.split("/")[1]) for op_id, n in session.declined.items()
                   if n >= DECLINED and op_id.startswith("stop/") and int(op_id.split("/")[1]) in job.gaps]
        if not refused:
            return
        view = self.views[job.handle]
        for i in refused:
            view.avoid[i] = now + AVOID
        others = self._victims(job, len(refused), set(view.avoid))
        if len(others) < len(refused):
            return  # every other task is refused too: the stops wait for the controller
        keep = [i for i in job.indices() if i not in others] + refused
        if await self._write(job, replace(job.keeping(keep), updated_at=time.time())):
            self.counters["swaps"] += 1
            view.events.append({"at": now, "was": job.count, "to": job.count,
                                "reason": f"the TaskController did not let task(s) {refused} stop: "
                                          f"{others} offered instead", "stopped": others})
            await self._keep(job.handle)

    async def _write(self, job: JobRec, new: JobRec) -> bool:
        sched = self.led(job)
        if sched is None:
            return False
        async with sched.lock:
            if self.state.jobs.get(job.handle) != job:
                return False  # written since: the next pass decides again
            try:
                rev = await sched.writer.commit(job, [], job_put=new)
            except Conflict:
                self.counters["conflicts"] += 1
                return False
        await self.state.wait_for(rev)
        return True

    # -- what it shows -----------------------------------------------------------------------------

    def status(self, job: JobRec) -> dict:
        """GET /v1/jobs/{h}/autoscale at the job's shard leader."""
        p = job.autoscale
        view = self.views.get(job.handle)
        mem = self.memory.get(job.handle)
        out: dict = {"job": job.handle, "policy": None if p is None else p.to_json(), "size": job.count,
                     "interval": self.interval}
        if p is None:
            return {**out, "reason": "no autoscale policy: the SRM never resizes this job", "events": [],
                    "history": []}
        d = view.decision if view is not None else None
        r = view.reading if view is not None else None
        out.update({
            "recommended": d.recommended if d else None, "reactive": d.reactive if d else None,
            "predictive": d.predictive if d else None,
            "reason": d.reason if d else "not decided yet (the SRM passes every %g s)" % self.interval,
            "stale": d.stale if d else None, "clamped": d.clamped if d else "",
            "decided_at": view.at if view and d else None,
            "measured": None if r is None else {"load": None if r.load is None else round(r.load, 4),
                                                "age": None if r.age == math.inf else round(r.age, 1),
                                                "running": r.running, "per_task": view.per_task},
            "forecast": None if mem is None or mem.forecast is None else round(mem.forecast, 4),
            "forecast_trust": None if mem is None else round(mem.trust, 3),
            "startup_seconds": None if mem is None else round(mem.startup, 1),
            "budget_left": None if mem is None else budget_left(p, mem, self.clock()),
            "events": list(view.events) if view else [],
            "history": [list(s) for s in view.steps] if view else [],
        })
        return out

    async def _keep(self, handle: str) -> None:
        """The job's events and history in etcd, for the next leader (and the API's answer there)."""
        view = self.views[handle]
        try:
            await self.state.store.commit([], {self._keys_root + handle: {
                "events": list(view.events), "history": [list(s) for s in view.steps]}})
        except Exception as e:  # noqa: BLE001 - kept in memory; the next resize writes it again
            log.warning("srm: %s's record not written: %s", handle, e)

    async def load_kept(self, handle: str) -> None:
        """What a previous leader kept of a job, when this process has nothing of it yet."""
        if handle in self.views and (self.views[handle].events or self.views[handle].steps):
            return
        try:
            rec = await self.state.store.read(self._keys_root + handle)
        except Exception:  # noqa: BLE001 - shown without them
            return
        if not isinstance(rec.value, dict):
            return
        view = self.views.setdefault(handle, JobView())
        view.events.extend(e for e in rec.value.get("events", []) if isinstance(e, dict))
        view.steps.extend(tuple(s) for s in rec.value.get("history", []) if isinstance(s, list) and len(s) == 3)

    async def stale_events(self, stale: dict[int, list[str]], now: float) -> None:
        """An event (kind autoscale) per shard while any of its autoscaled jobs lacks fresh
        measurements: opened when the first goes stale, ended when none is. One a previous leader
        of the shard left open is this leader's to end."""
        st = self.state
        for e in st.events.values():
            if e.kind == "autoscale" and e.end is None and e.scope.startswith("shard "):
                shard = int(e.scope.split()[1])
                if shard in self.shards.schedulers and shard not in self.stale_event:
                    self.stale_event[shard] = e.id
        for shard in set(stale) | set(self.stale_event):
            handles = stale.get(shard, [])
            eid = self.stale_event.get(shard)
            if handles and eid is None:
                eid = f"autoscale-{int(now)}-{secrets.token_hex(3)}"
                why = (f"measurements of {len(handles)} autoscaled job(s) missing or stale (e.g. {handles[0]}): "
                       "their scale-in is frozen until they are back")
                e = EventRec(eid, "autoscale", (), now, why, scope=f"shard {shard}", created=now)
                if await self._event(e):
                    self.stale_event[shard] = eid
                    log.warning("srm: shard %d: %s", shard, why)
            elif not handles and eid is not None:
                e = st.events.get(eid)
                if e is None or await self._event(replace(e, end=now)):
                    del self.stale_event[shard]

    async def _event(self, e: EventRec) -> bool:
        key = self.state.keys.event(e.id)
        try:
            await self.state.write([self.state.guard(key)], {key: e.to_json()})
            return True
        except Exception as err:  # noqa: BLE001 - the jobs' status says it meanwhile; tried again next pass
            log.warning("srm: event %s not written: %s", e.id, err)
            return False
