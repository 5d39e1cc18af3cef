"""A region of 100,000 machines: placements stay correct (timing is the benchmark's business)."""

from __future__ import annotations

from collections import Counter

import pytest

from controlplane.allocator import Machine, NoPlacement, Snapshot, allocate, allocate_naive

from .builders import job, make_entitlement

TYPES = ("sky", "cooper", "milan")


@pytest.fixture(scope="module")
def region() -> Snapshot:
    """2 dcs x 10 msbs x 50 racks x 100 machines; a rack holds one type; 1 in 50 machines is
    unhealthy; the entitlement already holds 200 machines in dc0."""
    machines = []
    n = 0
    for d in range(2):
        for b in range(10):
            for r in range(50):
                for k in range(100):
                    owned = "ent" if d == 0 and r == 0 and k < 20 else None
                    machines.append(Machine(f"m{n:06d}", "reg", f"dc{d}", f"b{b}", f"r{r}", TYPES[r % 3], 8.0, 32768,
                                            n % 50 != 7, owned))
                    n += 1
    return Snapshot.build(machines, [make_entitlement("ent", quota=5000), make_entitlement("pin", pinned_dc="dc1")])


def test_a_36_task_job_spreads_over_all_msbs(region):
    p = allocate(region, job(count=36, cpus=2, memory_mb=4096))
    per_msb = Counter(region.machines[m].path("msb") for m in p.task_machines)
    assert len(per_msb) == 20 and set(per_msb.values()) == {1, 2}
    assert Counter(region.machines[m].dc for m in p.task_machines) == {"dc0": 18, "dc1": 18}
    for mid in p.task_machines:
        m = region.machines[mid]
        assert m.machine_type == "sky" and m.healthy
    # It stacked on the entitlement's own machines in dc0 and took free ones only in dc1.
    assert {region.machines[m].dc for m in p.machines_taken} == {"dc1"} and len(p.machines_taken) == 10


def test_consecutive_jobs_stack(region):
    snap = region.copy()  # the fixture stays as it was for the other tests
    for k in range(5):
        p = allocate(snap, job(f"ent/j{k}", count=36, cpus=2, memory_mb=4096))
        snap.apply_placement(p)
    # Later jobs stacked on the machines the first ones took: in each dc1 msb the entitlement
    # holds just enough 8-cpu machines for its 2-cpu tasks there (4 a machine).
    tasks_in, held_in = Counter(), Counter()
    for k in range(5):
        tasks_in.update(snap.machines[t.machine_id].msb for t in snap.tasks_of(f"ent/j{k}").values()
                        if snap.machines[t.machine_id].dc == "dc1")
    held_in.update(m.msb for m in snap.machines.values() if m.entitlement == "ent" and m.dc == "dc1")
    assert held_in == {msb: -(-n // 4) for msb, n in tasks_in.items()} and sum(tasks_in.values()) == 90


def test_pinned_entitlement_at_scale(region):
    p = allocate(region, job("pin/j", count=36))
    assert {region.machines[m].dc for m in p.task_machines} == {"dc1"}
    assert set(Counter(region.machines[m].msb for m in p.task_machines).values()) == {3, 4}


def test_agrees_with_the_full_scan(region):
    request = job("ent/x", count=3, cpus=7, memory_mb=1024)
    assert allocate(region, request) == allocate_naive(region, request)


def test_no_fit_counts_at_scale(region):
    with pytest.raises(NoPlacement) as e:
        allocate(region, job(cpus=16))
    assert str(e.value).startswith("no placement for ent/job task 0: 100,000 machines; type=sky left 34,000; "
                                   "healthy left 33,320; not cordoned left 33,320; entitlement=ent or free left 33,320; cpu>=16 left 0")
