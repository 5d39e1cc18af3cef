"""An allocator whose index and filters disagree is a bug, and the API says so: a resize that must
fit answers 500 with a JSON body naming the job and what disagreed, logged once, nothing written.

The real handler (Jobs.resize) behind the real middleware (Gate), over HTTP; the region is a stand-in
holding one job and a snapshot put out of step on purpose (no etcd: the request fails before any
write, which is what is checked)."""

from __future__ import annotations

import asyncio
import logging
import types
from dataclasses import replace

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from controlplane.frontend.body import BODY_TIMEOUT
from controlplane.frontend.jobs import Jobs
from controlplane.frontend.middleware import Gate
from controlplane.store.keys import Keys
from controlplane.store.records import EntitlementRec, JobRec
from tests.controlplane.allocator.builders import make_machine, snapshot

HANDLE = "ent/web"


def region_out_of_step() -> types.SimpleNamespace:
    keys = Keys("bug")
    m = make_machine("m0")
    snap = snapshot([m])
    snap._machines["m0"] = replace(m, healthy=False)  # the index still holds it healthy
    job = JobRec.parse({"entitlement": "ent", "name": "web", "count": 1,
                        "task": {"image": "twine/busybox:1", "command": ["sleep", "60"], "cpus": 1, "memory_mb": 64}})
    ent = EntitlementRec.parse({"name": "ent", "machine_type": "sky", "quota": 10, "owner": "team"})
    writes = []

    async def write(*args):
        writes.append(args)

    return types.SimpleNamespace(keys=keys, jobs={HANDLE: job}, revs={keys.job(HANDLE): 7}, entitlements={"ent": ent},
                                 stale="", snapshot=lambda: snap, write=write, writes=writes)


def test_a_resize_the_allocator_cannot_place_consistently_is_a_500_naming_the_job(caplog):
    state = region_out_of_step()
    jobs = Jobs(state, shards=None, forwarder=None, reach=None)
    gate = Gate(state, types.SimpleNamespace(authenticate=lambda request: None), ("frontend",))
    app = web.Application(middlewares=[gate.middleware])
    app[BODY_TIMEOUT] = 5.0
    app.router.add_post("/v1/jobs/{ent}/{name}/resize", jobs.resize)

    async def resize() -> tuple[int, dict]:
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:
            r = await client.post(f"/v1/jobs/{HANDLE}/resize", json={"count": 2})
            return r.status, await r.json()

    with caplog.at_level(logging.ERROR, logger="twine.controld.api"):
        status, answer = asyncio.run(resize())
    assert status == 500
    assert (answer["error"], answer["field"], answer["job"]) == ("internal", None, HANDLE)
    assert answer["why"].startswith(f"allocator inconsistency placing {HANDLE}: the allocator's index and its "
                                    "filters disagree: the index picked machine m0 for task 0")
    assert state.writes == []
    logged = [r for r in caplog.records if r.name == "twine.controld.api"]
    assert len(logged) == 1 and HANDLE in logged[0].getMessage()
