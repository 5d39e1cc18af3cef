"""Maintenance in the pure reconciler: moves before the deadline (acked by the TaskController, or
by the built-in policy), the forced stop at the deadline, the restart after it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from controlplane.frontend.schema import MaintenanceSpec, checked
from controlplane.store.records import EventRec, MachineRec, ApiError
from controlplane.opsplanner.maintenance import parse_maintenance as parse_checked
from controlplane.scheduler.reconcile import Gate, Maintenance, reconcile
from tests.controlplane.scheduler.test_reconcile import H, job, machine, new_states, running, task

NOTICE = Maintenance("maint-1", active=False, deadline=2_000_000_000.0, until=2_000_003_600.0)
ACTIVE = replace(NOTICE, active=True)


def region(mt: Maintenance | None, ts: dict) -> dict:
    """Task 0 on m1 (the machine in maintenance), the others on m2."""
    on = lambda mid: running(*(t for t in ts.values() if t.machine == mid))
    return {"m1": replace(machine("m1", reports=on("m1")), maintenance=mt), "m2": machine("m2", reports=on("m2"))}


def three() -> dict:
    return {0: task(0, machine="m1"), 1: task(1, machine="m2"), 2: task(2, machine="m2")}


def test_before_the_deadline_the_controller_is_asked_and_the_task_stays_without_its_ack():
    ts = three()
    plan = reconcile(job(3), ts, region(NOTICE, ts), Gate(approved=frozenset()))
    assert [(op.id, op.kind, op.cause) for op in plan.proposed] == [("move/0/m1", "move", "maintenance")]
    assert plan.changes == [] and plan.place == ()
    assert "waiting for the TaskController" in plan.held[0].reason


def test_an_acked_maintenance_move_places_the_task_elsewhere():
    ts = three()
    plan = reconcile(job(3), ts, region(NOTICE, ts), Gate(approved=frozenset({"move/0/m1"})))
    assert plan.place == (0,) and [op.id for op in plan.ops] == ["move/0/m1"] and plan.destructive == 1


def test_the_rate_limit_holds_an_acked_maintenance_move():
    ts = three()
    plan = reconcile(job(3), ts, region(NOTICE, ts), Gate(approved=frozenset({"move/0/m1"}), budget=0))
    assert plan.place == () and plan.rate_limited == 1


def test_at_the_deadline_a_kept_task_is_suspended_whatever_the_controller_said():
    ts = three()
    plan = reconcile(job(3), ts, region(ACTIVE, ts), Gate(approved=frozenset()))
    assert new_states(plan) == {0: "suspended"}
    (_, new), = plan.changes
    assert not new.discovery and new.machine == "m1" and "maintenance maint-1" in new.reason
    # suspended, it is still offered to the controller as a move; without the ack it stays
    sus = {**ts, 0: new}
    plan = reconcile(job(3), sus, region(ACTIVE, sus), Gate(approved=frozenset()))
    assert plan.changes == [] and [op.id for op in plan.proposed] == ["move/0/m1"]


def test_after_the_maintenance_a_suspended_task_starts_again_on_its_machine():
    ts = {**three(), 0: task(0, "suspended", machine="m1")}
    plan = reconcile(job(3), ts, region(None, {k: v for k, v in ts.items() if k}), Gate(approved=frozenset()))
    assert new_states(plan) == {0: "starting"}
    assert plan.changes[0][1].machine == "m1" and "maintenance over" in plan.changes[0][1].reason


def test_a_machine_that_stays_down_after_the_maintenance_loses_its_tasks():
    ts = {**three(), 0: task(0, "suspended", machine="m1")}
    views = {**region(None, ts), "m1": machine("m1", healthy=False)}
    assert new_states(reconcile(job(3), ts, views)) == {0: "lost"}


def test_a_machine_down_during_its_maintenance_keeps_its_tasks_suspended_not_lost():
    ts = {**three(), 0: task(0, "suspended", machine="m1")}
    views = {**region(ACTIVE, ts), "m1": replace(machine("m1", healthy=False), maintenance=ACTIVE)}
    plan = reconcile(job(3), ts, views, Gate(approved=frozenset()))
    assert plan.changes == [] and [op.cause for op in plan.proposed] == ["maintenance"]


def test_policy_move_without_a_controller_moves_before_the_deadline_within_max_unavailable():
    ts = {0: task(0, machine="m1"), 1: task(1, machine="m1"), 2: task(2, machine="m2")}
    views = region(NOTICE, ts)
    plan = reconcile(job(3, max_unavailable=1), ts, views)
    assert plan.place == (0,)
    assert [op.index for op in plan.held] == [1] and "1 of max 1 unavailable" in plan.held[0].reason


def test_policy_stop_without_a_controller_waits_for_the_deadline():
    ts = three()
    stop = replace(NOTICE, policy="stop")
    plan = reconcile(job(3), ts, region(stop, ts))
    assert plan.place == () and plan.changes == [] and "policy stop" in plan.waiting[0]
    plan = reconcile(job(3), ts, region(replace(stop, active=True), ts))
    assert new_states(plan) == {0: "suspended"}
    sus = {**ts, 0: plan.changes[0][1]}
    assert reconcile(job(3), sus, region(replace(stop, active=True), sus)).place == ()


def test_policy_move_moves_a_suspended_task_at_once():
    ts = {**three(), 0: task(0, "suspended", machine="m1")}
    assert reconcile(job(3), ts, region(ACTIVE, ts)).place == (0,)


def test_an_update_leaves_a_suspended_task_suspended():
    ts = {**three(), 0: task(0, "suspended", machine="m1")}
    j = replace(job(3), spec_version=2)
    plan = reconcile(j, ts, region(ACTIVE, ts), Gate(approved=frozenset()))
    changed = {new.index: new for _, new in plan.changes}
    assert changed[0].state == "suspended" and changed[0].spec_version == 2


# -- the operator's request ---------------------------------------------------------------------


def machines() -> dict:
    def m(mid, msb, rack):
        return MachineRec(mid, mid, {"region": "r", "dc": "dc1", "msb": msb, "rack": rack, "machine_type": "t"},
                          {"cpus": 1, "memory_mb": 1024})
    return {"a": m("a", "msb1", "r1"), "b": m("b", "msb1", "r2"), "c": m("c", "msb2", "r3")}


def parse_maintenance(body: dict, machines: dict, now: float) -> EventRec:
    """As the API does: the body's shape against its schema, then the region."""
    return parse_checked(checked(body, MaintenanceSpec), machines, now)


def test_a_maintenance_selects_machines_by_label_or_id():
    e = parse_maintenance({"msb": "msb1", "start": 2000.0, "duration": 60}, machines(), now=1000.0)
    assert e.machines == ("a", "b") and e.deadline == 2000.0 and e.scope == "msb=msb1" and e.kind == "maintenance"
    e = parse_maintenance({"machines": ["c"], "start": 2000.0, "deadline": 1500.0, "duration": 60, "policy": "stop"},
                          machines(), now=1000.0)
    assert e.machines == ("c",) and e.deadline == 1500.0 and e.policy == "stop"
    assert EventRec.from_json(e.to_json()) == e
    assert [e.phase(t) for t in (1400.0, 1500.0, 2059.0, 2060.0)] == ["scheduled", "in progress", "in progress", "over"]
    assert replace(e, end=1600.0).phase(1700.0) == "over"


@pytest.mark.parametrize("body, field, status", [
    ({"start": 2000.0, "duration": 60}, "machines", 422),  # 422: within the document, not possible as it is
    ({"machines": ["zz"], "start": 2000.0, "duration": 60}, "machines", 422),
    ({"rack": "r9", "start": 2000.0, "duration": 60}, "rack", 422),
    ({"msb": "msb1", "duration": 60}, "start", 400),
    ({"msb": "msb1", "start": 2000.0, "duration": 0}, "duration", 400),
    ({"msb": "msb1", "start": 2000.0, "duration": 60, "deadline": 2001.0}, "deadline", 422),
    ({"msb": "msb1", "start": 100.0, "duration": 60}, "start", 422),
    ({"msb": "msb1", "start": 2000.0, "duration": 60, "policy": "drain"}, "policy", 400),
    ({"msb": "msb1", "start": 2000.0, "duration": 60, "color": "red"}, "color", 400),
    ({"msb": "msb1", "start": float("inf"), "duration": 60}, "start", 400),
    ({"msb": "msb1", "start": 1.7e12, "duration": 60}, "start", 422),  # milliseconds by mistake
    ({"msb": "msb1", "start": 2000.0, "deadline": float("nan"), "duration": 60}, "deadline", 400),
])
def test_a_bad_maintenance_request_names_its_field(body, field, status):
    with pytest.raises(ApiError) as e:
        parse_maintenance(body, machines(), now=1000.0)
    assert e.value.field == field and e.value.status == status


def test_twinectl_times_share_one_now():
    from controlplane.cli import values

    values.NOW.clear()
    start, deadline = values.when("+1h"), values.when("+1h")
    assert start == deadline and values.duration("90s") == 90 and values.duration("2h") == 7200
    for bad in ("inf", "soon", "-5"):
        with pytest.raises(Exception):
            values.when(bad)
