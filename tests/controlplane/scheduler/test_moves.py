"""The ReBalancer's moves in the pure reconciler (controlplane/scheduler/moves.py): a request
starts a `move` operation the TaskController gates; make-before-break (the task keeps running
where it was while its copy starts); the switch over when the copy runs; a move given up when its
copy fails, is late, or its machine fails; requests that cannot start are dropped with why."""

from __future__ import annotations

from dataclasses import replace

from controlplane.scheduler.ops import Reprofile
from controlplane.scheduler.reconcile import Gate, MachineStatus, reconcile
from controlplane.store.records import Moving
from tests.controlplane.scheduler.test_reconcile import H, job, running, task

REQ = {"source": "m1", "target": "m2", "goal": "compaction", "why": "compaction: frees m1"}


def machine(mid: str, reports=None, healthy: bool = True, ready: bool = True) -> MachineStatus:
    return MachineStatus(mid, healthy, "" if healthy else "no heartbeat", ready, "web", "10.0.0.1",
                         reports=reports if reports is not None else {})


def test_a_request_becomes_a_move_the_controller_gates_then_a_copy_while_the_task_runs():
    t = task(0)
    ms = {"m1": machine("m1", running(t)), "m2": machine("m2")}
    # a job with a TaskController that has not acked: proposed, held, nothing changes
    plan = reconcile(job(1), {0: t}, ms, Gate(approved=frozenset()), {0: REQ}, now=100.0)
    assert [op.id for op in plan.proposed] == ["move/0/rebalance/m2"] and plan.changes == [] and not plan.begun
    assert plan.proposed[0].cause == "rebalance" and plan.proposed[0].kind == "move"
    # acked: the task keeps running on m1, in discovery, with a copy starting on m2
    plan = reconcile(job(1), {0: t}, ms, Gate(approved=frozenset({"move/0/rebalance/m2"})), {0: REQ}, now=100.0)
    (old, new), = plan.changes
    assert new.state == "running" and new.machine == "m1" and new.discovery
    assert new.moving == Moving("m2", "compaction", "compaction: frees m1", 100.0) and plan.begun == [0]
    assert new.holds() == ("m1", "m2") and plan.destructive == 1, "a move spends a rate-limit token"
    # rate limited: no token, no move
    plan = reconcile(job(1), {0: t}, ms, Gate(budget=0), {0: REQ}, now=100.0)
    assert plan.changes == [] and plan.rate_limited == 1


def test_the_task_switches_over_when_its_copy_runs_and_never_goes_down():
    t = task(0, moving=Moving("m2", "compaction", "frees m1", 100.0))
    ms = {"m1": machine("m1", running(t)), "m2": machine("m2", {})}
    plan = reconcile(job(1), {0: t}, ms, now=110.0)
    assert plan.changes == [] and plan.waiting == ["#0: moving to m2 (make-before-break): its copy is starting"]
    ms["m2"] = machine("m2", running(t))
    plan = reconcile(job(1), {0: t}, ms, now=111.0)
    (old, new), = plan.changes
    assert (new.machine, new.state, new.discovery, new.moving) == ("m2", "running", True, None)
    assert plan.ended == [(0, "m1", t.moving, "done")] and new.holds() == ("m2",)


def test_a_move_is_given_up_when_its_copy_fails_is_late_or_its_machine_fails():
    t = task(0, moving=Moving("m2", "compaction", "frees m1", 100.0))
    failed = {(H, 0): {"job": H, "index": 0, "spec_version": 1, "state": "exited", "exit_code": 1}}
    for ms, now, why in (({"m2": machine("m2", failed)}, 110.0, "its copy on m2 failed: exit code 1"),
                         ({"m2": machine("m2", {})}, 500.0, "its copy on m2 did not run within 300 s"),
                         ({"m2": machine("m2", healthy=False)}, 110.0, "m2 is unhealthy")):
        plan = reconcile(job(1), {0: t}, {"m1": machine("m1", running(t)), **ms}, now=now)
        (old, new), = plan.changes
        assert (new.machine, new.state, new.moving) == ("m1", "running", None), why
        assert plan.ended == [(0, "m1", t.moving, f"given up: {why}")]


def test_any_other_change_of_the_task_gives_its_move_up():
    t = task(0, moving=Moving("m2", "compaction", "frees m1", 100.0))
    assert t.moved(state="lost", reason="machine m1 is gone").moving is None
    assert t.moved(spec_version=2).moving is None
    assert t.moved(reason="still running").moving is not None
    # the job shrinks: the task stops, and its copy with it
    plan = reconcile(job(0), {0: t}, {"m1": machine("m1", running(t)), "m2": machine("m2", running(t))}, now=110.0)
    (old, new), = plan.changes
    assert new.state == "stopping" and new.moving is None


def test_requests_that_cannot_start_are_dropped_with_why():
    t = task(0)
    cases = [({0: {**REQ, "source": "m9"}}, {"m2": machine("m2")}, "no longer running on m9"),
             ({0: REQ}, {"m2": machine("m2", healthy=False)}, "m2 is not healthy"),
             ({0: REQ}, {"m2": machine("m2", ready=False)}, "does not have its entitlement's profile ready"),
             ({0: REQ}, {"m2": replace(machine("m2"), reprofile=Reprofile("r1", "draining", "a -> b"))},
              "m2 is draining in a profile rollout"),
             ({0: REQ}, {}, "m2 is not healthy"),
             ({1: REQ}, {"m2": machine("m2")}, "the task is gone")]
    for requests, ms, why in cases:
        plan = reconcile(job(1), {0: t}, {"m1": machine("m1", running(t)), **ms}, requests=requests, now=1.0)
        assert plan.changes == [] and len(plan.dropped) == 1 and why in next(iter(plan.dropped.values())), \
            (why, plan.dropped)
        assert not plan.empty(), "a dropped request is written (its record changes)"


def test_a_change_to_what_the_task_is_already_is_the_task_itself_unless_it_gives_a_move_up():
    t = task(0)
    assert t.moved(state=t.state, reason=t.reason, discovery=t.discovery) is t
    assert t.moved(reason="other") is not t and t.moved(reason="other").reason == "other"
    # a moving copy is given up by a task no longer running, even when nothing else changes
    off = replace(task(0, moving=Moving("m2", "compaction", "frees m1", 100.0)), state="starting")
    assert off.moved(state="starting").moving is None
    on = task(0, moving=Moving("m2", "compaction", "frees m1", 100.0))
    assert on.moved(state=on.state) is on
