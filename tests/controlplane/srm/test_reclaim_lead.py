"""Issue #37: growth the SRM's forecast sees coming is asked for in time for a reclaim's notice. With
no free machine of the job's type, the forecast's horizon reaches the longest notice of the
opportunistic entitlements further; with a free machine it does not (nothing to wait for). Real etcd
and the region's state; the job's usage history is the Recorder's series, made here."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from types import SimpleNamespace

from controlplane.srm.service import Autoscaler
from controlplane.store import Store
from controlplane.store.autoscale import Autoscale
from controlplane.store.keys import Keys
from controlplane.store.records import EntitlementRec, JobRec, MachineRec
from controlplane.store.state import RegionState
from controlplane.usage.history import Series

NOW = 1_800_000_000.0
DAY = 24 * 60


def machine(mid: str, entitlement: str | None) -> MachineRec:
    return MachineRec(mid, mid, {"dc": "dc1", "msb": "msb1", "rack": "r1", "machine_type": "generic"},
                      {"cpus": 4, "memory_mb": 4096}, entitlement)


def yesterday() -> Series:
    """A day ago: 1 core, and 3 cores from 8 to 12 minutes after this minute (past the 385 s the
    forecast covers on its own: start-up 60 s, the pass's 15 s, the sample's 10 s, and the 300 s a
    forecast serves), within a 600 s notice more."""
    s = Series()
    m = int(NOW // 60) - DAY
    for i in range(-5, 30):
        s.put_minute(m + i, 3000 if 8 <= i <= 12 else 1000, 64)
    return s


def test_with_no_free_machine_the_forecast_looks_a_notice_further(etcd_server):
    region = "r" + uuid.uuid4().hex[:8]

    async def main():
        store = Store([("127.0.0.1", etcd_server.port)])
        keys = Keys(region)
        state = RegionState(store, keys)
        await state.start()
        # (a commit's Revision: the view waits for all of its events, not the first of them)
        rev = await store.commit([], {
            keys.entitlement("web"): EntitlementRec("web", "generic", 3).to_json(),
            keys.entitlement("batch"): dataclasses.replace(EntitlementRec("batch", "generic", 3), kind="opportunistic",
                                                           notice=600.0).to_json(),
            keys.machine("m1"): machine("m1", "web").to_json(),
            keys.machine("m2"): machine("m2", "batch").to_json()})
        await state.wait_for(rev)
        job = JobRec("web", "api", 2, {"image": "x", "cpus": 1, "memory_mb": 64}, autoscale=Autoscale(max=10))
        recorder = SimpleNamespace(series={("job", job.handle): yesterday()})
        nobody = SimpleNamespace(schedulers={}, scheduler_for=lambda h: None)

        seen = {}

        def forecast(j: JobRec = job) -> tuple[float, float | None, int | None]:
            srm = Autoscaler(state, SimpleNamespace(jobs=dict), nobody, recorder=recorder)
            srm.look(NOW)
            d = srm.decide(j, NOW, {}, {})
            seen.update(free=srm._free, notice=srm._notice, held=dict(state.cells.held), decision=d)  # noqa: SLF001
            return srm.reclaim_lead(j), srm.memory[j.handle].forecast, d.predictive

        async def put(*machines: MachineRec) -> None:
            await state.wait_for(await store.commit([], {keys.machine(m.id): m.to_json() for m in machines}))

        # every machine is held (web's, batch's): growth takes batch's back, with 600 s of notice
        assert forecast() == (600.0, 3.0, 5), seen  # 3 cores at 0.6 of a core a task
        # a free machine: growth waits for no notice, the horizon is the job's own
        await put(machine("m3", None))
        assert forecast() == (0.0, 1.0, 2)
        # ... unless the job is pinned to another dc, where nothing is free
        assert forecast(dataclasses.replace(job, name="dc2", dc="dc2"))[0] == 600.0
        # no opportunistic machine to take back and none free: nothing to wait a notice for
        await put(machine("m3", "web"), machine("m2", "web"))
        assert forecast() == (0.0, 1.0, 2)
        await store.close()
        await state.stop()

    asyncio.run(main())
