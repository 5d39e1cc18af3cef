"""The front end: a versioned REST API (/v1) over aiohttp (docs/api.md; the OpenAPI document is
served at /v1/openapi.json). Every request but that one is authenticated with a Bearer token.

Handlers validate first and write last: a refused request (4xx) has written nothing to etcd.

While etcd is unreachable the API keeps answering: reads from the daemon's cache, marked
`X-Twine-Stale: <why>`; a request that needs etcd, and /healthz, answer 503 `unavailable` naming
the cause (docs/api.md, "When etcd is unreachable").
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Awaitable, Callable

import aiohttp
import msgspec
from aiohttp import web

from agent.errors import InputError
from controlplane.allocator import AllocationError, InvalidRequest, QuotaExceeded, allocate
from controlplane.scheduler.placement import job_request
from controlplane.frontend import schema as S
from controlplane.security import tokens
from controlplane.frontend.openapi import document
from controlplane.broker.agents import CREDENTIAL_HEADER
from controlplane.store.records import (NAME, ApiError, EntitlementRec, EventRec, JobRec, TaskRec, check_job_size, keep_secrets,
                                  redact_task)
from controlplane.opsplanner.maintenance import parse_maintenance
from controlplane.security.sealing import SealingError, field_of
from controlplane.store import Conflict, TooLarge, Unavailable, Versioned
from controlplane.store.etcd import UNREACHABLE

if TYPE_CHECKING:
    from controlplane.daemon.controld import ControlDaemon

DAEMON = web.AppKey("daemon", object)
MACHINE = "machine_id"
PRINCIPAL = "principal"  # who an API request comes from (controlplane/security/tokens.py)
_encode = msgspec.json.Encoder(enc_hook=str).encode  # what JSON has no form for, as its text
PUBLIC = ("/v1/openapi.json", "/healthz")
SERVED_BY_EVERY_ROLE = (*PUBLIC, "/v1/metrics", "/v1/cluster", "/v1/internal/relay")
# a member with the health role takes the heartbeats of the machines it judges: their agents send
# them there (the answer's heartbeat_to), so a health check in a process of its own hears them
# whatever the frontend and the schedulers are doing
SERVED_BY_HEALTH = ("/v1/agent/heartbeat",)
STALE = "X-Twine-Stale"  # on an answer from the cache while etcd is unreachable: why it may be behind


def reply(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=_encode(data), status=status, content_type="application/json")


def allocation_error(e: AllocationError) -> ApiError:
    if isinstance(e, QuotaExceeded):
        return ApiError("quota", e.field, e.message)
    if isinstance(e, InvalidRequest):  # valid in itself, not for this entitlement as it is
        return ApiError("unprocessable", e.field, e.message)
    return ApiError("no_placement", e.field, e.message)


NOT_AUDITED = ("/v1/agent/heartbeat", "/v1/internal/relay")  # changes of state every second, not of intent


@web.middleware
async def errors_and_auth(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
    response = await _answer(request, handler)
    # a forwarded change is written to the audit log by the replica that acts on it, not twice
    if request.method not in ("GET", "HEAD", "OPTIONS") and request.path not in NOT_AUDITED \
            and not request.get(FORWARDED_TO):
        who = request.get(PRINCIPAL)
        tokens.audit.info("%s %s %s -> %d", who.name if who else (f"machine {request[MACHINE]}" if request.get(MACHINE)
                          else "unauthenticated"), request.method, request.path_qs, response.status)
    return response


async def _caught_up(d: ControlDaemon) -> bool:
    """Whether this view was behind etcd's current revision, and has now seen it (a 404 is then
    asked again: every replica answers as etcd holds the region, not as its watch has it so far).
    False when it was not behind, or etcd cannot say: the 404 stands."""
    seen = d.state.revision  # what the 404 was answered from
    try:
        _, revision = await d.store.range(d.keys.settings())
        if revision <= seen:
            return False
        await d.state.wait_for(revision, timeout=5)
        return True
    except Exception:  # noqa: BLE001 - etcd away or the watch slow: the answer is the view's
        return False


async def _answer(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
    d: ControlDaemon = request.app[DAEMON]
    try:
        if request.path not in PUBLIC:
            _authenticate(d, request)
        if "frontend" not in d.roles and request.path not in SERVED_BY_EVERY_ROLE and FORWARDED not in request.headers \
                and not ("health" in d.roles and request.path in SERVED_BY_HEALTH):
            raise ApiError("unavailable", None, f"this process serves no API (roles: {','.join(d.roles)}); "
                           "ask a replica with the frontend role (GET /v1/cluster lists them)")
        try:
            response = await handler(request)
        except ApiError as e:
            # (not while etcd is unreachable: the view is all there is, and the answer says so)
            if e.kind != "not_found" or d.state.stale or not await _caught_up(d):
                raise
            # this view was behind etcd: what the request names may have just been written through
            # another replica (created there, then asked for here): asked again, now caught up
            response = await handler(request)
        if stale := d.state.stale:
            response.headers[STALE] = _header(stale)
        return response
    except ApiError as e:
        response = reply(e.to_json(), e.status)
        if e.kind == "timeout":
            response.force_close()  # the rest of the body is not waited for
        return response
    except Conflict:
        return reply(ApiError("conflict", None, "a concurrent change won; retry").to_json(), 409)
    except TooLarge as e:
        return reply(ApiError("unavailable", None, str(e)).to_json(), 503)
    except (Unavailable, *UNREACHABLE) as e:
        why = str(e) if isinstance(e, Unavailable) else f"etcd unreachable at {d.store.endpoint}: {e}"
        return reply(ApiError("unavailable", None, why).to_json(), 503)
    except TimeoutError:
        if not (stale := d.state.stale):
            raise
        # written, but the cache cannot show it yet: waiting for the watch (read-your-writes) timed out
        return reply(ApiError("unavailable", None, f"{stale} (this request's change may have been "
                              "written: read it again once etcd answers)").to_json(), 503)
    except web.HTTPNotFound:
        return reply(ApiError("not_found", "path", f"no such endpoint {request.path}").to_json(), 404)
    except web.HTTPMethodNotAllowed as e:
        response = reply({"error": "invalid", "field": "method", "why": f"{request.method} is not allowed; "
                          f"allowed: {', '.join(sorted(e.allowed_methods))}"}, 405)
        response.headers["Allow"] = ", ".join(sorted(e.allowed_methods))
        return response


def _header(text: str) -> str:
    return " ".join(text.split()).encode("latin-1", "replace").decode("latin-1")[:1000]


def _authenticate(d: ControlDaemon, request: web.Request) -> None:
    auth = request.headers.get("Authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme != "Bearer" or not token:
        raise ApiError("unauthorized", None, "missing 'Authorization: Bearer <token>'")
    path = request.path
    if path == "/v1/agent/register":  # a file's bootstrap token, or an unexpired one made by an admin
        who = tokens.Principal("bootstrap-token-file", "bootstrap") if d.agents.is_bootstrap(token) \
            else tokens.resolve(token, set(), d.state.tokens)
        ok = who is not None and who.role == "bootstrap"
        if ok:
            request[PRINCIPAL] = who  # audited by the token that registered (an admin-made one by its name)
    elif path.startswith("/v1/agent/"):
        mid = d.agents.machine_of(token)
        ok = mid is not None
        request[MACHINE] = mid
    else:
        principal = tokens.resolve(token, d.api_tokens, d.state.tokens)
        if principal is not None:
            request[PRINCIPAL] = principal
            tokens.authorize(principal, request.method, path, request.match_info.get("ent"))
        ok = principal is not None
    if not ok:
        raise ApiError("unauthorized", None, "the token is not valid for this request (unknown, revoked or expired)")


MAX_BODY = 1024 * 1024  # bytes of a request body; the records it makes are capped below etcd's limits
MAX_INTERNAL_BODY = 16 * 1024 * 1024  # a replica's relay (every task report, for a member that joins)


async def body(request: web.Request, limit: int = MAX_BODY, schema: type | None = None, typed: bool = False) -> Any:
    """The request's JSON body, strictly: standard JSON only (no NaN or Infinity), integers that
    fit 64 bits, nesting the decoder can follow, at most `limit` bytes, and within `schema` (the
    document's, controlplane/frontend/schema.py). Anything else is a 4xx naming the field, never a 500.
    `typed`: the body decoded straight into `schema`'s type, checked in the same pass (what a
    replica relays several times a second)."""
    too_large = ApiError("too_large", "body", f"more than the {limit} bytes accepted")
    if (request.content_length or 0) > limit:
        raise too_large  # refused unread
    timeout = request.app[DAEMON].conn_limits.body_timeout
    try:
        if request.content.is_eof():  # all here already (a heartbeat's, as a rule): nothing to wait for
            raw = await request.read()
        else:
            async with asyncio.timeout(timeout):
                raw = await request.read()
    except web.HTTPRequestEntityTooLarge:  # a stream without a length, past client_max_size
        raise too_large from None
    except TimeoutError:  # a client trickling its body holds no connection for long
        raise ApiError("timeout", "body", f"not received within {timeout:g} s") from None
    if len(raw) > limit:
        raise too_large
    if typed:
        return S.decoded(raw, schema)
    try:
        data = msgspec.json.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as e:
        why = "nested too deep" if isinstance(e, RecursionError) else str(e)
        raise ApiError("invalid", "body", f"the body is not JSON within limits: {why}") from None
    return data if schema is None else S.checked(data, schema)


# -- views ------------------------------------------------------------------------------------


def task_view(d: ControlDaemon, t: TaskRec) -> dict:
    m = d.state.machines.get(t.machine) if t.machine else None
    where = {k: m.labels[k] for k in ("dc", "msb", "rack")} if m else None
    return {"job": t.job, "index": t.index, "spec_version": t.spec_version, "machine": t.machine, "where": where,
            "state": t.state, "reason": t.reason, "discovery": t.discovery, "since": t.since}


def job_view(d: ControlDaemon, job: JobRec) -> dict:
    tasks = sorted(d.state.tasks.get(job.handle, {}).values(), key=lambda t: t.index)
    summary: dict[str, int] = {}
    for t in tasks:
        summary[t.state] = summary.get(t.state, 0) + 1
    sched = d.scheduler_for(job.handle)  # None: another replica leads the job's shard
    view = job.to_json()
    view["task"] = redact_task(view["task"])  # secret values go to the agent alone
    view["controller_token"] = None  # and the controller's token to the controller alone
    view["controller_token_set"] = job.controller_token is not None
    work = sched.status(job.handle) if sched else \
        {"message": "", "operations": {"held": [], "waiting": [], "rate_limited": 0}, "taskcontrol": None}
    return {
        **view, "summary": summary, **work,
        "tasks": [task_view(d, t) for t in tasks],
    }


def entitlement_view(d: ControlDaemon, name: str, detail: bool = False) -> dict:
    e = d.state.entitlements[name]
    machines = sorted(m.id for m in d.state.machines.values() if m.entitlement == name)
    out = {**e.to_json(), "held": len(machines)}
    if detail:
        out["machines"] = machines
        out["jobs"] = sorted(h for h, j in d.state.jobs.items() if j.entitlement == name)
    return out


def machine_view(d: ControlDaemon, mid: str, detail: bool = False) -> dict:
    m = d.state.machines[mid]
    out = {
        "id": m.id, "hostname": m.hostname, "labels": m.labels, "capacity": m.capacity, "entitlement": m.entitlement,
        "healthy": m.healthy, "health_reason": m.health_reason,
        "profile": {"desired": d.state.desired_profile(m), "applied": m.profile_applied, "ok": m.profile_ok,
                    "error": m.profile_error},
        "alloc": {"tasks": m.alloc_tasks, "cpus": m.alloc_cpus, "memory_mb": m.alloc_memory_mb},
        "tombstones": [{"job": j, "index": i, "cpus": c, "memory_mb": mem, "since": at} for j, i, c, mem, at in m.tombstones],
        "agent": {"address": m.address, "version": m.agent_version, "error": d.agents.errors.get(mid, "")},
        "last_heartbeat": d.agents.last_seen_wall.get(mid),
    }
    if detail:
        out["tasks"] = [task_view(d, t) for t in d.state.tasks_on(mid)]
        out["desired_version"] = d.state.desired_for(mid, open_secrets=False)["version"]
    return out


# -- replicas: forwarding to a shard's leader ---------------------------------------------------

FORWARDED = "X-Twine-Forwarded"  # the member that forwarded the request: it is not forwarded again
FORWARDED_TO = "forwarded_to"  # request key: where this replica forwarded the request
HOP_HEADERS = ("Authorization", "Content-Type", "Accept")


async def forward(request: web.Request, shard: int | None) -> web.StreamResponse:
    """Answer with the response of the process that leads `shard` (any replica answers any request)."""
    d: ControlDaemon = request.app[DAEMON]
    coord = d.coordinator
    url = coord.leader_url(shard) if coord is not None and shard is not None else None
    if url is None or url == coord.url or FORWARDED in request.headers:
        raise ApiError("unavailable", None, f"shard {shard} has no leader that can take this now (an election "
                       "is under way, or the leader just changed); retry in a second")
    headers = {h: request.headers[h] for h in HOP_HEADERS if h in request.headers}
    headers[FORWARDED] = coord.id
    request[FORWARDED_TO] = url  # the replica that acts on it writes the audit line
    data = await request.read()
    try:
        async with d.http().request(request.method, url + request.path_qs, data=data or None, headers=headers,
                                    timeout=aiohttp.ClientTimeout(total=60)) as r:
            payload = await r.read()
            return web.Response(status=r.status, body=payload, content_type=r.content_type)
    except (aiohttp.ClientError, TimeoutError) as e:
        raise ApiError("unavailable", None, f"shard {shard}'s leader at {url} did not answer: "
                       f"{type(e).__name__}: {e}") from None


# -- the region's replicas and shards ------------------------------------------------------------


async def cluster(request: web.Request) -> web.Response:
    """Members, shard leaders (with the entitlements each shard holds) and this process."""
    d: ControlDaemon = request.app[DAEMON]
    st = d.state
    by_shard: dict[int, list[str]] = {}
    for e in st.entitlements.values():
        by_shard.setdefault(e.shard, []).append(e.name)
    loads = st.shard_loads()
    shards = []
    for n in range(st.shard_count):
        leader = st.leaders.get(n)
        local = d.schedulers.get(n)
        shards.append({"shard": n, "leader": leader.value.get("member") if leader else None,
                       "leader_url": leader.value.get("url") if leader else None,
                       "epoch": leader.mod_revision if leader else None,
                       "entitlements": sorted(by_shard.get(n, [])), "tasks": loads.get(n, 0),
                       **({"elected_at": local.elected_at, "first_commit_at": local.first_commit_at} if local else {})})
    return reply({"region": d.keys.region, "self": d.coordinator.view() if d.coordinator else None,
                  "members": sorted(st.members.values(), key=lambda m: m["id"]), "shards": shards})


async def internal_relay(request: web.Request) -> web.Response:
    d: ControlDaemon = request.app[DAEMON]
    if d.relay is None:
        raise ApiError("unavailable", None, "this process is starting")
    return reply(d.relay.receive(await body(request, MAX_INTERNAL_BODY, S.Relay, typed=True)))


# -- entitlements ------------------------------------------------------------------------------


def _entitlement(d: ControlDaemon, name: str) -> EntitlementRec:
    e = d.state.entitlements.get(name)
    if e is None:
        raise ApiError("not_found", "entitlement", f"no entitlement {name!r}")
    return e


def _check_profile(d: ControlDaemon, e: EntitlementRec) -> None:
    if e.profile is None:
        return
    from agent.profiles.loader import ProfileName, load

    try:
        load(ProfileName(e.profile), d.profile_search)
    except InputError as err:
        raise ApiError("unprocessable", "profile", f"{e.profile!r}: {err.why}") from None


async def create_entitlement(request: web.Request) -> web.Response:
    d: ControlDaemon = request.app[DAEMON]
    e = EntitlementRec.parse(await body(request, schema=S.EntitlementSpec))
    e = replace(e, shard=d.state.least_loaded_shard())
    if e.name in d.state.entitlements:
        raise ApiError("exists", "name", f"entitlement {e.name!r} exists")
    _check_profile(d, e)
    rev = await d.store.commit([d.state.guard(d.keys.entitlement(e.name))], {d.keys.entitlement(e.name): e.to_json()})
    await d.state.wait_for(rev)
    return reply(entitlement_view(d, e.name, detail=True), 201)


async def modify_entitlement(request: web.Request) -> web.Response:
    d: ControlDaemon = request.app[DAEMON]
    old = _entitlement(d, request.match_info["name"])
    read_revision = d.state.revs[d.keys.entitlement(old.name)]
    new = old.modified(await body(request, schema=S.EntitlementPatch))
    held = sum(1 for m in d.state.machines.values() if m.entitlement == old.name)
    if new.quota < held:
        raise ApiError("quota", "quota", f"{new.quota} is below the {held} machines {old.name} holds now; "
                       "shrink its jobs first")
    _check_profile(d, new)
    key = d.keys.entitlement(old.name)
    rev = await d.store.commit([Versioned(key, None, read_revision)], {key: new.to_json()})
    await d.state.wait_for(rev)
    return reply(entitlement_view(d, new.name, detail=True))


async def move_entitlement(request: web.Request) -> web.Response:
    """Give the entitlement to another scheduler shard. Nothing of its jobs is restarted: the new
    shard's leader takes over their records; the old one's commits, fenced by the entitlement's
    record, fail from this write on."""
    d: ControlDaemon = request.app[DAEMON]
    old = _entitlement(d, request.match_info["name"])
    shard = (await body(request, schema=S.EntitlementMove))["shard"]  # an integer >= 0 (the schema)
    if shard >= d.state.shard_count:
        raise ApiError("unprocessable", "shard", f"{shard!r}: the region's shards are 0-{d.state.shard_count - 1}")
    if shard != old.shard:
        key = d.keys.entitlement(old.name)
        rev = await d.store.commit([d.state.guard(key)], {key: replace(old, shard=shard).to_json()})
        await d.state.wait_for(rev)
    return reply(entitlement_view(d, old.name, detail=True))


async def list_entitlements(request: web.Request) -> web.Response:
    d: ControlDaemon = request.app[DAEMON]
    return reply({"entitlements": [entitlement_view(d, n) for n in sorted(d.state.entitlements)]})


async def show_entitlement(request: web.Request) -> web.Response:
    d: ControlDaemon = request.app[DAEMON]
    return reply(entitlement_view(d, _entitlement(d, request.match_info["name"]).name, detail=True))


# -- jobs --------------------------------------------------------------------------------------


def _job(d: ControlDaemon, request: web.Request) -> JobRec:
    handle = f"{request.match_info['ent']}/{request.match_info['name']}"
    job = d.state.jobs.get(handle)
    if job is None:
        raise ApiError("not_found", "job", f"no job {handle!r}")
    return job


def _read(d: ControlDaemon, request: web.Request) -> tuple[JobRec, int]:
    """The job and the revision it was read at: a later write is guarded by that revision."""
    job = _job(d, request)
    return job, d.state.revs[d.keys.job(job.handle)]


def _confined(job: JobRec, ent: EntitlementRec) -> None:
    """A task on the host's network reaches all the host reaches (the region's etcd among it): only
    in an entitlement whose policy allows it, which an admin sets."""
    if job.task.get("network_mode") == "host" and not ent.allow_host_network:
        raise ApiError("forbidden", "task.network_mode", f"entitlement {ent.name} does not allow the host's network "
                       "(an admin may set allow_host_network on it); use bridge or none")


def _sealed(d: ControlDaemon, job: JobRec, old: JobRec | None) -> JobRec:
    """The job with its secret values and its controller token sealed for the store (a value the
    job holds already keeps its sealed form: controlplane/security/sealing.py), within the store's bound on
    a job's size."""
    sealer = d.state.sealer
    try:
        task = sealer.seal_task(job.handle, job.task, old.task if old is not None else None)
        token = sealer.seal_token(job.handle, job.controller_token, old.controller_token if old is not None else None)
    except ValueError as e:
        field, _, why = str(e).partition(": ")
        raise ApiError("unprocessable", field, why) from None
    if task is not job.task:
        check_job_size(job.count, task)
    return replace(job, task=task, controller_token=token)


def _opened(d: ControlDaemon, job: JobRec, var: str, value) -> object:
    try:
        return d.state.sealer.open(job.handle, var, value)
    except SealingError as e:
        raise ApiError("unprocessable", field_of(var), f"null keeps the current value, which this daemon cannot open ({e}); "
                       "send the value") from None


async def create_job(request: web.Request) -> web.Response:
    d: ControlDaemon = request.app[DAEMON]
    job = JobRec.parse(await body(request, schema=S.JobSpec))
    if not request[PRINCIPAL].may_change_jobs_of(job.entitlement):
        raise tokens.forbidden(request[PRINCIPAL], "POST", request.path, f"owner of entitlement {job.entitlement}")
    _confined(job, _entitlement(d, job.entitlement))
    old = d.state.jobs.get(job.handle)
    read_revision = d.state.revs.get(d.keys.job(job.handle), 0)
    if old is not None and old.state != "stopped":
        raise ApiError("exists", "name", f"job {job.handle!r} exists ({old.state}); use update, or stop it first")
    if old is not None:
        job = replace(job, spec_version=old.spec_version + 1, created_at=old.created_at)
    sched = d.scheduler_for(job.handle)
    if sched is None:  # the leader of the job's shard takes the body as it came
        return await forward(request, d.state.shard_of_job(job.handle))
    job = _sealed(d, job, old)
    try:
        await sched.create(job, read_revision)
    except Conflict:
        raise ApiError("exists", "name", f"job {job.handle!r} was created or changed concurrently") from None
    except AllocationError as e:
        raise allocation_error(e) from None
    return reply(job_view(d, d.state.jobs[job.handle]), 201)


async def update_job(request: web.Request) -> web.Response:
    d: ControlDaemon = request.app[DAEMON]
    old, read_revision = _read(d, request)
    new = JobRec.parse(keep_secrets(await body(request, schema=S.JobSpec), old, lambda var, v: _opened(d, old, var, v)))
    if new.handle != old.handle:
        raise ApiError("unprocessable", "name", f"the spec is for {new.handle}, not {old.handle}")
    new = _sealed(d, new, old)
    _confined(new, _entitlement(d, new.entitlement))
    if old.state != "active":
        raise ApiError("conflict", "state", f"job {old.handle} is {old.state}; run it again instead")
    changed_task = new.task != old.task
    new = replace(new, spec_version=old.spec_version + (1 if changed_task else 0), created_at=old.created_at)
    if new.count > old.count or new.resources() != old.resources() or (new.machine_type, new.dc) != (old.machine_type, old.dc):
        await _fits(d, new)  # what the update asks for must fit; a task already without room is not its fault
    await put_job(d, new, read_revision)
    return reply(job_view(d, d.state.jobs[new.handle]))


async def resize_job(request: web.Request) -> web.Response:
    d: ControlDaemon = request.app[DAEMON]
    old, read_revision = _read(d, request)
    count = (await body(request, schema=S.Resize))["count"]  # an integer from 0 to 10000 (the schema)
    if old.state != "active":
        raise ApiError("conflict", "state", f"job {old.handle} is {old.state}")
    if count > old.count:
        _confined(old, _entitlement(d, old.entitlement))  # more host-network tasks: the policy as it is now
    check_job_size(count, old.task)
    new = replace(old, count=count, updated_at=time.time())
    if count > old.count:
        await _fits(d, new)
    await put_job(d, new, read_revision)
    return reply(job_view(d, d.state.jobs[new.handle]))


async def _fits(d: ControlDaemon, job: JobRec) -> None:
    """Raise if the job (as it would be) cannot be placed now; any replica can tell."""
    try:
        allocate(d.state.snapshot(), job_request(job))
    except AllocationError as e:
        raise allocation_error(e) from None


async def put_job(d: ControlDaemon, job: JobRec, read_revision: int) -> int:
    """Write a job record derived from the one read at `read_revision`: Conflict if anything wrote
    the job since (no lost update). Any replica may: the shard's leader acts on it by the watch."""
    key = d.keys.job(job.handle)
    rev = await d.store.commit([Versioned(key, None, read_revision)], {key: job.to_json()})
    await d.state.wait_for(rev)
    return rev


async def stop_job(request: web.Request) -> web.Response:
    d: ControlDaemon = request.app[DAEMON]
    old, read_revision = _read(d, request)
    if old.state == "active":
        await put_job(d, replace(old, state="stopping", updated_at=time.time()), read_revision)
    return reply(job_view(d, d.state.jobs[old.handle]), 202)


async def list_jobs(request: web.Request) -> web.Response:
    d: ControlDaemon = request.app[DAEMON]
    ent = request.query.get("entitlement")
    if ent is not None and not NAME.fullmatch(ent):
        raise ApiError("invalid", "entitlement", f"{ent[:80]!r} is not an entitlement name")
    jobs = [job_view(d, j) for h, j in sorted(d.state.jobs.items()) if ent is None or j.entitlement == ent]
    for j in jobs:
        j.pop("tasks")
    return reply({"jobs": jobs})


async def show_job(request: web.Request) -> web.Response:
    d: ControlDaemon = request.app[DAEMON]
    job = _job(d, request)
    if d.scheduler_for(job.handle) is None:
        # the shard's leader knows the job's plan and TaskControl session; the rest is the same
        try:
            return await forward(request, d.state.shard_of_job(job.handle))
        except ApiError:
            pass  # no leader, or it does not answer (it died; its lease has not run out): our own view
    return reply(job_view(d, job))


# -- machines, events, discovery ---------------------------------------------------------------


async def list_machines(request: web.Request) -> web.Response:
    d: ControlDaemon = request.app[DAEMON]
    return reply({"machines": [machine_view(d, mid) for mid in sorted(d.state.machines)]})


async def show_machine(request: web.Request) -> web.Response:
    d: ControlDaemon = request.app[DAEMON]
    mid = request.match_info["id"]
    if mid not in d.state.machines:
        raise ApiError("not_found", "machine", f"no machine {mid!r}")
    return reply(machine_view(d, mid, detail=True))


async def _on_machine(request: web.Request, act: Callable[[ControlDaemon, str], Awaitable[None]]) -> web.Response:
    """An admin's action on one machine; the answer is the machine as it is after."""
    d: ControlDaemon = request.app[DAEMON]
    mid = request.match_info["id"]
    if mid not in d.state.machines:
        raise ApiError("not_found", "machine", f"no machine {mid!r}")
    await act(d, mid)
    return reply(machine_view(d, mid, detail=True))


async def release_machine(request: web.Request) -> web.Response:
    return await _on_machine(request, lambda d, mid: d.agents.release(mid))


async def clean_machine(request: web.Request) -> web.Response:
    return await _on_machine(request, lambda d, mid: d.health.clean(mid))


async def create_token(request: web.Request) -> web.Response:
    d: ControlDaemon = request.app[DAEMON]
    token_id, secret, record = tokens.parse_new(await body(request, schema=S.TokenSpec), time.time())
    key = d.keys.token(token_id)
    await d.state.wait_for(await d.store.commit([Versioned(key, None, 0)], {key: record}))
    return reply({**tokens.view(record), "token": secret}, 201)


async def list_tokens(request: web.Request) -> web.Response:
    d: ControlDaemon = request.app[DAEMON]
    return reply({"tokens": [tokens.view(r) for _, r in sorted(d.state.tokens.items())]})


async def revoke_token(request: web.Request) -> web.Response:
    d: ControlDaemon = request.app[DAEMON]
    token_id = request.match_info["id"]
    if token_id not in d.state.tokens:
        raise ApiError("not_found", "token", f"no token {token_id!r}")
    key = d.keys.token(token_id)
    await d.state.wait_for(await d.store.commit([d.state.guard(key)], {}, [key]))
    return reply({"revoked": token_id})


async def list_events(request: web.Request) -> web.Response:
    d: ControlDaemon = request.app[DAEMON]
    events = sorted(d.state.events.values(), key=lambda e: e.start)
    return reply({"events": [e.to_json() for e in events]})


# -- maintenance (the ops planner) -------------------------------------------------------------


def maintenance_view(d: ControlDaemon, e: EventRec, now: float) -> dict:
    tasks = [{"job": t.job, "index": t.index, "machine": t.machine, "state": t.state}
             for mid in e.machines for t in d.state.tasks_on(mid)]
    return {**e.to_json(), "phase": e.phase(now), "until": e.until,
            "policy": e.policy or d.maintenance_policy, "policy_default": e.policy is None,
            "tasks": tasks}


def _maintenance(d: ControlDaemon, request: web.Request) -> EventRec:
    e = d.state.events.get(request.match_info["id"])
    if e is None or e.kind != "maintenance":
        raise ApiError("not_found", "maintenance", f"no maintenance {request.match_info['id']!r}")
    return e


async def schedule_maintenance(request: web.Request) -> web.Response:
    d: ControlDaemon = request.app[DAEMON]
    now = time.time()
    e = parse_maintenance(await body(request, schema=S.MaintenanceSpec), d.state.machines, now)
    key = d.keys.event(e.id)
    rev = await d.store.commit([d.state.guard(key)], {key: e.to_json()})
    await d.state.wait_for(rev)
    d.state.changed.set()
    return reply(maintenance_view(d, d.state.events[e.id], now), 201)


async def list_maintenance(request: web.Request) -> web.Response:
    d: ControlDaemon = request.app[DAEMON]
    now = time.time()
    events = sorted((e for e in d.state.events.values() if e.kind == "maintenance"), key=lambda e: (e.start, e.id))
    every = request.query.get("all", "0")
    if every not in S.ALL:
        raise ApiError("invalid", "all", f"{every[:80]!r}: 1 (or true) for all, 0 (or false) for those not over")
    if every not in ("1", "true"):
        events = [e for e in events if e.phase(now) != "over"]
    return reply({"maintenance": [maintenance_view(d, e, now) for e in events]})


async def show_maintenance(request: web.Request) -> web.Response:
    d: ControlDaemon = request.app[DAEMON]
    return reply(maintenance_view(d, _maintenance(d, request), time.time()))


async def end_maintenance(request: web.Request) -> web.Response:
    """End a maintenance now: before its deadline this cancels it; during it, its machines are
    back (their suspended tasks start again)."""
    d: ControlDaemon = request.app[DAEMON]
    e = _maintenance(d, request)
    now = time.time()
    if e.phase(now) == "over":
        raise ApiError("conflict", "maintenance", f"maintenance {e.id} is over already")
    key = d.keys.event(e.id)
    rev = await d.store.commit([d.state.guard(key)], {key: replace(e, end=now).to_json()})
    await d.state.wait_for(rev)
    d.state.changed.set()
    return reply(maintenance_view(d, d.state.events[e.id], now))


async def discovery(request: web.Request) -> web.Response:
    d: ControlDaemon = request.app[DAEMON]
    job = _job(d, request)
    eps = sorted((v for (h, _), v in d.state.endpoints.items() if h == job.handle), key=lambda v: v["index"])
    return reply({"job": job.handle, "endpoints": eps})


# -- agents ------------------------------------------------------------------------------------


async def agent_register(request: web.Request) -> web.Response:
    d: ControlDaemon = request.app[DAEMON]
    return reply(await d.agents.register(await body(request, schema=S.AgentRegister), request.headers.get(CREDENTIAL_HEADER)))


async def agent_desired(request: web.Request) -> web.Response:
    d: ControlDaemon = request.app[DAEMON]
    try:
        wait = float(request.query.get("wait", "0"))
    except ValueError:
        wait = -1.0
    if not 0 <= wait <= S.MAX_WAIT_ASKED:  # NaN too; more than the longest wait (--max-long-poll) is that wait
        raise ApiError("invalid", "wait", f"must be a number of seconds from 0 to {S.MAX_WAIT_ASKED}")
    version = request.query.get("version", "")
    if len(version) > S.MAX_VERSION:
        raise ApiError("invalid", "version", f"a desired state's version has at most {S.MAX_VERSION} characters")
    return reply(await d.agents.desired(request[MACHINE], version, wait))


async def agent_heartbeat(request: web.Request) -> web.Response:
    d: ControlDaemon = request.app[DAEMON]
    return reply(await d.agents.heartbeat(request[MACHINE], await body(request, schema=S.Heartbeat)))


async def agent_shutdown(request: web.Request) -> web.Response:
    d: ControlDaemon = request.app[DAEMON]
    return reply(await d.agents.reboots.announce(request[MACHINE], await body(request, schema=S.Shutdown)))


# -- meta --------------------------------------------------------------------------------------


async def openapi(request: web.Request) -> web.Response:
    return reply(document(request.app[DAEMON].keys.region))


async def healthz(request: web.Request) -> web.Response:
    d: ControlDaemon = request.app[DAEMON]
    if stale := d.state.stale:
        return reply({"ok": False, **ApiError("unavailable", None, stale).to_json()}, 503)
    return reply({"ok": True})


async def metrics(request: web.Request) -> web.Response:
    d: ControlDaemon = request.app[DAEMON]
    return web.Response(text=d.metrics_text(), content_type="text/plain")


ROUTES = [
    ("POST", "/v1/entitlements", create_entitlement),
    ("GET", "/v1/entitlements", list_entitlements),
    ("GET", "/v1/entitlements/{name}", show_entitlement),
    ("PATCH", "/v1/entitlements/{name}", modify_entitlement),
    ("POST", "/v1/entitlements/{name}/move", move_entitlement),
    ("POST", "/v1/jobs", create_job),
    ("GET", "/v1/jobs", list_jobs),
    ("GET", "/v1/jobs/{ent}/{name}", show_job),
    ("PUT", "/v1/jobs/{ent}/{name}", update_job),
    ("POST", "/v1/jobs/{ent}/{name}/resize", resize_job),
    ("DELETE", "/v1/jobs/{ent}/{name}", stop_job),
    ("GET", "/v1/machines", list_machines),
    ("GET", "/v1/machines/{id}", show_machine),
    ("POST", "/v1/machines/{id}/release", release_machine),
    ("POST", "/v1/machines/{id}/clean", clean_machine),
    ("POST", "/v1/tokens", create_token),
    ("GET", "/v1/tokens", list_tokens),
    ("DELETE", "/v1/tokens/{id}", revoke_token),
    ("GET", "/v1/events", list_events),
    ("POST", "/v1/maintenance", schedule_maintenance),
    ("GET", "/v1/maintenance", list_maintenance),
    ("GET", "/v1/maintenance/{id}", show_maintenance),
    ("POST", "/v1/maintenance/{id}/end", end_maintenance),
    ("GET", "/v1/discovery/{ent}/{name}", discovery),
    ("POST", "/v1/agent/register", agent_register),
    ("GET", "/v1/agent/desired", agent_desired),
    ("POST", "/v1/agent/heartbeat", agent_heartbeat),
    ("POST", "/v1/agent/shutdown", agent_shutdown),
    ("GET", "/v1/openapi.json", openapi),
    ("GET", "/v1/metrics", metrics),
    ("GET", "/v1/cluster", cluster),
    ("POST", "/v1/internal/relay", internal_relay),
    ("GET", "/healthz", healthz),
]


def make_app(daemon: ControlDaemon) -> web.Application:
    app = web.Application(middlewares=[errors_and_auth], client_max_size=MAX_INTERNAL_BODY)
    app[DAEMON] = daemon
    for method, path, handler in ROUTES:
        app.router.add_route(method, path, handler)
    return app
