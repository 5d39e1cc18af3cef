"""The job-level allocation cache: hits on a repeated request, misses when it changed or when the
machines it used changed."""

from __future__ import annotations

from dataclasses import replace

import pytest

from controlplane.allocator import AllocationCache, PlacedTask, allocate

from .builders import grid, job, make_entitlement, snapshot


def stats(cache):
    s = cache.stats()
    return s.hits, s.misses, dict(s.misses_by_reason)


def test_repeated_identical_request_hits():
    snap, cache = snapshot(grid(msbs=3, per_rack=2)), AllocationCache()
    first = allocate(snap, job(count=4), cache=cache)
    again = allocate(snap, job(count=4), cache=cache)
    assert not first.cached and again.cached and again == first
    assert stats(cache) == (1, 1, {"new job": 1}) and cache.stats().hit_ratio == 0.5


def test_hit_after_commit_keeps_every_task_where_it_is():
    snap, cache = snapshot(grid(msbs=3, per_rack=2)), AllocationCache()
    first = allocate(snap, job(count=4), cache=cache)
    committed = snap.with_placement(first)  # taken machines changed owner and version
    again = allocate(committed, job(count=4), cache=cache)
    assert again.cached and again.task_machines == first.task_machines
    assert again.new_tasks == () and again.claims == () and again.machines_taken == ()


def test_version_bump_without_property_change_still_hits():
    snap, cache = snapshot(grid()), AllocationCache()
    first = allocate(snap, job(count=2), cache=cache)
    m = snap.machines[first.task_machines[0]]
    bumped = snap.with_changes(machines=[replace(m, version=m.version + 7)])
    assert allocate(bumped, job(count=2), cache=cache).cached


@pytest.mark.parametrize("change", [dict(rack="r9"), dict(healthy=False), dict(cpus=64.0), dict(msb="m7")])
def test_misses_when_a_used_machine_changes(change):
    snap, cache = snapshot(grid(msbs=3, per_rack=2)), AllocationCache()
    first = allocate(snap, job(count=3), cache=cache)
    m = snap.machines[first.task_machines[1]]
    changed = snap.with_changes(machines=[replace(m, version=m.version + 1, **change)])
    assert not allocate(changed, job(count=3), cache=cache).cached
    assert stats(cache) == (0, 2, {"new job": 1, "machine changed": 1})


def test_unused_machine_change_does_not_invalidate():
    snap, cache = snapshot(grid(msbs=3, per_rack=2)), AllocationCache()
    first = allocate(snap, job(count=1), cache=cache)
    other = next(m for m in snap.machines.values() if m.id not in first.task_machines)
    changed = snap.with_changes(machines=[replace(other, version=5, healthy=False)])
    assert allocate(changed, job(count=1), cache=cache).cached


def test_misses_when_the_request_changes():
    snap, cache = snapshot(grid(msbs=3, per_rack=2)), AllocationCache()
    allocate(snap, job(count=3), cache=cache)
    for changed in (job(count=4), job(count=3, cpus=2), job(count=3, memory_mb=1024), job(count=3, dc="dc0")):
        assert not allocate(snap, changed, cache=cache).cached
    assert stats(cache) == (0, 5, {"new job": 1, "request changed": 4})


def test_a_hit_rechecks_room_left_by_other_jobs():
    snap, cache = snapshot(grid(msbs=1, per_rack=2, cpus=4)), AllocationCache()
    first = allocate(snap, job(count=2, cpus=2), cache=cache)
    a, = set(first.task_machines)  # stacked: both tasks on one machine
    crowded = snap.with_changes(tasks=[PlacedTask("ent/other", 0, a, 1, 64)])  # 3 cpus left there
    p = allocate(crowded, job(count=2, cpus=2), cache=cache)
    assert not p.cached and p.task_machines[0] == a and p.task_machines[1] != a
    assert stats(cache)[2]["no room"] == 1


def test_evict_forgets_a_job():
    snap, cache = snapshot(grid()), AllocationCache()
    allocate(snap, job(), cache=cache)
    cache.evict("ent/job")
    assert not allocate(snap, job(), cache=cache).cached and cache.stats().entries == 1


def test_bounded_size_drops_the_least_recently_used():
    snap, cache = snapshot(grid()), AllocationCache(max_entries=2)
    for name in ("ent/a", "ent/b", "ent/a", "ent/c"):
        allocate(snap, job(name), cache=cache)
    assert allocate(snap, job("ent/a"), cache=cache).cached
    assert not allocate(snap, job("ent/b"), cache=cache).cached


def test_misses_when_a_machine_it_would_take_went_to_another_entitlement():
    snap, cache = snapshot(grid(msbs=2, per_rack=1), make_entitlement("ent"), make_entitlement("other")), AllocationCache()
    first = allocate(snap, job(count=2), cache=cache)
    m = snap.machines[first.machines_taken[0]]
    gone = snap.with_changes(machines=[replace(m, entitlement="other", version=m.version + 1)])
    p = allocate(gone, job(count=2), cache=cache)
    assert not p.cached and m.id not in p.task_machines
    assert stats(cache)[2]["machine changed owner"] == 1


def test_misses_when_the_quota_no_longer_allows_the_machines_it_takes():
    snap, cache = snapshot(grid(msbs=3, per_rack=1), make_entitlement(quota=2)), AllocationCache()
    first = allocate(snap, job(count=2), cache=cache)
    other = next(m for m in snap.machines.values() if m.id not in first.task_machines)
    fuller = snap.with_changes(machines=[replace(other, entitlement="ent", version=1)])  # now holds 1 of 2
    assert not allocate(fuller, job(count=2), cache=cache).cached
    assert stats(cache)[2]["quota"] == 1


def test_misses_when_the_entitlement_changes():
    snap, cache = snapshot(grid()), AllocationCache()
    allocate(snap, job(), cache=cache)
    assert not allocate(snap.with_changes(entitlements=[make_entitlement(quota=7)]), job(), cache=cache).cached
    assert stats(cache)[2]["entitlement changed"] == 1
