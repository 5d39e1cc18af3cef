"""/v1/jobs/{h}/autoscale: what the SRM does with a job (controlplane/srm/), answered by the leader of
the job's shard (forwarded there), and what a job's autoscale policy is checked against when it is
sent: a metric that queries Prometheus needs the region's server; a max beyond what the
entitlement's quota holds is clamped, and the answer says so."""

from __future__ import annotations

from aiohttp import web

from controlplane.frontend.body import reply
from controlplane.frontend.forward import Forwarder
from controlplane.frontend.services import Shards
from controlplane.allocator.model import tasks_fit
from controlplane.srm.service import Autoscaler
from controlplane.store.records import ApiError, JobRec
from controlplane.store.state import RegionState


def check_policy(job: JobRec, prometheus_url: str | None) -> None:
    p = job.autoscale
    if p is not None and p.metric is not None and p.metric.prometheus is not None and not prometheus_url:
        raise ApiError("unprocessable", "autoscale.metric.prometheus", "this region has no Prometheus server "
                       "(controld --prometheus-url): use the job's own endpoint (http) or CPU")


def quota_warnings(state: RegionState, job: JobRec) -> list[str]:
    """What the answer to a create or update says of a policy whose max the quota cannot hold."""
    p, ent = job.autoscale, state.entitlements.get(job.entitlement)
    if p is None or ent is None:
        return []
    mtype = job.machine_type or ent.machine_type
    cap = state.cells.capacity.get(mtype)  # a machine of the type's (kept as machines change: no pass over them)
    if cap is None:
        return []
    cpus, mem = job.resources()
    per_machine = tasks_fit(cap[0], cap[1], cpus, mem)
    holds = ent.quota * per_machine
    if p.max <= holds:
        return []
    return [f"autoscale.max {p.max} is clamped to {holds}: entitlement {ent.name}'s quota of {ent.quota} "
            f"{mtype} machine(s) holds {per_machine} task(s) of this size each (fewer while its other jobs "
            "hold some)"]


class AutoscaleView:
    def __init__(self, state: RegionState, srm: Autoscaler | None, shards: Shards, forwarder: Forwarder):
        self.state, self.srm, self.shards, self.forwarder = state, srm, shards, forwarder

    async def show(self, request: web.Request) -> web.StreamResponse:
        handle = f"{request.match_info['ent']}/{request.match_info['name']}"
        job = self.state.jobs.get(handle)
        if job is None:
            raise ApiError("not_found", "job", f"no job {handle!r}")
        if self.srm is None or self.shards.scheduler_for(handle) is None:
            return await self.forwarder.forward(request, self.state.shard_of_job(handle))
        await self.srm.load_kept(handle)
        return reply(self.srm.status(job))
