"""The region's current usage: this replica's book plus the other replicas' partial sums
(controlplane/usage/region.py), as the relay carries them (frontend/schema.py UsagePartial)."""

from __future__ import annotations

import asyncio

import msgspec

from controlplane.frontend.schema import UsagePartial
from controlplane.usage.book import TaskUsage, UsageBook
from controlplane.usage.region import RegionUsage

CELL = ("dc1", "msb1", "web", "base", "generic")


def report(cpu: float, tasks: list) -> dict:
    return {"window": 1.0, "cpus": 8, "cpu": cpu, "memory_mb": 1000.0, "memory_total_mb": 8192.0, "power_w": None,
            "tasks": tasks}


def wire(partial: dict) -> UsagePartial:
    """As the peer sends it and this replica decodes it."""
    return msgspec.json.decode(msgspec.json.encode(partial), type=UsagePartial)


def test_peers_partials_add_to_the_books_and_a_silent_peer_drops_out():
    a, b = RegionUsage(UsageBook(stale=100), stale=5), RegionUsage(UsageBook(stale=100), stale=5)
    a.book.note("m1", CELL, report(1.5, [["web/api", 0, 1.0, 100.0]]), {"web/api"}, 0)
    b.book.note("m2", CELL, report(0.5, [["web/api", 1, 0.25, 50.0], ["web/db", 0, 0.1, 10.0]]), {"web/api", "web/db"}, 0)
    a.receive("b", wire(b.partial(now=10)), now=10)
    assert a.job("web/api", now=11) == [1250, 150, 2] and a.job("web/db", now=11) == [100, 10, 1]
    assert a.jobs(now=11) == {"web/api": [1250, 150, 2], "web/db": [100, 10, 1]}
    assert a.cells(now=11)[CELL] == [1350, 160, 2000, 2000, 0, 2, 0]
    assert a.job("web/db", now=16) is None and a.cells(now=16)[CELL][5] == 1  # b's partial is 6 s old
    assert list(a.peers) == []


def test_a_partials_size_follows_jobs_and_cells_not_machines():
    r = RegionUsage(UsageBook(stale=100))
    for i in range(1000):
        r.book.note(f"m{i}", CELL, report(1.0, [["web/api", i, 0.5, 10.0]]), {"web/api"}, 0)
    partial = r.partial(now=1)
    assert partial["jobs"] == {"web/api": [500_000, 10_000, 1000]} and len(partial["cells"]) == 1
    assert len(msgspec.json.encode(partial)) < 200


def test_each_tasks_figures_are_the_books_and_the_other_replicas_newest_first():
    """Issue #35: the figures of a task stay with the replica its machine heartbeats to; `tasks`
    adds the other replicas' (asked for, not relayed), the newer report winning for a machine whose
    heartbeats moved (it is in both books until the first lets it go)."""
    r = RegionUsage(UsageBook(stale=100))
    r.book.note("m1", CELL, report(1.0, [["web/api", 0, 0.8, 100.0]]), {"web/api"}, 0, wall=200.0)
    r.book.note("m3", CELL, report(1.0, [["web/api", 2, 0.3, 30.0]]), {"web/api"}, 0, wall=200.0)
    asked = []

    async def peers(jobs, entitlements):
        asked.append((jobs, entitlements))
        return [TaskUsage("web/api", 1, "m2", 50, 20, 199.0, 50), TaskUsage("web/api", 2, "m3", 900, 90, 201.0, 900),
                TaskUsage("web/api", 0, "m1", 100, 10, 150.0, 100)]

    r.peer_tasks = peers
    got = asyncio.run(r.tasks(jobs=["web/api"], now=1))
    assert asked == [(["web/api"], None)]
    assert {k: (t.cpu_m, t.at) for k, t in got.items()} == {("web/api", 0, "m1"): (800, 200.0),
                                                            ("web/api", 1, "m2"): (50, 199.0),
                                                            ("web/api", 2, "m3"): (900, 201.0)}
    r.peer_tasks = None  # a lone replica: its book's
    assert set(asyncio.run(r.tasks(entitlements={"web"}, now=2))) == {("web/api", 0, "m1"), ("web/api", 2, "m3")}


def test_a_replicas_ask_of_its_books_tasks_lets_the_event_loop_run_between_slices():
    """own_tasks and tasks answer a large ask in slices of STEP_TASKS, the loop running between
    them (a heartbeat waits a slice, not the whole ask): a coroutine beside it runs meanwhile."""
    from controlplane.usage.book import STEP_TASKS
    r = RegionUsage(UsageBook(stale=100))
    n = 3 * STEP_TASKS // 20 + 1  # machines of 20 tasks: four slices' worth
    for k in range(n):
        r.book.note(f"m{k}", CELL, report(1.0, [["web/api", 20 * k + i, 0.01, 1.0] for i in range(20)]), {"web/api"}, 0)

    async def both():
        ticks, asked = [], asyncio.get_running_loop().create_future()

        async def ticker():
            while not asked.done():
                ticks.append(len(ticks))
                await asyncio.sleep(0)

        beside = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        t0 = len(ticks)
        mine = await r.own_tasks(now=1)
        during_own = len(ticks) - t0
        t0 = len(ticks)
        merged = await r.tasks(now=1)
        asked.set_result(None)
        await beside
        return mine, merged, during_own, len(ticks) - t0

    mine, merged, during_own, during_tasks = asyncio.run(both())
    assert len(mine) == 20 * n and mine == r.book.tasks()
    assert set(merged) == {(t.job, t.index, t.machine) for t in mine}
    assert during_own >= 3 and during_tasks >= 3 + 3  # its own slices, then the merge's
