"""Where tasks go: Figure 7, spread and pack, dc pins, consume-after-pick, health, existing tasks."""

from __future__ import annotations

import pytest

from controlplane.allocator import NoPlacement, PlacedTask, SoftPreference, allocate
from controlplane.allocator.naive import allocate_naive

from .builders import grid, job, make_entitlement, make_machine, snapshot, tasks_per

SPREAD_MSB = (SoftPreference("msb", "spread"),)
PACK_MSB = (SoftPreference("msb", "pack"),)


def test_figure_7_entitlement_grows_from_the_free_pool_and_stacks():
    # Paper Figure 7: an empty entitlement, four free machines in one place.
    snap = snapshot([make_machine(m, cpus=4) for m in ("M7", "M8", "M9", "M9b")], make_entitlement(quota=4))
    assert snap.held("ent") == 0

    d = allocate(snap, job("ent/D", 1, cpus=2))
    assert d.task_machines == ("M7",) and d.machines_taken == ("M7",)
    snap = snap.with_placement(d)
    assert snap.held("ent") == 1

    # E's first task stacks on M7 (room for 2 more cpus); its second does not fit there.
    e = allocate(snap, job("ent/E", 2, cpus=2))
    assert e.task_machines == ("M7", "M8") and e.machines_taken == ("M8",)
    assert [(c.machine_id, c.taken, c.cpus, c.free_cpus) for c in e.claims] == [("M7", False, 2, 2), ("M8", True, 2, 4)]
    snap = snap.with_placement(e)
    assert snap.held("ent") == 2
    assert sorted(m.id for m in snap.machines.values() if m.entitlement is None) == ["M9", "M9b"]


@pytest.mark.parametrize("count, prefs, want", [
    (6, SPREAD_MSB, {("reg", "dc0", "m0"): 2, ("reg", "dc0", "m1"): 2, ("reg", "dc0", "m2"): 2}),
    (7, SPREAD_MSB, {("reg", "dc0", "m0"): 3, ("reg", "dc0", "m1"): 2, ("reg", "dc0", "m2"): 2}),
    (6, None, {("reg", "dc0", "m0"): 2, ("reg", "dc0", "m1"): 2, ("reg", "dc0", "m2"): 2}),  # entitlement default
    (6, PACK_MSB, {("reg", "dc0", "m0"): 6}),
])
def test_tasks_spread_evenly_over_msbs_or_pack(count, prefs, want):
    snap = snapshot(grid(msbs=3, per_rack=4, cpus=2))
    p = allocate(snap, job(count=count, cpus=1, preferences=prefs))
    assert dict(tasks_per(snap, p, "msb")) == want


def test_spread_over_dcs_and_msbs_by_default():
    snap = snapshot(grid(dcs=2, msbs=2, per_rack=4))
    p = allocate(snap, job(count=8))
    assert set(tasks_per(snap, p, "dc").values()) == {4}
    assert set(tasks_per(snap, p, "msb").values()) == {2}


def test_spread_over_racks_within_msbs():
    snap = snapshot(grid(msbs=2, racks=3, per_rack=2))
    p = allocate(snap, job(count=6, preferences=(SoftPreference("msb", "spread"), SoftPreference("rack", "spread"))))
    assert set(tasks_per(snap, p, "rack").values()) == {1}


def test_pack_fills_a_bin_before_opening_another():
    snap = snapshot(grid(msbs=3, per_rack=2, cpus=2))
    p = allocate(snap, job(count=6, cpus=1, preferences=PACK_MSB))  # m0 holds 4 tasks, then m1
    assert dict(tasks_per(snap, p, "msb")) == {("reg", "dc0", "m0"): 4, ("reg", "dc0", "m1"): 2}
    assert len(p.machines_taken) == 3


def test_spread_stacks_within_a_bin_once_every_bin_has_a_task():
    # Spread picks the bin; inside it the entitlement's machine comes before a free one.
    snap = snapshot(grid(msbs=3, per_rack=2, cpus=4))
    p = allocate(snap, job(count=6, preferences=SPREAD_MSB))
    assert set(tasks_per(snap, p, "msb").values()) == {2}
    assert len(set(p.task_machines)) == 3 and len(p.machines_taken) == 3


@pytest.mark.parametrize("pin, request_dc", [("dc1", None), (None, "dc1"), ("dc1", "dc1")])
def test_dc_pinned_entitlement_stays_in_its_dc(pin, request_dc):
    snap = snapshot(grid(dcs=2, msbs=2, per_rack=3), make_entitlement(pinned_dc=pin))
    p = allocate(snap, job(count=9, dc=request_dc))
    assert {snap.machines[m].dc for m in p.task_machines} == {"dc1"}
    assert set(tasks_per(snap, p, "msb").values()) == {4, 5}


def test_pinned_entitlement_and_other_request_dc_fit_nowhere():
    snap = snapshot(grid(dcs=2), make_entitlement(pinned_dc="dc1"))
    with pytest.raises(NoPlacement) as e:
        allocate(snap, job(dc="dc0"))
    assert e.value.left("dc=dc0") == 6 and e.value.left("dc=dc1") == 0
    assert e.value.field == "entitlement.spread.pinned_dc"


@pytest.mark.parametrize("cpus, memory_mb, count, per_machine", [
    (2, 512, 4, [2, 2]),  # cpu bound: 4 cpus hold 2 tasks of 2
    (1, 4096, 4, [2, 2]),  # memory bound: 8192 MB hold 2 tasks of 4096
    (1, 512, 5, [4, 1]),  # stacks: best fit fills a machine first
])
def test_consume_after_pick(cpus, memory_mb, count, per_machine):
    snap = snapshot([make_machine("a"), make_machine("b"), make_machine("c", type="other")])
    p = allocate(snap, job(count=count, cpus=cpus, memory_mb=memory_mb, preferences=()))
    assert sorted(p.task_machines.count(m) for m in set(p.task_machines))[::-1] == per_machine
    for c in p.claims:
        assert c.cpus <= c.free_cpus and c.memory_mb <= c.free_memory_mb


def test_a_machine_with_room_for_two_gets_at_most_two():
    snap = snapshot([make_machine("a", cpus=4)])
    with pytest.raises(NoPlacement) as e:
        allocate(snap, job(count=3, cpus=2))
    assert e.value.task == 2 and e.value.left("cpu>=2") == 0


def test_unhealthy_machines_are_never_chosen():
    machines = [make_machine(f"sick{i}", healthy=False, cpus=64) for i in range(5)] + [make_machine("well", msb="m9")]
    snap = snapshot(machines)
    p = allocate(snap, job(count=4, preferences=SPREAD_MSB))
    assert set(p.task_machines) == {"well"}


def test_tasks_of_other_jobs_hold_their_resources():
    snap = snapshot([make_machine("a", entitlement="ent"), make_machine("b")],
                    tasks=[PlacedTask("ent/other", 0, "a", 3, 512)])
    p = allocate(snap, job(cpus=2))
    assert p.task_machines == ("b",) and p.machines_taken == ("b",)


def test_own_machines_before_the_free_pool_when_bins_tie():
    snap = snapshot([make_machine("free1", cpus=2), make_machine("owned", cpus=16, entitlement="ent")])
    p = allocate(snap, job(count=3))
    assert p.task_machines == ("owned",) * 3 and p.machines_taken == ()


def test_a_replacement_keeps_healthy_tasks_and_spreads_against_them():
    machines = grid(msbs=3, per_rack=2, entitlement="ent")
    placed = [PlacedTask("ent/job", i, mid, 1.0, 512) for i, mid in enumerate(["d0-m0-r0-0", "d0-m1-r0-0", "d0-m2-r0-0"])]
    snap = snapshot(machines, tasks=placed)
    assert allocate(snap, job(count=3)).new_tasks == ()  # nothing to do

    sick = snap.with_changes(machines=[make_machine("d0-m1-r0-0", dc="dc0", msb="m1", rack="r0", entitlement="ent", healthy=False, version=1)])
    p = allocate(sick, job(count=3))
    assert p.new_tasks == (1,) and p.task_machines == ("d0-m0-r0-0", "d0-m1-r0-1", "d0-m2-r0-0")

    grown = allocate(snap, job(count=4))  # the fourth task goes with the others, stacked
    assert grown.new_tasks == (3,) and grown.task_machines[:3] == tuple(t.machine_id for t in placed)


def test_a_cordoned_machine_keeps_its_tasks_takes_no_new_ones_and_moves_one_on_request():
    from dataclasses import replace as dc_replace

    machines = [make_machine("a", cpus=4, entitlement="ent"), make_machine("b", msb="m2", cpus=4, entitlement="ent")]
    placed = [PlacedTask("ent/job", 0, "a", 1.0, 512), PlacedTask("ent/job", 1, "a", 1.0, 512)]
    snap = snapshot([dc_replace(machines[0], cordoned=True), machines[1]], tasks=placed)
    grown = allocate(snap, job("ent/job", 3))
    assert grown.task_machines == ("a", "a", "b") and grown.new_tasks == (2,), "kept where they are; new one elsewhere"
    moved = allocate(snap, job("ent/job", 2, replace=(1,)))
    assert moved.task_machines == ("a", "b") and moved.new_tasks == (1,)
    with pytest.raises(NoPlacement, match="healthy left 1; not cordoned left 0"):
        allocate(snapshot([dc_replace(machines[0], cordoned=True)]), job("ent/other", 1))


def test_replacements_after_a_failure_keep_the_job_spread_over_msbs():
    """Issue #12: six tasks over two dcs of two MSBs (a machine each), spread over dc and msb. The
    machine holding two fails: its two tasks are replaced. A pick whose dc and msb scores summed
    alike went by best fit to the fuller MSB: 3 of the 6 on one machine while another held 1. Now
    the tie goes to the MSB with fewer of the job's tasks: none holds more than 2."""
    machines = [make_machine(f"x{i}", dc=f"dc{i // 2}", msb=f"msb{i}", entitlement="ent") for i in range(4)]
    where = {0: "x0", 1: "x1", 2: "x2", 3: "x3", 4: "x0", 5: "x2"}  # x2 holds 2, and fails
    placed = [PlacedTask("ent/job", i, mid, 1.0, 512) for i, mid in where.items()]
    machines[2] = make_machine("x2", dc="dc1", msb="msb2", entitlement="ent", healthy=False)
    snap = snapshot(machines, tasks=placed)
    p = allocate(snap, job(count=6))
    assert sorted(p.new_tasks) == [2, 5]
    per_msb = tasks_per(snap, p, "msb")
    assert max(per_msb.values()) == 2, per_msb
    assert allocate_naive(snap, job(count=6)).task_machines == p.task_machines


@pytest.mark.parametrize("weight", [-1.0, float("inf"), float("nan")])
def test_a_preference_weight_must_be_a_finite_number_of_zero_or_more(weight):
    from controlplane.allocator import InvalidRequest

    with pytest.raises(InvalidRequest) as e:
        SoftPreference("msb", "spread", weight)
    assert e.value.field == "preferences.weight" and "finite" in str(e.value)
