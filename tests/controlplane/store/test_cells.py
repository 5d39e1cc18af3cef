"""The machines' sums kept as their records change (store/cells.py, issue #38) are what a full
recount of the machines gives: after random changes through real etcd (machines added, changed in
every field a cell sums, moved between entitlements and the pool, deleted), and in a second view
that reads the region afresh (a restart, or another replica). The fleet's answer and the metrics
read them: their figures are checked against the same recount."""

from __future__ import annotations

import asyncio
import random
import uuid
from dataclasses import replace

from controlplane.capacity import slo
from controlplane.store import Store
from controlplane.store.cells import MACHINES, millicores
from controlplane.store.keys import Keys
from controlplane.store.records import EntitlementRec, MachineRec
from controlplane.store.state import RegionState
from controlplane.usage import fleet
from controlplane.usage.book import UsageBook, cell_of
from controlplane.usage.region import RegionUsage


def random_machine(rnd: random.Random, mid: str) -> MachineRec:
    cpus = rnd.choice([4, 8, 4.5])
    alloc = rnd.choice([0.0, 0.5, 1.25, 3.0])
    return MachineRec(
        mid, mid, {"region": "r", "dc": rnd.choice(["dc1", "dc2"]), "msb": rnd.choice(["b1", "b2", "b3"]),
                   "rack": "r1", "machine_type": rnd.choice(["t1", "t2"])},
        {"cpus": cpus, "memory_mb": rnd.choice([4096, 8192])}, rnd.choice([None, None, "web", "batch"]),
        healthy=rnd.random() < 0.8, profile_applied=rnd.choice([None, "default", "web"]),
        alloc_tasks=int(alloc > 0), alloc_cpus=alloc, alloc_memory_mb=int(alloc * 512),
        tombstones=(("web/a", 0, 1.0, 1, 2.0),) if rnd.random() < 0.1 else ())


def recount(state: RegionState) -> tuple[dict, dict, dict]:
    """The cells, the pool and what each entitlement holds, by a pass over every machine."""
    rows: dict = {}
    pool: dict = {}
    held: dict = {}
    for m in state.machines.values():
        r = rows.setdefault(cell_of(m), [0] * 7)
        for i, v in enumerate((1, m.healthy, millicores(m.capacity["cpus"]), m.capacity["memory_mb"],
                               millicores(m.alloc_cpus), m.alloc_memory_mb, bool(m.tombstones))):
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
            for _ in range(4):  # as placements rewrite them: the allocation alone, now and then health too
                puts = {}
                for mid in rnd.sample(sorted(state.machines), 15):
                    m, alloc = state.machines[mid], rnd.choice([0.0, 0.25, 2.5])
                    puts[keys.machine(mid)] = replace(m, alloc_tasks=int(alloc > 0), alloc_cpus=m.alloc_cpus + alloc,
                                                      alloc_memory_mb=m.alloc_memory_mb + int(alloc * 256),
                                                      healthy=m.healthy != (rnd.random() < 0.2)).to_json()
                await state.write([], puts)
                assert kept(state) == recount(state)
            fresh = RegionState(store, keys)  # a restart, or another replica: the sums made from a first read
            await fresh.start()
            assert kept(fresh) == recount(fresh) == kept(state)
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
    """The allocation-only shortcut needs the machine's cell: without it (a state fed by hand, as
    bench_commit did), the change is made the long way, never an error that would skip the record."""
    from controlplane.store.cells import RESERVED_CPU_M, Cells

    m = random_machine(random.Random(1), "m1")
    m2 = replace(m, alloc_cpus=m.alloc_cpus + 2.0)
    cells, long_way = Cells(), Cells()
    cells.change(m, m2)
    long_way._add(m, -1)  # noqa: SLF001
    long_way._add(m2, 1)  # noqa: SLF001
    assert (cells.rows, cells.pool, cells.held) == (long_way.rows, long_way.pool, long_way.held)
    cells.change(None, m)  # counted: the shortcut's
    cells.change(m, m2)
    assert cells.rows[cell_of(m)][RESERVED_CPU_M] == millicores(m2.alloc_cpus)
