"""A shard leader's TaskControl sessions (paper 2.4): one per job that names a controller, made
when the job names one, replaced when its URL changes, dropped when it names none or stops.

What a new leader must know to go on where the last one stopped: the operations the controller
approved and that were started but not yet reported completed. They are written to etcd with the
commit that starts them (`in_flight_record`), and a session made by the next leader (or by this
daemon after a restart) takes them back, so the controller hears of their completion. So are the
completions the controller has not yet heard of in an answered call when a commit writes that
record (the operations it no longer lists): a new leader reports them again (a controller takes a
completion it already had as nothing: the SDK's does). Once an answered call told the controller
of every completion, the job's next pass writes the record without them, commit or not (before, an
update's last operation stayed listed in flight, to be reported again by every later leader).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from typing import Callable

import aiohttp

from controlplane.scheduler.reconcile import JobPlan, Op
from controlplane.security.sealing import TOKEN, SealingError
from controlplane.store.keys import Keys
from controlplane.store.records import EventRec, JobRec
from controlplane.store.state import RegionState
from controlplane.taskcontrol.reach import Reach
from controlplane.taskcontrol.session import TaskControlSession

log = logging.getLogger("twine.controld.scheduler")


class Sessions:
    def __init__(self, state: RegionState, keys: Keys, interval: float = 1.0, timeout: float = 2.0,
                 round_trip: Callable[[float, bool], None] = lambda seconds, ok: None, reach: Reach | None = None):
        self.state, self.keys = state, keys
        self.interval, self.timeout = interval, timeout  # between calls while something is pending; of a call
        self.round_trip = round_trip  # observes each call: seconds, answered
        self.reach = reach or Reach()  # which addresses a controller may be at
        self.by_job: dict[str, TaskControlSession] = {}
        self._http: dict[tuple[str, ...], aiohttp.ClientSession] = {}  # by the networks an entitlement allows
        self._refused: set[tuple[str, str]] = set()  # (job, why) said in an event already
        self._writes: set[asyncio.Task] = set()

    def http(self, handle: str) -> aiohttp.ClientSession:
        """The HTTP session for calls to the job's controller: its connections refuse what the
        job's entitlement does not allow (reach.py), at the address actually connected to."""
        job = self.state.jobs.get(handle)
        ent = self.state.entitlements.get(job.entitlement) if job is not None else None
        allowed = ent.allow_controller_networks if ent is not None else ()
        s = self._http.get(allowed)
        if s is None:
            s = self._http[allowed] = aiohttp.ClientSession(connector=self.reach.connector(allowed))
        return s

    def refused(self, handle: str, url: str, why: str) -> None:
        """A call to the job's controller was refused at its address: an event says so, once a
        job and reason while this leader runs (the job's status says it at every call)."""
        if (handle, why) in self._refused:
            return
        self._refused.add((handle, why))
        log.warning("job %s: its TaskController %s was not called: %s", handle, url, why)
        now = time.time()
        e = EventRec(f"controller-{int(now)}-{secrets.token_hex(3)}", "controller", (), now, why, scope=handle,
                     created=now)
        task = asyncio.get_running_loop().create_task(self._write_event(e))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _write_event(self, e: EventRec) -> None:
        key = self.keys.event(e.id)
        try:
            await self.state.write([self.state.guard(key)], {key: e.to_json()})
        except Exception as err:  # noqa: BLE001 - etcd away: the log line above and the job's status say it
            log.warning("event %s not written: %s", e.id, err)

    def get(self, handle: str) -> TaskControlSession | None:
        return self.by_job.get(handle)

    def __contains__(self, handle: str) -> bool:
        return handle in self.by_job

    def __len__(self) -> int:
        return len(self.by_job)

    def failing(self) -> int:
        """Sessions whose controller's last call failed."""
        return sum(1 for s in self.by_job.values() if s.status["ok"] is False)

    def of(self, job: JobRec) -> TaskControlSession | None:
        """The job's TaskController session: made when the job names a controller, replaced when
        the URL changes, dropped when it names none."""
        s = self.by_job.get(job.handle)
        if s is not None and job.controller_token != s.sealed_token:
            # the same controller, a new token: its state goes on
            s.token, s.sealed_token = self._token(job), job.controller_token
        if s is not None and (job.controller is None or s.url != job.controller or job.state != "active"):
            s.close_now()
            del self.by_job[job.handle]
            s = None
        if s is None and job.controller and job.state == "active":
            s = self.by_job[job.handle] = TaskControlSession(
                job.handle, job.controller, lambda h=job.handle: self.http(h), self.interval, self.timeout,
                on_answer=lambda h=job.handle: self.state.changed.set({h}), epoch=lambda: self.state.revision,
                token=self._token(job), round_trip=self.round_trip, prepare=self.reach.refresh,
                on_refused=lambda why, h=job.handle, u=job.controller: self.refused(h, u, why))
            # operations a previous leader (or this daemon before a restart) started: the controller
            # approved them and waits to hear they completed
            record = self.state.taskcontrol.get(job.handle) or {}
            for d in record.get("in_flight", []):
                op = Op(d["kind"], d["index"], d.get("reason", ""), d["id"], d.get("machine"), d.get("cause", ""),
                        d.get("version"))
                s.in_flight[op.id] = op
            # and those whose completion it may not have heard of: it is told (again) at the first call
            s.completed.extend(d for d in record.get("completed", []) if isinstance(d, dict) and "id" in d)
            s.sealed_token = job.controller_token
        return s

    def for_dry_run(self, job: JobRec) -> TaskControlSession | None:
        """The session a dry run of `job` (a record not written) calls its controller through: the
        job's own while the URL stays (its sequence numbers go on), else one of its own, kept nowhere."""
        s = self.by_job.get(job.handle)
        if s is not None and s.url == job.controller:
            return s
        if not job.controller:
            return None
        return TaskControlSession(job.handle, job.controller, lambda h=job.handle: self.http(h), self.interval,
                                  self.timeout, epoch=lambda: self.state.revision, token=self._token(job),
                                  prepare=self.reach.refresh)

    def _token(self, job: JobRec) -> str | None:
        """The job's controller_token, opened (sealed at rest). One this process cannot open is
        sent as none: the controller refuses the calls, and the job's status says so."""
        try:
            return self.state.sealer.open(job.handle, TOKEN, job.controller_token)
        except SealingError as e:
            log.error("job %s: %s; its controller is called without a token", job.handle, e)
            return None

    def drop(self, handle: str) -> None:
        """The job's entitlement moved to another shard: its new leader calls the controller."""
        s = self.by_job.pop(handle, None)
        if s is not None:
            s.close_now()

    async def close(self) -> None:
        """Deposed or stopping: no call to a TaskController goes on after the leadership."""
        for s in self.by_job.values():
            await s.close()
        for http in self._http.values():
            await http.close()
        for task in self._writes:
            task.cancel()

    def in_flight_record(self, handle: str, session: TaskControlSession | None, plan: JobPlan,
                         started: list[str]) -> dict[str, dict]:
        """The job's TaskController operations in flight once this commit lands, written with it
        when they differ from etcd's: a new leader tells the controller when they complete."""
        if session is None:
            return {}
        by_id = {op.id: op for op in plan.ops}
        ops = {**session.in_flight, **{i: by_id[i] for i in started if i in by_id}}
        record: dict = {"in_flight": [{"id": op.id, "kind": op.kind, "index": op.index, "reason": op.reason,
                                       "machine": op.machine, "cause": op.cause, "version": op.version}
                                      for _, op in sorted(ops.items())]}
        if unreported := session.unreported():
            record["completed"] = unreported
        if record == (self.state.taskcontrol.get(handle) or {"in_flight": []}):
            return {}
        return {self.keys.taskcontrol(handle): record}
