"""/v1/jobs: a job's spec validated here, then created by the leader of its entitlement's shard
(forwarded to it from any other replica); updates, resizes and stops write the job record, which
the shard's leader acts on by the watch. Handlers validate first and write last: a refused
request has written nothing."""

from __future__ import annotations

import time
from dataclasses import replace

from aiohttp import web

from controlplane.allocator import AllocationError, allocate
from controlplane.allocator.errors import AllocatorInconsistency, NoPlacement
from controlplane.capacity.reclaim import fits_with_reclaims
from controlplane.frontend import schema as S
from controlplane.frontend.auth import PRINCIPAL
from controlplane.frontend.body import allocation_error, body, reply
from controlplane.frontend.entitlements import entitlement_of
from controlplane.frontend.forward import Forwarder
from controlplane.frontend.services import Shards
from controlplane.frontend.answering import job_answer
from controlplane.frontend.autoscale import check_policy, quota_warnings
from controlplane.scheduler.placement import job_request
from controlplane.security import tokens
from controlplane.security.sealing import SealingError, field_of
from controlplane.store import Conflict, Versioned
from controlplane.store.jobsecrets import keep_secrets
from controlplane.store.records import NAME, ApiError, EntitlementRec, JobRec, check_job_size
from controlplane.store.state import RegionState
from controlplane.taskcontrol.reach import Reach


def confined(job: JobRec, ent: EntitlementRec) -> None:
    """A task on the host's network reaches all the host reaches (the region's etcd among it): only
    in an entitlement whose policy allows it, which an admin sets."""
    if job.task.get("network_mode") == "host" and not ent.allow_host_network:
        raise ApiError("forbidden", "task.network_mode", f"entitlement {ent.name} does not allow the host's network "
                       "(an admin may set allow_host_network on it); use bridge or none")


def naming(e: AllocatorInconsistency, job: JobRec) -> AllocatorInconsistency:
    """The allocator's bug (middleware.py answers it 500), with the job named: the index's own check
    runs while the snapshot moves forward, with no job in sight."""
    if e.job is None:
        e.job = job.handle
    return e


class Jobs:
    def __init__(self, state: RegionState, shards: Shards, forwarder: Forwarder, reach: Reach,
                 prometheus_url: str | None = None):
        self.state = state
        self.prometheus_url = prometheus_url  # autoscale metrics that query Prometheus need it
        self.shards = shards  # where a job's create goes when this process leads its shard
        self.forwarder = forwarder  # where it goes otherwise
        self.reach = reach  # where a job's TaskController may be

    async def _reachable(self, job: JobRec, ent: EntitlementRec) -> None:
        """A controller at an address controld refuses to call (taskcontrol/reach.py) is a 422."""
        if job.controller and (why := await self.reach.check_url(job.controller, ent.allow_controller_networks)):
            raise ApiError("unprocessable", "controller", why)

    def answer(self, job: JobRec, warnings: list[str] | None = None) -> dict:
        sched = self.shards.scheduler_for(job.handle)  # None: another replica leads the job's shard
        out = job_answer(self.state, job, sched.status(job.handle) if sched else None)
        if warnings:
            out["warnings"] = warnings
        return out

    def _job(self, request: web.Request) -> JobRec:
        handle = f"{request.match_info['ent']}/{request.match_info['name']}"
        job = self.state.jobs.get(handle)
        if job is None:
            raise ApiError("not_found", "job", f"no job {handle!r}")
        return job

    def _read(self, request: web.Request) -> tuple[JobRec, int]:
        """The job and the revision it was read at: a later write is guarded by that revision."""
        job = self._job(request)
        return job, self.state.revs[self.state.keys.job(job.handle)]

    def _sealed(self, job: JobRec, old: JobRec | None) -> JobRec:
        """The job with its secret values and its controller token sealed for the store (a value the
        job holds already keeps its sealed form: controlplane/security/sealing.py), within the
        store's bound on a job's size."""
        sealer = self.state.sealer
        try:
            task = sealer.seal_task(job.handle, job.task, old.task if old is not None else None)
            token = sealer.seal_token(job.handle, job.controller_token, old.controller_token if old is not None else None)
        except ValueError as e:
            field, _, why = str(e).partition(": ")
            raise ApiError("unprocessable", field, why) from None
        if task is not job.task:
            check_job_size(job.count, task)
        return replace(job, task=task, controller_token=token)

    def _opened(self, job: JobRec, var: str, value) -> object:
        try:
            return self.state.sealer.open(job.handle, var, value)
        except SealingError as e:
            raise ApiError("unprocessable", field_of(var), f"null keeps the current value, which this daemon cannot "
                           f"open ({e}); send the value") from None

    async def _fits(self, job: JobRec) -> None:
        """Raise if the job (as it would be) cannot be placed now; any replica can tell."""
        try:
            allocate(self.state.snapshot(), job_request(job))
        except NoPlacement as e:
            if not fits_with_reclaims(self.state, job, time.time()):  # else opportunistic machines are taken back for it
                raise allocation_error(e) from None
        except AllocationError as e:
            raise allocation_error(e) from None
        except AllocatorInconsistency as e:
            raise naming(e, job) from None

    async def _put(self, job: JobRec, read_revision: int) -> int:
        """Write a job record derived from the one read at `read_revision`: Conflict if anything wrote
        the job since (no lost update). Any replica may: the shard's leader acts on it by the watch."""
        key = self.state.keys.job(job.handle)
        return await self.state.write([Versioned(key, None, read_revision)], {key: job.to_json()})

    async def create(self, request: web.Request) -> web.Response:
        st = self.state
        job = JobRec.parse(await body(request, schema=S.JobSpec))
        if not request[PRINCIPAL].may_change_jobs_of(job.entitlement):
            raise tokens.forbidden(request[PRINCIPAL], "POST", request.path, f"owner of entitlement {job.entitlement}")
        ent = entitlement_of(st, job.entitlement)
        confined(job, ent)
        check_policy(job, self.prometheus_url)
        await self._reachable(job, ent)
        old = st.jobs.get(job.handle)
        read_revision = st.revs.get(st.keys.job(job.handle), 0)
        if old is not None and old.state != "stopped":
            raise ApiError("exists", "name", f"job {job.handle!r} exists ({old.state}); use update, or stop it first")
        if old is not None:
            job = replace(job, spec_version=old.spec_version + 1, created_at=old.created_at)
        sched = self.shards.scheduler_for(job.handle)
        if sched is None:  # the leader of the job's shard takes the body as it came
            return await self.forwarder.forward(request, st.shard_of_job(job.handle))
        job = self._sealed(job, old)
        try:
            await sched.create(job, read_revision)
        except Conflict:
            raise ApiError("exists", "name", f"job {job.handle!r} was created or changed concurrently") from None
        except AllocationError as e:
            raise allocation_error(e) from None
        except AllocatorInconsistency as e:
            raise naming(e, job) from None
        return reply(self.answer(st.jobs[job.handle], quota_warnings(st, job)), 201)

    async def update(self, request: web.Request) -> web.Response:
        old, new, read_revision = await self._updated(request)
        await self._put(new, read_revision)
        return reply(self.answer(self.state.jobs[new.handle], quota_warnings(self.state, new)))

    async def dry_run(self, request: web.Request) -> web.Response:
        """What PUT would do (its body is the same), asked of the job's TaskController in calls
        marked dryRun: the rounds of the update, which tasks in what order. Changes nothing."""
        old, new, _ = await self._updated(request)
        sched = self.shards.scheduler_for(old.handle)
        if sched is None:  # the leader of the job's shard calls its controller
            return await self.forwarder.forward(request, self.state.shard_of_job(old.handle))
        return reply(await sched.dry_run(new))

    async def _updated(self, request: web.Request) -> tuple[JobRec, JobRec, int]:
        """The job, its record as the update's body makes it (checked, not written), the revision read."""
        st = self.state
        old, read_revision = self._read(request)
        new = JobRec.parse(keep_secrets(await body(request, schema=S.JobSpec), old,
                                        lambda var, v: self._opened(old, var, v)))
        if new.handle != old.handle:
            raise ApiError("unprocessable", "name", f"the spec is for {new.handle}, not {old.handle}")
        new = self._sealed(new, old)
        ent = entitlement_of(st, new.entitlement)
        confined(new, ent)
        check_policy(new, self.prometheus_url)
        await self._reachable(new, ent)
        if old.state != "active":
            raise ApiError("conflict", "state", f"job {old.handle} is {old.state}; run it again instead")
        changed_task = new.task != old.task
        new = replace(new, spec_version=old.spec_version + (1 if changed_task else 0), created_at=old.created_at)
        # the SRM sizes an autoscaled job: an update that keeps a policy keeps the size it chose
        sized = old if old.autoscale is not None and new.autoscale is not None else old.resized(new.count)
        new = replace(new, count=sized.count, gaps=sized.gaps)
        if new.count > old.count or new.resources() != old.resources() \
                or (new.machine_type, new.dc) != (old.machine_type, old.dc):
            await self._fits(new)  # what the update asks for must fit; a task already without room is not its fault
        return old, new, read_revision

    async def resize(self, request: web.Request) -> web.Response:
        st = self.state
        old, read_revision = self._read(request)
        count = (await body(request, schema=S.Resize))["count"]  # an integer from 0 to 10000 (the schema)
        if old.state != "active":
            raise ApiError("conflict", "state", f"job {old.handle} is {old.state}")
        if old.autoscale is not None:
            a = old.autoscale
            raise ApiError("conflict", "count", f"job {old.handle} is autoscaled ({a.min} to {a.max} tasks): change "
                           "its autoscale min and max, or update it without autoscale to size it by hand")
        if count > old.count:
            confined(old, entitlement_of(st, old.entitlement))  # more host-network tasks: the policy as it is now
        check_job_size(count, old.task)
        new = replace(old.resized(count), updated_at=time.time())
        if count > old.count:
            await self._fits(new)
        await self._put(new, read_revision)
        return reply(self.answer(st.jobs[new.handle]))

    async def stop(self, request: web.Request) -> web.Response:
        old, read_revision = self._read(request)
        if old.state == "active":
            await self._put(replace(old, state="stopping", updated_at=time.time()), read_revision)
        return reply(self.answer(self.state.jobs[old.handle]), 202)

    async def list(self, request: web.Request) -> web.Response:
        ent = request.query.get("entitlement")
        if ent is not None and not NAME.fullmatch(ent):
            raise ApiError("invalid", "entitlement", f"{ent[:80]!r} is not an entitlement name")
        jobs = [self.answer(j) for h, j in sorted(self.state.jobs.items()) if ent is None or j.entitlement == ent]
        for j in jobs:
            j.pop("tasks")
        return reply({"jobs": jobs})

    async def show(self, request: web.Request) -> web.Response:
        job = self._job(request)
        if self.shards.scheduler_for(job.handle) is None:
            # the shard's leader knows the job's plan and TaskControl session; the rest is the same
            try:
                return await self.forwarder.forward(request, self.state.shard_of_job(job.handle))
            except ApiError:
                pass  # no leader, or it does not answer (it died; its lease has not run out): our own view
        return reply(self.answer(job))

    async def discovery(self, request: web.Request) -> web.Response:
        """The job's discovery records, as the view's tasks say them (the view keeps no copy of the
        records: one a task, in every process): a task's record is written with each change of its
        machine, its discovery or its version, and holds them (scheduler/txn.py); the address is
        its machine's as the view has it now. From the view, as every read: marked stale, not
        refused, while etcd does not answer."""
        job = self._job(request)
        st = self.state
        eps = []
        for index, t in sorted(st.tasks.get(job.handle, {}).items()):
            m = st.machines.get(t.machine) if t.machine else None
            eps.append({"job": job.handle, "index": index, "machine": t.machine or "",
                        "address": m.address if m is not None else "", "enabled": t.discovery,
                        "spec_version": t.spec_version})
        return reply({"job": job.handle, "endpoints": eps})
