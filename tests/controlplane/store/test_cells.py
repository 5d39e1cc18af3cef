"""The machines' sums kept as their records change (store/cells.py, issue #38) are what a full
recount of the machines gives: after random changes through real etcd (machines added, changed in
every field a cell sums, moved between entitlements and the pool, deleted; tasks placed, moved,
resized and removed), and in a second view that reads the region afresh (a restart, or another
replica). The fleet's answer and the metrics read them: their figures are checked against the
same recount. What a machine's tasks hold is summed from the tasks (RegionState.held), never
written in the machine's record: it is checked against a recount of the tasks too."""

from __future__ import annotations

import asyncio
import random
import uuid
from dataclasses import replace

from controlplane.capacity import slo
from controlplane.store import Store
from controlplane.store.cells import MACHINES, micro, millicores, reserved
from controlplane.store.keys import Keys
from controlplane.store.records import EntitlementRec, MachineRec, Moving, TaskRec
from controlplane.store.state import RegionState
from controlplane.usage import fleet
from controlplane.usage.book import UsageBook, cell_of
from controlplane.usage.region import RegionUsage


def random_machine(rnd: random.Random, mid: str) -> MachineRec:
    cpus = rnd.choice([4, 8, 4.5])
    return MachineRec(
        mid, mid, {"region": "r", "dc": rnd.choice(["dc1", "dc2"]), "msb": rnd.choice(["b1", "b2", "b3"]),
                   "rack": "r1", "machine_type": rnd.choice(["t1", "t2"])},
        {"cpus": cpus, "memory_mb": rnd.choice([4096, 8192])}, rnd.choice([None, None, "web", "batch"]),
        healthy=rnd.random() < 0.8, profile_applied=rnd.choice([None, "default", "web"]),
        tombstones=(("web/a", 0, 1.0, 1, 2.0),) if rnd.random() < 0.1 else ())


def random_task(rnd: random.Random, job: str, index: int, spec_version: int) -> TaskRec:
    spec = {"image": "busybox", "cpus": rnd.choice([0.25, 0.5, 1.25, 0.001]), "memory_mb": rnd.choice([64, 300])}
    machine = rnd.choice([None, *(f"m{i}" for i in range(55))])  # some on machines that do not exist
    moving = Moving(f"m{rnd.randrange(50)}") if machine and rnd.random() < 0.2 else None
    return TaskRec(job, index, spec_version, spec, machine, rnd.choice(["running", "allocated", "stopped"]),
                   moving=moving)


def tasks_recount(state: RegionState) -> dict:
    """What each machine's tasks hold (micro-cores, MiB), by a pass over every task."""
    out: dict = {}
    for ts in state.tasks.values():
        for t in ts.values():
            cpus, mem = t.resources
            for mid in t.holds():
                was = out.get(mid, (0, 0, 0))
                out[mid] = (was[0] + 1, was[1] + micro(cpus), was[2] + mem)
    return out


def recount(state: RegionState) -> tuple[dict, dict, dict]:
    """The cells, the pool and what each entitlement holds, by a pass over every machine (and
    over every task, for what they hold)."""
    rows: dict = {}
    pool: dict = {}
    held: dict = {}
    tasks = tasks_recount(state)
    for m in state.machines.values():
        r = rows.setdefault(cell_of(m), [0] * 7)
        cpu_m, mb = reserved(m, tasks.get(m.id, (0, 0, 0))[1:])
        for i, v in enumerate((1, m.healthy, millicores(m.capacity["cpus"]), m.capacity["memory_mb"],
                               cpu_m, mb, bool(m.tombstones))):
            r[i] += v
        if m.entitlement is None:
            p = pool.setdefault((m.labels["machine_type"], m.labels["dc"]), [0, 0])
            p[0] += 1
            p[1] += m.healthy
        else:
            held[m.entitlement] = held.get(m.entitlement, 0) + 1
    return rows, pool, held


def pool_recount(state: RegionState) -> dict:
    """slo.pool's figures by a pass over every machine (no maintenance, no reclaim here)."""
    out: dict = {}
    per_msb: dict = {}
    for m in state.machines.values():
        g = out.setdefault(f"{m.labels['machine_type']}/{m.labels['dc']}", dict.fromkeys(slo.FIGURES, 0))
        if not m.healthy:
            continue
        kind = "free" if m.entitlement is None else state.entitlements[m.entitlement].kind
        g["machines"] += 1
        g[kind] += 1
        g["available"] += kind != "guaranteed"
        if kind == "guaranteed":
            key = (f"{m.labels['machine_type']}/{m.labels['dc']}", m.labels["msb"])
            per_msb[key] = per_msb.get(key, 0) + 1
    for (group, _), n in per_msb.items():
        out[group]["buffer"] = max(out[group]["buffer"], n)
    return out


def kept(state: RegionState) -> tuple[dict, dict, dict]:
    return state.cells.rows, state.cells.pool, state.cells.held


def test_the_sums_kept_equal_a_recount_after_random_changes_and_in_a_fresh_view(etcd_server):
    region = "c" + uuid.uuid4().hex[:8]
    keys = Keys(region)

    async def main():
        store = Store([("127.0.0.1", etcd_server.port)])
        state = RegionState(store, keys)
        await state.start()
        fresh = None
        try:
            rnd = random.Random(38)
            await state.write([], {keys.entitlement("web"): EntitlementRec("web", "t1", 100).to_json(),
                                   keys.entitlement("batch"): EntitlementRec("batch", "t1", 100,
                                                                             kind="opportunistic").to_json()})
            for _ in range(8):
                puts, deletes = {}, []
                for _ in range(40):
                    mid = f"m{rnd.randrange(50)}"
                    if keys.machine(mid) in puts or keys.machine(mid) in deletes:
                        continue
                    if rnd.random() < 0.15 and mid in state.machines:
                        deletes.append(keys.machine(mid))
                    else:
                        puts[keys.machine(mid)] = random_machine(rnd, mid).to_json()
                await state.write([], puts, deletes)
                assert kept(state) == recount(state)
            assert len(state.machines) > 20 and state.cells.pool and len(state.cells.held) == 2
            for rnd_round in range(6):  # tasks placed, moved, resized, removed; now and then a machine's health
                puts, deletes = {}, []
                for _ in range(30):
                    job, index = rnd.choice(["web/a", "web/b", "batch/c"]), rnd.randrange(12)
                    key = keys.task(job, index)
                    if key in puts or key in deletes:
                        continue
                    if rnd.random() < 0.2 and index in state.tasks.get(job, {}):
                        deletes.append(key)
                    else:
                        puts[key] = random_task(rnd, job, index, rnd_round).to_json()
                for mid in rnd.sample(sorted(state.machines), 3):
                    m = state.machines[mid]
                    puts[keys.machine(mid)] = replace(m, healthy=not m.healthy).to_json()
                await state.write([], puts, deletes)
                assert kept(state) == recount(state)
                counted = tasks_recount(state)
                assert {mid: (len(state.by_machine[mid]), *h) for mid, h in state.held.items()} == counted
                for mid in sorted(state.machines):
                    m = state.machines[mid]
                    n, cpu_u, mb = counted.get(mid, (0, 0, 0))
                    stones = m.tombstones
                    assert state.allocated(mid) == (n + len(stones), round((cpu_u + sum(micro(t[2]) for t in stones)) / 1e6, 6),
                                                    mb + sum(t[3] for t in stones))
            assert state.held and any(len(ts) > 1 for ts in state.by_machine.values())
            fresh = RegionState(store, keys)  # a restart, or another replica: the sums made from a first read
            await fresh.start()
            assert kept(fresh) == recount(fresh) == kept(state)
            assert fresh.held == state.held
            # what the answers give, against the recount
            answer = fleet.answer(state, RegionUsage(UsageBook()), ["dc", "type", "entitlement"])
            rows, pool, held = recount(state)
            by = {}
            for (dc, _, ent, _, mtype), r in rows.items():
                by.setdefault((dc, mtype, ent), [0, 0])
                by[(dc, mtype, ent)][0] += r[MACHINES]
                by[(dc, mtype, ent)][1] += r[1]
            assert {(c["dc"], c["type"], c["entitlement"]): [c["machines"], c["healthy"]] for c in answer["cells"]} == by
            assert {(p["type"], p["dc"]): [p["machines"], p["usable"]] for p in answer["free_pool"]} == pool
            assert slo.pool(state, 0.0) == pool_recount(state)  # the capacity tier's look at the pool
        finally:
            await state.stop()
            if fresh is not None:
                await fresh.stop()
            await store.close()

    asyncio.run(main())


def test_a_rewrite_of_a_machine_no_cell_counted_is_taken_out_and_put_in_as_any_change():
    """The same-cell shortcut needs the machine's cell: without it (a state fed by hand, as
    bench_commit did), the change is made the long way, never an error that would skip the record."""
    from controlplane.store.cells import RESERVED_CPU_M, Cells

    m = random_machine(random.Random(1), "m1")
    m2 = replace(m, tombstones=(("web/a", 1, 2.0, 64, 3.0),))
    cells, long_way = Cells(), Cells()
    cells.change(m, m2, (500_000, 64))
    long_way._add(m, -1, (500_000, 64))  # noqa: SLF001
    long_way._add(m2, 1, (500_000, 64))  # noqa: SLF001
    assert (cells.rows, cells.pool, cells.held) == (long_way.rows, long_way.pool, long_way.held)
    # what its tasks hold changes: its cell's reserved figures follow, its tombstone's counted too
    fresh = Cells()
    fresh.change(None, m2, (500_000, 64))
    fresh.hold(m2, (500_000, 64), (1_500_000, 128))
    assert fresh.rows[cell_of(m2)][RESERVED_CPU_M:RESERVED_CPU_M + 2] == [1500 + 2000, 128 + 64]
