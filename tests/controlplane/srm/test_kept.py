"""What the SRM keeps of a job in etcd (its last resizes, its size over time) is what a new leader
shows: real etcd, two Autoscalers as two leaders one after the other."""

from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace

from controlplane.srm.service import Autoscaler, JobView
from controlplane.store import Store
from controlplane.store.keys import Keys
from controlplane.store.autoscale import Autoscale
from controlplane.store.records import JobRec
from controlplane.store.state import RegionState


def test_a_new_leader_shows_the_resizes_the_last_one_kept(etcd_server):
    region = "r" + uuid.uuid4().hex[:8]

    async def main():
        store = Store([("127.0.0.1", etcd_server.port)])
        state = RegionState(store, Keys(region))
        await state.start()
        job = JobRec("web", "api", 3, {"image": "x", "cpus": 1, "memory_mb": 64}, autoscale=Autoscale())
        nobody = SimpleNamespace(schedulers={}, scheduler_for=lambda h: None)
        first = Autoscaler(state, SimpleNamespace(jobs=dict), nobody)
        view = first.views[job.handle] = JobView()
        view.events.append({"at": 1.0, "was": 2, "to": 3, "reason": "load 1.40 needs 3 at 0.5 a task"})
        view.steps.append((0, 3, 3))
        await first._keep(job.handle)  # noqa: SLF001 - as a resize does
        second = Autoscaler(state, SimpleNamespace(jobs=dict), nobody)
        await second.load_kept(job.handle)
        shown = second.status(job)
        assert shown["events"] == list(view.events) and shown["history"] == [[0, 3, 3]]
        assert shown["reason"].startswith("not decided yet")
        await store.close()
        await state.stop()

    asyncio.run(main())
