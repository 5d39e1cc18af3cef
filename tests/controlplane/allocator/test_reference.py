"""The indexed allocator agrees with the full-scan reference on random regions and requests:
same placement, or the same error with the same message."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from controlplane.allocator import AllocationError, PlacedTask, SoftPreference, Snapshot, allocate, allocate_naive

from .builders import job, make_entitlement, make_machine

PREFS = [None, (), (SoftPreference("msb", "spread"),), (SoftPreference("msb", "pack"),),
         (SoftPreference("dc", "spread", 2.0), SoftPreference("rack", "pack", 0.5)),
         (SoftPreference("rack", "spread"), SoftPreference("msb", "pack", 0.3)),
         (SoftPreference("region", "spread"), SoftPreference("dc", "pack")),
         (SoftPreference("msb", "spread"), SoftPreference("rack", "spread", 0.5)),
         (SoftPreference("dc", "spread"), SoftPreference("msb", "pack"), SoftPreference("rack", "spread"))]


def random_region(rnd: random.Random, dcs: int = 2, msbs: int = 3, racks: int = 3, machines_up_to: int = 60) -> Snapshot:
    machines = []
    for n in range(rnd.randrange(1, machines_up_to)):
        machines.append(make_machine(
            f"m{n:03d}", dc=f"dc{rnd.randrange(dcs)}", msb=f"b{rnd.randrange(msbs)}", rack=f"r{rnd.randrange(racks)}",
            type=rnd.choice(["sky", "sky", "sky", "old"]), cpus=rnd.choice([2, 4, 4.5, 8]),
            memory_mb=rnd.choice([2048, 8192]), healthy=rnd.random() > 0.1,
            entitlement=rnd.choice([None, None, "ent", "other"])))
    tasks = [PlacedTask(f"{rnd.choice(['ent', 'other'])}/t{k}", k, rnd.choice(machines).id, rnd.choice([0.5, 1, 1.5]), 256)
             for k in range(rnd.randrange(0, 30))]
    ents = [make_entitlement("ent", quota=rnd.randrange(0, 40), pinned_dc=rnd.choice([None, None, "dc1"]),
                             reserve=rnd.choice([0, 0, 1, 3])),  # an opportunistic entitlement leaves a reserve
            make_entitlement("other")]
    return Snapshot.build(machines, ents, tasks)


def outcome(fn, snap, request):
    try:
        return fn(snap, request)
    except AllocationError as e:
        return type(e).__name__, str(e), e.field


@pytest.mark.parametrize("seed", range(150))
def test_indexed_equals_full_scan(seed):
    check_against_full_scan(random.Random(seed), random_region)


@pytest.mark.parametrize("seed", range(40))
def test_indexed_equals_full_scan_over_many_msbs_and_racks(seed):
    # More msbs than tasks: quiet msbs share a class, an msb that gets a task leaves it
    check_against_full_scan(random.Random(1000 + seed),
                            lambda rnd: random_region(rnd, dcs=3, msbs=12, racks=5, machines_up_to=200))


def check_against_full_scan(rnd: random.Random, region) -> None:
    snap = region(rnd)
    for _ in range(3):
        request = job(rnd.choice(["ent/a", "ent/t1", "ent/t2"]), rnd.randrange(0, 25), cpus=rnd.choice([0.5, 1, 1.5, 2]),
                      memory_mb=rnd.choice([256, 1024, 4096]), preferences=rnd.choice(PREFS),
                      dc=rnd.choice([None, None, None, "dc0", "dc1"]))
        got = outcome(allocate, snap, request)
        assert got == outcome(allocate_naive, snap, request), request
        if not isinstance(got, tuple):
            snap = snap.with_placement(got)  # later requests see this one committed


@pytest.mark.parametrize("seed", range(40))
def test_indexed_equals_full_scan_on_one_snapshot_moved_forward_in_place(seed):
    """As RegionState does: each placement applied to the same snapshot in place (its index
    updated bin by bin, not rebuilt), and machines turning unhealthy and back, which empties bins
    and fills them again: every later allocation still agrees with the full scan."""
    rnd = random.Random(5000 + seed)
    snap = random_region(rnd, dcs=2, msbs=6, racks=4, machines_up_to=120)
    shapes = [(1, 256), (0.5, 1024), (2, 4096)]
    for n in range(12):
        cpus, mem = rnd.choice(shapes)
        request = job(f"ent/j{n}", rnd.randrange(1, 12), cpus=cpus, memory_mb=mem, preferences=rnd.choice(PREFS))
        got = outcome(allocate, snap, request)
        assert got == outcome(allocate_naive, snap, request), request
        if not isinstance(got, tuple):
            snap.apply_placement(got)
        if snap.machines and rnd.random() < 0.3:
            m = rnd.choice(list(snap.machines.values()))
            snap.apply(machines=[replace(m, healthy=not m.healthy, version=m.version + 1)])


def twelve_msbs(rnd: random.Random) -> Snapshot:
    return random_region(rnd, dcs=3, msbs=12, racks=5, machines_up_to=200)


def thirty_msbs(rnd: random.Random) -> Snapshot:
    return random_region(rnd, dcs=2, msbs=30, racks=8, machines_up_to=300)


@pytest.mark.parametrize("seed, region", [(10**6 + 1576, twelve_msbs), *((2 * 10**6 + s, thirty_msbs) for s in range(40))])
def test_indexed_equals_full_scan_where_occupied_bins_may_be_left_unscored(seed, region):
    """Regions with more msbs than a job's tasks, where spread-only requests leave an occupied bin
    unscored while a quiet candidate of its class beats it (Candidates.dominated); its count still
    bounds the normalisation at the bins' level. Seed 10**6 + 1576 is the case that showed it
    (left out of the span, it turned the pick): it fails without Scorer.best's `highest`."""
    check_against_full_scan(random.Random(seed), region)
