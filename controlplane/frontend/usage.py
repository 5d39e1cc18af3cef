"""/v1/fleet and /v1/{jobs,entitlements}/.../usage (issue #25): what the region uses, now and over
time. The fleet is summed by whichever replica is asked (controlplane/usage/fleet.py); a series'
history lives at the leader of its shard (usage/recorder.py), where the request is forwarded.
A job's answer with ?tasks=1 lists each task's own figures (issue #35), which the replicas their
machines heartbeat to hold: each gives its book's (/v1/internal/usage/tasks, usage/peers.py)."""

from __future__ import annotations

import math
import re
import time

from aiohttp import web

from controlplane.frontend.body import query_flag, reply
from controlplane.frontend.forward import Forwarder
from controlplane.frontend.services import Shards
from controlplane.store.records import NAME, ApiError, TaskRec
from controlplane.store.state import RegionState
from controlplane.usage import history as H
from controlplane.usage.book import TaskUsage
from controlplane.usage import fleet
from controlplane.usage.peers import MAX_NAMES
from controlplane.usage.recorder import Recorder
from controlplane.usage.region import RegionUsage

SECONDS = re.compile(r"^[0-9]{1,9}$")
MAX_SINCE = H.HOURS * 3600  # 8 weeks: the rollups' window
MINUTES_SINCE = H.MINUTES * 60  # 48 hours: the points' window
MAX_STEP = 7 * 86400
MAX_POINTS = 10_000  # since / step
BY = re.compile(f"^({'|'.join(fleet.DIMENSIONS)})(,({'|'.join(fleet.DIMENSIONS)}))*$")
FIELDS = ["t", "cpu", "cpu_max", "memory_mb", "memory_mb_max"]
_NAME = NAME.pattern[1:NAME.pattern.index("$")]  # a name's, without its anchors
HANDLE = re.compile(f"^{_NAME}/{_NAME}$(?!\\n)")  # a job's: <entitlement>/<name>


def seconds(request: web.Request, field: str, default: int, low: int, high: int) -> int:
    """A query parameter of whole seconds within [low, high]; a 400 naming it otherwise."""
    text = request.query.get(field)
    if text is None:
        return default
    if not SECONDS.match(text) or not low <= int(text) <= high:
        raise ApiError("invalid", field, f"{text[:40]!r}: whole seconds from {low} to {high}")
    return int(text)


def window(request: web.Request) -> tuple[int, int]:
    """(since, step) in seconds: each bounded (a 400 naming it), and together (a 422 naming step)."""
    since = seconds(request, "since", 3600, 60, MAX_SINCE)
    low = 60 if since <= MINUTES_SINCE else 3600
    step = seconds(request, "step", max(low, math.ceil(since / 360 / low) * low), 60, MAX_STEP)
    if step % 60:
        raise ApiError("invalid", "step", f"{step}: whole minutes (a multiple of 60)")
    if step % low:
        raise ApiError("unprocessable", "step", f"{step} s: whole hours when since is beyond 48 h (older points are "
                       "hourly rollups)")
    if since / step > MAX_POINTS:
        raise ApiError("unprocessable", "step", f"{step} s makes {since // step} points over {since} s; at most "
                       f"{MAX_POINTS}")
    return since, step


def points(series: H.Series | None, since: int, step: int, now: float) -> list[list]:
    """[t, cpu cores mean, max, memory MiB mean, max] per step over the last `since` seconds (steps
    with nothing measured left out): minute points within 48 h, hourly rollups beyond."""
    if series is None:
        return []
    start = int(now) - since
    buckets: dict[int, list] = {}
    if since <= MINUTES_SINCE:
        rows = [(minute * 60, c, c, m, m) for minute, c, m in series.minutes(start // 60, int(now) // 60 + 1)]
    else:
        rows = [(hour * 3600, v[0], v[2], v[3], v[5]) for hour, v in series.hours(start // 3600, int(now) // 3600 + 1)]
    for t, c, cmax, m, mmax in rows:
        b = buckets.setdefault(t // step * step, [0, 0, 0, 0, 0])
        b[0] += c
        b[1] = max(b[1], cmax)
        b[2] += m
        b[3] = max(b[3], mmax)
        b[4] += 1
    return [[t, round(b[0] / b[4] / 1000, 3), b[1] / 1000, round(b[2] / b[4]), b[3]] for t, b in sorted(buckets.items())]


def names(request: web.Request, field: str, pattern: re.Pattern, what: str) -> list[str] | None:
    """A repeated query parameter's values (None: not given), each matching `pattern`."""
    values = request.query.getall(field, None)
    if values is not None:
        if len(values) > MAX_NAMES:
            raise ApiError("invalid", field, f"{len(values)} given; at most {MAX_NAMES}")
        for v in values:
            if not pattern.fullmatch(v):
                raise ApiError("invalid", field, f"{v[:80]!r} is not {what}")
    return values


def tasks_view(tasks: dict[int, TaskRec], measured: dict[tuple[str, int, str], TaskUsage]) -> list[dict]:
    """Each task of a job, by index, with its figures where it runs now (a moving task's copy's
    are not its own yet)."""
    out = []
    for index in sorted(tasks):
        t = tasks[index]
        m = measured.get((t.job, index, t.machine)) if t.machine else None
        out.append({"index": index, "machine": t.machine, "state": t.state,
                    "cpus": None if m is None else m.cpu_m / 1000, "memory_mb": None if m is None else m.memory_mb,
                    "measured_at": None if m is None else m.at})
    return out


class Usage:
    def __init__(self, state: RegionState, usage: RegionUsage, recorder: Recorder | None, shards: Shards,
                 forwarder: Forwarder):
        self.state, self.usage, self.recorder = state, usage, recorder
        self.shards, self.forwarder = shards, forwarder

    async def fleet(self, request: web.Request) -> web.Response:
        by = request.query.get("by", ",".join(fleet.DIMENSIONS))
        dims = by.split(",")
        if BY.match(by) is None:
            raise ApiError("invalid", "by", f"{by[:80]!r}: a comma-separated list of {', '.join(fleet.DIMENSIONS)}")
        return reply(fleet.answer(self.state, self.usage, [d for d in fleet.DIMENSIONS if d in dims]))

    def _series(self, key: tuple[str, str], shard: int) -> H.Series | None | bool:
        """The series, None when it has no points, False when another replica leads the shard."""
        if self.shards.local(shard) is None or self.recorder is None:
            return False
        return self.recorder.series.get(key)

    async def job(self, request: web.Request) -> web.StreamResponse:
        handle = f"{request.match_info['ent']}/{request.match_info['name']}"
        job = self.state.jobs.get(handle)
        if job is None:
            raise ApiError("not_found", "job", f"no job {handle!r}")
        since, step = window(request)
        shard = self.state.shard_of_job(handle)
        series = self._series(("job", handle), shard)
        if series is False:
            return await self.forwarder.forward(request, shard)
        per_task = query_flag(request, "tasks")
        measured = await self.usage.tasks(jobs=[handle]) if per_task else {}
        now = time.time()
        current = self.usage.job(handle)
        cpus, mem = job.resources()
        answer = {"job": handle, "count": job.count,
                  "reserved": {"cpus": round(cpus * job.count, 3), "memory_mb": mem * job.count},
                  "current": None if current is None else
                  {"cpus": current[0] / 1000, "memory_mb": current[1], "tasks_reporting": current[2]},
                  "since": int(now) - since, "step": step, "fields": FIELDS,
                  "points": points(series, since, step, now)}
        if per_task:
            answer["tasks"] = tasks_view(self.state.tasks.get(handle, {}), measured)
        return reply(answer)

    async def tasks_here(self, request: web.Request) -> web.Response:
        """The task figures this replica's book holds (another replica asks: usage/peers.py), of
        the jobs named and the entitlements' jobs, or of every job."""
        jobs = names(request, "job", HANDLE, "a job handle (<entitlement>/<name>)")
        ents = names(request, "entitlement", NAME, "an entitlement name")
        # each TaskUsage encodes as the array of its fields (a NamedTuple): a list made of each
        # first cost 626 ms of the loop for half a million tasks, their encoding 56
        return reply({"tasks": await self.usage.own_tasks(jobs, ents)})

    async def entitlement(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        ent = self.state.entitlements.get(name)
        if ent is None:
            raise ApiError("not_found", "entitlement", f"no entitlement {name!r}")
        since, step = window(request)
        series = self._series(("entitlement", name), ent.shard)
        if series is False:
            return await self.forwarder.forward(request, ent.shard)
        now = time.time()
        jobs = self.usage.jobs()
        cpu = mem = n = 0
        reserved_cpus, reserved_mem, reporting = 0.0, 0, False
        for handle in sorted(self.state.jobs_by_ent.get(name, ())):
            job = self.state.jobs.get(handle)
            if job is None:
                continue
            task_cpus, task_mem = job.resources()
            reserved_cpus += task_cpus * job.count
            reserved_mem += task_mem * job.count
            if (u := jobs.get(handle)) is not None:
                reporting = True
                cpu, mem, n = cpu + u[0], mem + u[1], n + u[2]
        return reply({"entitlement": name, "quota": ent.quota, "machine_type": ent.machine_type,
                      "reserved": {"cpus": round(reserved_cpus, 3), "memory_mb": reserved_mem},
                      "current": {"cpus": cpu / 1000, "memory_mb": mem, "tasks_reporting": n} if reporting else None,
                      "since": int(now) - since, "step": step, "fields": FIELDS,
                      "points": points(series, since, step, now)})
