"""Requests that cannot be placed: each error names the field and says why."""

from __future__ import annotations

import pytest

from controlplane.allocator import (InvalidRequest, JobRequest, NoPlacement, QuotaExceeded, SoftPreference, allocate,
                                   ReserveKept, allocate_naive)

from .builders import grid, job, make_entitlement, make_machine, snapshot
from .test_reference import outcome


def fleet():
    """10 machines: 8 sky (1 of them unhealthy, 1 another entitlement's), 2 of another type."""
    return ([make_machine(f"s{i}", cpus=4) for i in range(6)]
            + [make_machine("sick", healthy=False), make_machine("theirs", entitlement="other")]
            + [make_machine(f"o{i}", type="other", cpus=64) for i in range(2)])


@pytest.mark.parametrize("request_, message, field", [
    (job(cpus=8), "no placement for ent/job task 0: 10 machines; type=sky left 8; healthy left 7; not cordoned left 7; "
                  "entitlement=ent or free left 6; cpu>=8 left 0; memory>=512MB left 0", "cpus"),
    (job(memory_mb=9000), "no placement for ent/job task 0: 10 machines; type=sky left 8; healthy left 7; not cordoned left 7; "
                          "entitlement=ent or free left 6; cpu>=1 left 6; memory>=9000MB left 0", "memory_mb"),
    (job(dc="dc9"), "no placement for ent/job task 0: 10 machines; type=sky left 8; healthy left 7; not cordoned left 7; "
                    "dc=dc9 left 0; entitlement=ent or free left 0; cpu>=1 left 0; memory>=512MB left 0", "dc"),
    # The first 6 tasks fill the six machines' cpus; task 6 finds no room, the count says so.
    (job(count=7, cpus=4), "no placement for ent/job task 6: 10 machines; type=sky left 8; healthy left 7; not cordoned left 7; "
                           "entitlement=ent or free left 6; cpu>=4 left 0; memory>=512MB left 0", "cpus"),
])
def test_no_fit_error_lists_what_each_filter_left(request_, message, field):
    with pytest.raises(NoPlacement) as e:
        allocate(snapshot(fleet()), request_)
    assert str(e.value) == message and e.value.field == field


def test_no_fit_counts_at_scale_use_thousands_separators():
    snap = snapshot(grid(msbs=10, racks=10, per_rack=20, cpus=1))  # 2,000 machines
    with pytest.raises(NoPlacement, match=r"2,000 machines; type=sky left 2,000; healthy left 2,000; not cordoned left 2,000; .* cpu>=2 left 0"):
        allocate(snap, job(cpus=2))


def test_all_unhealthy_fits_nowhere():
    snap = snapshot([make_machine(f"m{i}", healthy=False) for i in range(3)])
    with pytest.raises(NoPlacement) as e:
        allocate(snap, job())
    assert e.value.left("healthy") == 0 and e.value.field == "healthy"


def test_quota_exceeded_when_the_entitlement_may_not_take_another_machine():
    snap = snapshot([make_machine(f"m{i}", cpus=2) for i in range(4)], make_entitlement(quota=2))
    with pytest.raises(QuotaExceeded) as e:
        allocate(snap, job(count=3, cpus=2))
    assert e.value.field == "count" and (e.value.task, e.value.held, e.value.quota) == (2, 2, 2)
    assert "entitlement ent holds 2 of its quota of 2 machines" in str(e.value)


def test_a_full_quota_still_stacks_on_own_machines_even_against_the_spread():
    machines = [make_machine("own", msb="m0", cpus=8, entitlement="ent"), make_machine("free", msb="m1")]
    snap = snapshot(machines, make_entitlement(quota=1))
    p = allocate(snap, job(count=3, preferences=(SoftPreference("msb", "spread"),)))
    assert p.task_machines == ("own",) * 3 and p.machines_taken == ()


def test_quota_reached_and_no_free_machine_fits_is_no_placement():
    snap = snapshot([make_machine("own", cpus=1, entitlement="ent"), make_machine("free", cpus=1)],
                    make_entitlement(quota=1))
    with pytest.raises(NoPlacement, match=r"entitlement=ent \(quota reached\) left 1; cpu>=2 left 0"):
        allocate(snap, job(cpus=2))


@pytest.mark.parametrize("build, field", [
    (lambda: JobRequest("nohandle", 1, 1, 1), "job"),
    (lambda: JobRequest("a/b/c", 1, 1, 1), "job"),
    (lambda: JobRequest("ent/j", -1, 1, 1), "count"),
    (lambda: JobRequest("ent/j", 1, 0, 1), "cpus"),
    (lambda: JobRequest("ent/j", 1, 1, -5), "memory_mb"),
    (lambda: SoftPreference("row", "spread"), "preferences.property"),
    (lambda: SoftPreference("msb", "scatter"), "preferences.strategy"),
    (lambda: allocate(snapshot([]), job("nope/j")), "job"),
    (lambda: allocate(snapshot([]), job(machine_type="other")), "machine_type"),
])
def test_invalid_requests_name_the_field(build, field):
    with pytest.raises(InvalidRequest) as e:
        build()
    assert e.value.field == field


def test_an_entitlement_with_a_reserve_leaves_that_many_free_machines_in_each_dc_and_says_so():
    # 3 free machines in dc0, 4 in dc1; a reserve of 2 leaves 2 in each: 1 + 2 machines to take
    machines = [make_machine(f"a{i}", dc="dc0", msb=f"m{i}", cpus=1) for i in range(3)] + \
               [make_machine(f"b{i}", dc="dc1", msb=f"m{i}", cpus=1) for i in range(4)]
    snap = snapshot(machines, make_entitlement("batch", reserve=2), make_entitlement("web"))
    got = allocate(snap, job("batch/j", count=3))
    assert sorted(snap.machines[m].dc for m in got.machines_taken) == ["dc0", "dc1", "dc1"]
    with pytest.raises(ReserveKept) as e:
        allocate(snap, job("batch/j", count=4))
    assert e.value.field == "reserve" and str(e.value).startswith(
        "no placement for batch/j task 3: the free machines that would fit are the region's reserve (2 free machines "
        "per machine type and dc")
    assert outcome(allocate_naive, snap, job("batch/j", count=4)) == outcome(allocate, snap, job("batch/j", count=4))
    with pytest.raises(NoPlacement, match="free beyond the reserve of 2 per dc left 7; cpu>=2 left 0"):
        allocate(snap, job("batch/j", cpus=2))  # too big for any machine: the reserve is not the reason
    # a guaranteed entitlement (no reserve) takes the reserve itself
    assert len(allocate(snap, job("web/j", count=7)).machines_taken) == 7
    assert allocate_naive(snap, job("web/j", count=7)) == allocate(snap, job("web/j", count=7))
