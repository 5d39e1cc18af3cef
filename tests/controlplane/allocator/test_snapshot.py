"""The snapshot's incremental updates (in place, or on a copy) leave it as a fresh build would: same
index, same free resources, same placements."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from controlplane.allocator import AllocationError, PlacedTask, Snapshot, SoftPreference, allocate

from .builders import grid, job, make_entitlement, make_machine


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


PREFS = [None, (SoftPreference("msb", "pack"),), (SoftPreference("rack", "spread"),),
         (SoftPreference("dc", "spread"), SoftPreference("rack", "pack", 0.5)),
         (SoftPreference("msb", "spread"), SoftPreference("rack", "spread", 0.5))]


def outcome(snap: Snapshot, request):
    try:
        return allocate(snap, request)
    except AllocationError as e:
        return type(e).__name__, str(e)


def random_step(rnd: random.Random, snap: Snapshot, placed: dict, step: int) -> dict:
    """`apply`'s arguments for one random batch of watch events: machines added, changed (any
    property, health, cordon, owner) and removed; tasks placed, replaced and removed; entitlements
    added, changed and removed."""
    ids = sorted(snap.machines)
    changed = []
    for mid in rnd.sample(ids, min(4, len(ids))):
        m = snap.machines[mid]
        changed.append(replace(m, version=m.version + 1, healthy=rnd.random() > 0.15, cordoned=rnd.random() < 0.1,
                               entitlement=rnd.choice([None, None, "ent", "b", "gone"]),
                               rack=rnd.choice(["r0", "r1", "r2"]), msb=rnd.choice([m.msb, "m9"]),
                               machine_type=rnd.choice(["sky", "sky", "old"]), cpus=rnd.choice([m.cpus, 2.0, 8.0])))
    added = [make_machine(f"new{step}-{k}", dc=rnd.choice(["dc0", "dc1"]), msb=f"m{rnd.randrange(3)}",
                          rack=f"r{rnd.randrange(3)}", entitlement=rnd.choice([None, "ent"]))
             for k in range(rnd.randrange(3))]
    removed = rnd.sample([m for m in ids if m not in {c.id for c in changed}], rnd.randrange(2))
    live = [m for m in ids if m not in removed] + [m.id for m in added]
    new_tasks = [PlacedTask(f"{rnd.choice(['ent', 'b'])}/j{rnd.randrange(4)}", rnd.randrange(6), rnd.choice(live),
                            rnd.choice([0.5, 1.0, 1.5]), rnd.choice([64, 512])) for _ in range(rnd.randrange(5))]
    gone = rnd.sample(sorted(placed), min(rnd.randrange(4), len(placed)))
    ents = [make_entitlement(rnd.choice(["ent", "b", "gone"]), quota=rnd.randrange(2, 30),
                             pinned_dc=rnd.choice([None, None, "dc1"])) for _ in range(rnd.randrange(2))]
    dropped = ["gone"] if rnd.random() < 0.1 and "gone" not in {e.name for e in ents} else []
    return dict(machines=changed + added, removed_machines=removed, tasks=new_tasks, removed_tasks=gone,
                entitlements=ents, removed_entitlements=dropped)


@pytest.mark.parametrize("seed", range(12))
def test_apply_in_place_gives_the_state_and_placements_of_a_fresh_build(seed):
    rnd = random.Random(seed)
    snap = Snapshot.build(grid(dcs=2, msbs=3, racks=3, per_rack=2, cpus=4.0),
                          [make_entitlement("ent", quota=20), make_entitlement("b")])
    placed: dict[tuple[str, int], PlacedTask] = {}
    for step in range(40):
        changes = random_step(rnd, snap, placed, step)
        same = snap.apply(**changes)
        assert same is snap, "in place: the caller's snapshot is the next one"
        for k in changes["removed_tasks"]:
            placed.pop(k)
        placed.update(((t.job, t.index), t) for t in changes["tasks"])
        fresh = Snapshot.build(snap.machines.values(), snap.entitlements.values(), placed.values(), snap.revision)
        assert index_state(snap) == index_state(fresh), f"step {step}"
        assert dict(snap._used) == dict(fresh._used)  # noqa: SLF001
        assert {j: dict(snap.tasks_of(j)) for j in ("ent/j0", "ent/j1", "b/j2")} == \
               {j: dict(fresh.tasks_of(j)) for j in ("ent/j0", "ent/j1", "b/j2")}
        assert dict(snap.entitlements) == dict(fresh.entitlements)
        for _ in range(2):
            request = job(f"ent/j{rnd.randrange(5)}", rnd.randrange(1, 12), cpus=rnd.choice([0.5, 1.0, 2.0]),
                          memory_mb=256, preferences=rnd.choice(PREFS))
            assert outcome(snap, request) == outcome(fresh, request), (step, request)
        if rnd.random() < 0.3:  # commit a placement as the scheduler would, then keep going
            p = outcome(snap, job("ent/j0", rnd.randrange(1, 8), preferences=rnd.choice(PREFS)))
            if not isinstance(p, tuple):
                snap.apply_placement(p)
                placed.update(((t.job, t.index), t) for t in snap.tasks_of("ent/j0").values())
        assert snap.revision >= step + 1


def test_with_changes_copies_and_leaves_the_original_as_it_was():
    snap = Snapshot.build(grid(dcs=1, msbs=2, per_rack=2), [make_entitlement("ent")])
    before = (index_state(snap), dict(snap.machines), snap.revision)
    m = snap.machines["d0-m0-r0-0"]
    nxt = snap.with_changes(machines=[replace(m, entitlement="ent", version=1)],
                            tasks=[PlacedTask("ent/a", 0, m.id, 1.0, 64)], removed_machines=["d0-m1-r0-1"])
    assert nxt is not snap and (index_state(snap), dict(snap.machines), snap.revision) == before
    assert nxt.held("ent") == 1 and nxt.free(m.id) == (3.0, 8192 - 64) and "d0-m1-r0-1" not in nxt.machines


def test_a_task_it_holds_already_coming_back_touches_no_machine(monkeypatch):
    """A scheduler applies its placement when it commits (apply_placement); the watch then brings
    the same tasks back (RegionState.snapshot): those leave every machine's bins as they are, and
    a task that did change (another machine) still moves."""
    snap = Snapshot.build(grid(dcs=1, msbs=2, racks=2, per_rack=3), [make_entitlement("ent")])
    placement = allocate(snap, job("ent/web", 4))
    snap.apply_placement(placement)
    before = index_state(snap)
    touched: list = []
    update = type(snap.index).update

    def recording(index, changes, free):  # the real update, its machines noted
        changes = list(changes)
        touched.extend(old.id for old, _ in changes)
        return update(index, changes, free)

    monkeypatch.setattr(type(snap.index), "update", recording)
    again = [PlacedTask("ent/web", i, placement.task_machines[i], placement.cpus, placement.memory_mb) for i in range(4)]
    snap.apply(tasks=again, revision=snap.revision + 1)
    assert touched == [] and index_state(snap) == before
    other = next(m for m in sorted(snap.machines) if m != again[0].machine_id)
    snap.apply(tasks=[replace(again[0], machine_id=other)], revision=snap.revision + 1)
    assert sorted(touched) == sorted({again[0].machine_id, other})
    fresh = Snapshot.build(snap.machines.values(), snap.entitlements.values(),
                           [replace(again[0], machine_id=other), *again[1:]], snap.revision)
    assert index_state(snap) == index_state(fresh)
