"""The snapshot's incremental updates leave the index as a fresh build would."""

from __future__ import annotations

import random
from dataclasses import replace

from controlplane.allocator import PlacedTask, Snapshot

from .builders import grid, make_entitlement


def index_state(snap: Snapshot):
    idx = snap.index
    return ({level: {g: dict(b) for g, b in groups.items()} for level, groups in idx._buckets.items()},
            dict(idx._entries), dict(idx._held))


def test_with_changes_matches_a_rebuild():
    rnd = random.Random(7)
    snap = Snapshot.build(grid(dcs=2, msbs=3, racks=2, per_rack=3), [make_entitlement("ent"), make_entitlement("b")])
    placed: dict[tuple[str, int], PlacedTask] = {}
    for step in range(60):
        ids = sorted(snap.machines)
        ms = []
        for mid in rnd.sample(ids, 3):
            m = snap.machines[mid]
            ms.append(replace(m, version=m.version + 1, healthy=rnd.random() > 0.2,
                              entitlement=rnd.choice([None, "ent", "b"]), rack=rnd.choice(["r0", "r1", "r2"])))
        new_tasks = [PlacedTask(f"ent/j{rnd.randrange(4)}", rnd.randrange(5), rnd.choice(ids), 0.1 * rnd.randrange(1, 9), 64)
                     for _ in range(3)]
        gone = rnd.sample(sorted(placed), min(2, len(placed)))
        removed = rnd.sample(ids, 1) if step % 10 == 9 else []
        snap = snap.with_changes(machines=ms, tasks=new_tasks, removed_tasks=gone, removed_machines=removed)
        for k in gone:
            placed.pop(k)
        placed.update(((t.job, t.index), t) for t in new_tasks)
        fresh = Snapshot.build(snap.machines.values(), snap.entitlements.values(), placed.values(), snap.revision)
        assert index_state(snap) == index_state(fresh), f"step {step}"
        assert all(snap.free(m) == fresh.free(m) for m in snap.machines)
        assert snap.revision == step + 1
