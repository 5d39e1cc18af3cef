"""The usage history kept at shard leaders (controlplane/usage/recorder.py), against real etcd, on
a clock of the test's: a restart of controld or a change of shard leader loses at most the current
hour; records past their window and the records of jobs the region no longer has go."""

from __future__ import annotations

import asyncio
import uuid

from controlplane.store import Store
from controlplane.store.keys import Keys
from controlplane.store.records import EntitlementRec, JobRec
from controlplane.store.state import RegionState
from controlplane.usage.book import UsageBook
from controlplane.usage.recorder import Recorder, UsageKeys
from controlplane.usage.region import RegionUsage

T0 = 1_800_000_000 // 86400 * 86400  # midnight
CELL = ("dc1", "msb1", "web", "", "generic")
TASK = {"image": "twine/busybox:1", "command": ["sleep", "3600"], "cpus": 1, "memory_mb": 64}


def report(cpu: float) -> dict:
    return {"window": 1.0, "cpus": 8, "cpu": cpu, "memory_mb": 500.0, "memory_total_mb": 8192.0, "power_w": None,
            "tasks": [["web/api", 0, cpu, 100.0]]}


async def leader(port: int, region: str) -> tuple[Store, RegionState, Recorder]:
    """A process that leads shard 0: its view of the region, and its recorder (fresh: a restart)."""
    store = Store([("127.0.0.1", port)])
    state = RegionState(store, Keys(region))
    await state.start()
    usage = RegionUsage(UsageBook(stale=1e9), stale=1e9)
    return store, state, Recorder(state, store, usage, lambda: {0}, max_txn_ops=64)


def test_a_new_leader_has_every_hour_but_the_current_one_and_gone_jobs_leave_nothing(etcd_server):
    region = "r" + uuid.uuid4().hex[:8]

    async def main():
        store, state, rec = await leader(etcd_server.port, region)
        keys = Keys(region)
        # (a commit's Revision: the view waits for all of its events, not the first of them)
        await state.wait_for(await store.commit([], {keys.entitlement("web"): EntitlementRec("web", "generic", 2).to_json(),
                                                     keys.job("web/api"): JobRec("web", "api", 1, TASK).to_json()}))
        # three hours of samples every 20 s: cpu follows the hour (1, 2, then 3 cores)
        for t in range(T0, T0 + 3 * 3600 - 600, 20):
            rec.usage.book.note("m1", CELL, report(1 + (t - T0) // 3600), state.jobs, 0)
            await rec.tick(t)
        job, ent = rec.series[("job", "web/api")], rec.series[("entitlement", "web")]
        hour = T0 // 3600
        assert job.hours(hour, hour + 3) == [(hour, (1000, 1000, 1000, 100, 100, 100)),
                                            (hour + 1, (2000, 2000, 2000, 100, 100, 100))]
        assert len(job.minutes(hour * 60, hour * 60 + 180)) == 169  # the last minute is still open
        assert ent.minutes(0, hour * 60 + 180) == job.minutes(0, hour * 60 + 180)
        assert rec.counters["hours_written"] == 2

        # a restart (or another leader): the past hours are back, the current hour's points are not
        store2, state2, rec2 = await leader(etcd_server.port, region)
        await rec2.tick(T0 + 3 * 3600 - 590)
        again = rec2.series[("job", "web/api")]
        assert again.hours(hour, hour + 3) == job.hours(hour, hour + 3)
        assert again.minutes(hour * 60, hour * 60 + 180) == job.minutes(hour * 60, hour * 60 + 120)
        assert rec2.counters["records_loaded"] == 6  # 2 hours of points and a day of rollups, of 2 series

        # 48 hours on, the first hours' points are gone from etcd; their rollups stay
        ukeys = UsageKeys(region)
        rec2.usage.book.note("m1", CELL, report(0.5), state2.jobs, 0)
        for t in (T0 + 50 * 3600, T0 + 51 * 3600):
            await rec2.tick(t)
        minutes, _ = await store.range(ukeys.minutes(("job", "web/api")))
        assert [int(r.key.rsplit("/", 1)[1]) for r in minutes] == [hour + 50]  # hour + 2 had no point here
        days, _ = await store.range(ukeys.hours(("job", "web/api")))
        assert [int(r.key.rsplit("/", 1)[1]) for r in days] == [T0 // 86400, T0 // 86400 + 2]

        # the job stopped: its records go at the next hour's pass (the SRM's too); the entitlement's stay
        await store.commit([], {ukeys.srm("web/api"): {"events": [], "history": []}})
        await state2.wait_for(await store.commit([], {}, [keys.job("web/api")]))
        await rec2.tick(T0 + 52 * 3600)
        left, _ = await store.range(ukeys.root)
        assert left and not [r.key for r in left if "/job/" in r.key or "/srm/" in r.key], [r.key for r in left]
        assert rec2.counters["series_removed"] == 2 and ("job", "web/api") not in rec2.series
        for s in (store, store2):
            await s.close()
        await state.stop()
        await state2.stop()

    asyncio.run(main())
