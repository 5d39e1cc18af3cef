"""Rate limits on destructive operations: token buckets, their settings, the limiter over job, shard
and region, and how the reconciler's Gate holds operations back (rate limit, TaskController)."""

from __future__ import annotations

import re

import pytest

from controlplane.store.records import JobRec, TaskRec
from controlplane.scheduler.ratelimit import Limiter, Limits, TokenBucket
from controlplane.scheduler.reconcile import Gate, MachineStatus, reconcile

SPEC = {"image": "twine/busybox:1", "command": [], "env": {}, "cpus": 0.5, "memory_mb": 64, "pids": 256,
        "network_mode": "bridge"}
H = "ent/web"


def job(count: int = 3, **kw) -> JobRec:
    return JobRec("ent", "web", count, SPEC, **kw)


def task(i: int, state: str = "running", machine: str | None = "m1", v: int = 1) -> TaskRec:
    return TaskRec(H, i, v, SPEC, machine, state, discovery=state == "running")


def machine(reports=None) -> MachineStatus:
    return MachineStatus("m1", True, "", True, "web", "10.0.0.1", reports=reports)


def running(*tasks: TaskRec) -> dict:
    return {(t.job, t.index): {"job": t.job, "index": t.index, "spec_version": t.spec_version, "state": "running"}
            for t in tasks}


def new_states(plan) -> dict[int, str | None]:
    return {(old or new).index: (new.state if new else None) for old, new in plan.changes}


# -- TokenBucket -----------------------------------------------------------------------------


def test_bucket_starts_full_and_refills_at_its_rate_up_to_the_burst():
    b = TokenBucket(rate=2.0, burst=5.0, at=100.0)
    assert b.available(now=100.0) == 5.0
    b.take(5, now=100.0)
    assert b.available(now=100.0) == 0.0
    assert b.available(now=101.0) == 2.0
    assert b.available(now=101.5) == 3.0
    assert b.available(now=200.0) == 5.0  # never more than the burst


def test_bucket_take_refills_first_and_may_overdraw():
    b = TokenBucket(rate=1.0, burst=3.0, at=0.0)
    b.take(3, now=0.0)
    b.take(1, now=2.0)  # two refilled, one taken
    assert b.available(now=2.0) == 1.0
    b.take(4, now=2.0)
    assert b.available(now=2.0) == -3.0  # a debt, paid back by the refill
    assert b.available(now=5.0) == 0.0


def test_bucket_with_explicit_tokens_and_rate_zero_never_refills():
    b = TokenBucket(rate=0.0, burst=10.0, tokens=2.0, at=0.0)
    assert b.available(now=1e6) == 2.0


# -- Limits ----------------------------------------------------------------------------------


def test_limits_parse_good_strings():
    assert Limits.parse("job=1:10,shard=10:100,region=20:200") == Limits((1.0, 10.0), (10.0, 100.0), (20.0, 200.0))
    assert Limits.parse("") == Limits()
    assert Limits.parse("job=0.5:3") == Limits(job=(0.5, 3.0))
    assert Limits.parse(" region=5 , ") == Limits(region=(5.0, 5.0))  # the burst defaults to the rate
    assert Limits.parse("job=0:1") == Limits(job=(0.0, 1.0))


@pytest.mark.parametrize("text, part, why", [
    ("zone=1:10", "zone=1:10", "scope must be job, shard or region"),
    ("job=1:10,jobs=1:10", "jobs=1:10", "scope must be"),
    ("job=fast:10", "job=fast:10", "want SCOPE=RATE:BURST"),
    ("shard=1:many", "shard=1:many", "want SCOPE=RATE:BURST"),
    ("job", "job", "want SCOPE=RATE:BURST"),
    ("job=1:2:3", "job=1:2:3", "want SCOPE=RATE:BURST"),
    ("region=-1:10", "region=-1:10", "rate must be >= 0 and burst >= 1"),
    ("job=1:0.5", "job=1:0.5", "burst >= 1"),
    ("job=0.5", "job=0.5", "burst >= 1"),
])
def test_limits_parse_refuses_naming_the_part(text, part, why):
    with pytest.raises(ValueError, match=re.escape(repr(part))) as e:
        Limits.parse(text)
    assert why in str(e.value)


# -- Limiter ---------------------------------------------------------------------------------


def test_limiter_available_is_the_least_of_job_shard_and_region():
    # rate 0: no refill, so the real clock does not matter
    assert Limiter(Limits(job=(0, 3), shard=(0, 5), region=(0, 7))).available(H) == 3
    assert Limiter(Limits(job=(0, 9), shard=(0, 4), region=(0, 7))).available(H) == 4
    assert Limiter(Limits(job=(0, 9), shard=(0, 8), region=(0, 2))).available(H) == 2


def test_limiter_take_spends_all_three():
    lim = Limiter(Limits(job=(0, 3), shard=(0, 4), region=(0, 6)))
    lim.take(H, 2)
    assert lim.jobs[H].tokens == 1 and lim.shard.tokens == 2 and lim.region.tokens == 4
    assert lim.available(H) == 1 and lim.which(H) == "job"
    # another job has a bucket of its own, but shares the shard and region
    assert lim.available("ent/other") == 2 and lim.which("ent/other") == "shard"
    lim.take("ent/other", 2)
    assert lim.jobs["ent/other"].tokens == 1 and lim.region.tokens == 2
    assert lim.available("ent/other") == 0 and lim.which("ent/other") == "shard"
    assert lim.available(H) == 0  # the shard is empty now
    lim.take(H, 0)  # nothing done: nothing spent
    assert lim.jobs[H].tokens == 1 and lim.shard.tokens == 0


def test_limiter_forget_drops_a_jobs_bucket():
    lim = Limiter(Limits(job=(0, 2), shard=(0, 100), region=(0, 100)))
    lim.take(H, 2)
    assert lim.available(H) == 0
    lim.forget(H)
    assert lim.available(H) == 2  # a new job of that name starts full


# -- the Gate in reconcile -------------------------------------------------------------------


def test_a_shrink_stops_one_task_per_pass_with_a_budget_of_one():
    ts = {i: task(i) for i in range(4)}
    views = {"m1": machine(reports=running(*ts.values()))}
    plan = reconcile(job(0), ts, views, Gate(budget=1))
    assert new_states(plan) == {0: "stopping"}
    assert plan.destructive == 1 and plan.rate_limited == 3
    assert [op.index for op in plan.held] == [1, 2, 3]
    assert all(op.kind == "stop" and op.reason == "resize to 0: rate limited" for op in plan.held)
    # next pass, one more token: the next task stops
    ts = {**ts, 0: plan.changes[0][1]}
    plan = reconcile(job(0), ts, views, Gate(budget=1))
    assert new_states(plan) == {1: "stopping"}
    assert [op.index for op in plan.held] == [2, 3] and plan.rate_limited == 2


def test_a_shrink_with_no_budget_stops_nothing():
    ts = {i: task(i) for i in range(2)}
    plan = reconcile(job(0), ts, {"m1": machine(reports=running(*ts.values()))}, Gate(budget=0))
    assert plan.changes == [] and plan.rate_limited == 2 and plan.destructive == 0


def test_restarts_in_place_are_not_rate_limited():
    ts = {i: task(i) for i in range(3)}
    plan = reconcile(job(3, spec_version=2, max_unavailable=3), ts,
                     {"m1": machine(reports=running(*ts.values()))}, Gate(budget=0))
    assert new_states(plan) == {0: "starting", 1: "starting", 2: "starting"}
    assert plan.rate_limited == 0 and plan.held == []


def test_a_job_with_a_controller_holds_running_restarts_until_acked_and_updates_down_tasks_at_once():
    ts = {0: task(0), 1: task(1, "failed"), 2: task(2)}
    j = job(3, spec_version=2, max_unavailable=1, controller="http://127.0.0.1:9090/")
    views = {"m1": machine(reports={**running(ts[0], ts[2]),
                                    (H, 1): {"job": H, "index": 1, "spec_version": 1, "state": "failed"}})}
    plan = reconcile(j, ts, views, Gate(approved=frozenset()))
    assert new_states(plan) == {1: "starting"}  # down anyway: updated at once, without asking
    assert [op.id for op in plan.proposed] == ["restart/0/v2", "restart/2/v2"]
    assert [op.index for op in plan.held] == [0, 2]
    assert all(op.reason == "update v1 -> v2: waiting for the TaskController" for op in plan.held)
    # once the controller acks #0 and #2, both restart: it, not max_unavailable, decides
    plan = reconcile(j, ts, views, Gate(approved=frozenset({"restart/0/v2", "restart/2/v2"})))
    assert new_states(plan) == {0: "starting", 1: "starting", 2: "starting"}
    assert plan.held == []
