"""POST /v1/dry-run/maintenance: what each job on the machines a maintenance would cover would do
before its deadline, asked of its TaskController in calls marked dryRun by the leader of its shard
(the jobs of shards another replica leads are asked there: the same request, `?shard=N`). Nothing
is written: the maintenance is not scheduled."""

from __future__ import annotations

import time

import aiohttp
from aiohttp import web

from controlplane.frontend import schema as S
from controlplane.frontend.body import body, reply
from controlplane.frontend.forward import FORWARDED, HOP_HEADERS, Forwarder
from controlplane.frontend.services import Shards
from controlplane.opsplanner.maintenance import parse_maintenance
from controlplane.store.records import ApiError
from controlplane.store.state import RegionState


class DryRuns:
    def __init__(self, state: RegionState, shards: Shards, forwarder: Forwarder):
        self.state, self.shards, self.forwarder = state, shards, forwarder

    async def maintenance(self, request: web.Request) -> web.Response:
        st, now = self.state, time.time()
        spec = await body(request, schema=S.MaintenanceSpec)
        e = parse_maintenance(spec, st.machines, now)
        only = request.query.get("shard")
        if only is not None and not only.isdigit():
            raise ApiError("invalid", "shard", f"{only[:40]!r}: a shard number")
        by_shard: dict[int, list[str]] = {}
        for handle in sorted({t.job for mid in e.machines for t in st.tasks_on(mid)}):
            job, shard = st.jobs.get(handle), st.shard_of_job(handle)
            if job is not None and job.state == "active" and shard is not None:
                by_shard.setdefault(shard, []).append(handle)
        jobs: list[dict] = []
        for shard, handles in sorted(by_shard.items()):
            if only is not None and int(only) != shard:
                continue
            sched = self.shards.local(shard)
            if sched is not None:
                for handle in handles:
                    jobs.append(await sched.dry_run_maintenance(st.jobs[handle], e))
            elif only is None:
                jobs += (await self._ask_leader(request, spec, shard))["jobs"]
            else:
                raise ApiError("unavailable", None, f"this replica does not lead shard {shard}; retry in a second")
        summary = [f"dry run of a maintenance of {', '.join(e.machines)} (deadline "
                   f"{time.strftime('%H:%M:%S', time.localtime(e.due))}): {len(jobs)} job(s) with tasks there; "
                   "nothing scheduled"]
        for j in jobs:
            summary += ["", *j["summary"]]
        return reply({"machines": list(e.machines), "deadline": e.due, "jobs": jobs, "summary": summary})

    async def _ask_leader(self, request: web.Request, spec: dict, shard: int) -> dict:
        """The same dry run for one shard's jobs, at the replica that leads the shard."""
        coord = self.forwarder.coordinator
        url = coord.leader_url(shard) if coord is not None else None
        if url is None or url == coord.url or FORWARDED in request.headers:
            raise ApiError("unavailable", None, f"shard {shard} has no leader that can take this now; retry in a second")
        headers = {h: request.headers[h] for h in HOP_HEADERS if h in request.headers}
        headers[FORWARDED] = coord.id
        try:
            async with self.forwarder.http().post(f"{url}{request.path}?shard={shard}", json=spec, headers=headers,
                                                  timeout=aiohttp.ClientTimeout(total=60)) as r:
                answer = await r.json(content_type=None)
                if r.status != 200:
                    raise ApiError("unavailable", None, f"shard {shard}'s leader at {url}: {r.status} "
                                   f"{answer.get('why') if isinstance(answer, dict) else ''}")
                return answer
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            raise ApiError("unavailable", None, f"shard {shard}'s leader at {url} did not answer: "
                           f"{type(e).__name__}: {e}") from None
