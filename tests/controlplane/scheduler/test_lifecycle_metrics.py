"""The daemon's latency histograms (issue #12), read from /v1/metrics: real etcd, a real
twine-controld, simulated agents (named so: no containers), a TaskController on a thread."""

from __future__ import annotations

import time

import pytest

from controlplane.taskcontrol.sdk import Background, TaskController
from tests.controlplane.controld_proc import daemon_with_sim_agents

TASK = {"image": "twine/busybox:1", "command": ["sleep", "3600"], "cpus": 1.0, "memory_mb": 64}
TIMEOUT = 1.0  # the daemon's heartbeat timeout


class AckAll(TaskController):
    def decide(self, request):
        return request.ops


@pytest.fixture
def region(tmp_path, etcd_server):
    with daemon_with_sim_agents(tmp_path, etcd_server.port, ("h1", "h2", "h3"), heartbeat_timeout=TIMEOUT) as (c, agents):
        yield c, agents


def running(j: dict, version: int, away_from: str | None = None) -> bool:
    return len(j["tasks"]) == j["count"] and all(
        t["state"] == "running" and t["spec_version"] == version and t["machine"] != away_from for t in j["tasks"])


def test_submit_update_and_failure_latencies_are_observed_once_each(region):
    c, agents = region
    assert c.call("POST", "/v1/entitlements", {"name": "a", "machine_type": "generic", "quota": 3})[0] == 201
    t0 = time.monotonic()
    assert c.call("POST", "/v1/jobs", {"entitlement": "a", "name": "svc", "count": 2, "task": TASK})[0] == 201
    job = c.wait_for("/v1/jobs/a/svc", lambda j: running(j, 1), what="a/svc running")
    took = time.monotonic() - t0
    m = c.wait_metrics(lambda m: m.get("twine_submit_to_running_seconds_count") == 1, what="the submit observed")
    assert 0 < m["twine_submit_to_running_seconds_sum"] <= took + 0.5, (m["twine_submit_to_running_seconds_sum"], took)

    spec = {"entitlement": "a", "name": "svc", "count": 2, "task": {**TASK, "env": {"V": "2"}}}
    assert c.call("PUT", "/v1/jobs/a/svc", spec)[0] == 200
    c.wait_for("/v1/jobs/a/svc", lambda j: running(j, 2), what="a/svc updated")
    c.wait_metrics(lambda m: m.get("twine_submit_to_running_seconds_count") == 2, what="the update observed")

    victim = job["tasks"][0]["machine"]
    lost = sum(1 for t in job["tasks"] if t["machine"] == victim)
    agents.cut.add(victim)
    c.wait_for("/v1/jobs/a/svc", lambda j: running(j, 2, away_from=victim), what="a/svc replaced")
    m = c.wait_metrics(lambda m: m.get("twine_failure_to_replacement_seconds_count") == lost,
                       what="each replacement observed")
    # from when the machine was last heard from: the heartbeat timeout at least, detection included
    assert m["twine_failure_to_replacement_seconds_sum"] >= lost * TIMEOUT, m
    # passes go on (a few more of them): each rollout and each replacement counted once, not once a pass
    passes = m["twine_scheduler_job_passes_total"]
    m = c.wait_metrics(lambda m: m["twine_scheduler_job_passes_total"] >= passes + 3, what="three more job passes")
    assert m["twine_submit_to_running_seconds_count"] == 2 and m["twine_failure_to_replacement_seconds_count"] == lost


def test_taskcontrol_round_trips_are_observed_by_outcome(region):
    c, _ = region
    assert c.call("POST", "/v1/entitlements", {"name": "t", "machine_type": "generic", "quota": 3,
                                                 # its controller runs here, on loopback
                                                 "allow_controller_networks": ["127.0.0.0/8"]})[0] == 201
    with Background(AckAll()) as url:
        spec = {"entitlement": "t", "name": "svc", "count": 2, "task": TASK, "controller": url}
        assert c.call("POST", "/v1/jobs", spec)[0] == 201
        c.wait_for("/v1/jobs/t/svc", lambda j: running(j, 1), what="t/svc running")
        # an update: each task's restart is the controller's to approve
        assert c.call("PUT", "/v1/jobs/t/svc", {**spec, "task": {**TASK, "env": {"V": "2"}}})[0] == 200
        c.wait_for("/v1/jobs/t/svc", lambda j: running(j, 2), what="t/svc updated")
        m = c.wait_metrics(lambda m: m.get('twine_taskcontrol_round_trip_seconds_count{outcome="ok"}', 0) >= 1,
                           what="a call answered")
        assert m.get('twine_taskcontrol_round_trip_seconds_count{outcome="error"}', 0) == 0
        # a handful of calls for a 2-task update, not a loop of approvals withdrawn and given again
        assert m['twine_taskcontrol_round_trip_seconds_count{outcome="ok"}'] < 30, m
    # the controller is gone: the next update's calls fail, and are counted so
    assert c.call("PUT", "/v1/jobs/t/svc", {**spec, "task": {**TASK, "env": {"V": "3"}}})[0] == 200
    c.wait_metrics(lambda m: m.get('twine_taskcontrol_round_trip_seconds_count{outcome="error"}', 0) >= 1,
                   what="a failed call", timeout=10)


def test_what_began_before_the_tracker_or_never_moved_is_not_counted():
    """A leader that takes a job over mid-rollout (or a restarted daemon) did not see the rollout
    begin: a rollout of yesterday finishing now is not 24 h of submit-to-running. A task whose
    machine came back before it moved has no replacement to time, even if it moves later."""
    from controlplane.scheduler.lifecycle import Lifecycle, LifecycleMetrics
    from controlplane.store.records import EventRec, JobRec, MachineRec, TaskRec

    now = 1_800_000_000.0
    metrics = LifecycleMetrics()
    life = Lifecycle(metrics, now=now)
    job = JobRec("e", "j", 2, TASK, spec_version=2, created_at=now - 86400, updated_at=now - 86400)
    machines = {m: MachineRec(m, m, {"region": "r"}, {"cpus": 4, "memory_mb": 4096}) for m in ("a", "b")}
    running = lambda i, m="a", v=2: TaskRec("e/j", i, v, TASK, m, "running")  # noqa: E731
    none = lambda mid: []  # noqa: E731
    life.observe(job, {0: running(0), 1: TaskRec("e/j", 1, 2, TASK, "a", "starting")}, machines, none, now + 1)
    life.observe(job, {0: running(0), 1: running(1)}, machines, none, now + 2)
    assert metrics.submit_to_running._sum.get() == 0 and life.rollouts == {}

    # machine a fails (after the tracker began), then comes back before its tasks moved
    machines["a"] = MachineRec("a", "a", {"region": "r"}, {"cpus": 4, "memory_mb": 4096}, healthy=False)
    failure = EventRec("f", "failure", ("a",), now + 3)
    events = lambda mid: [failure] if mid == "a" else []  # noqa: E731
    life.observe(job, {0: running(0), 1: running(1)}, machines, events, now + 5)
    assert {(h, i) for h, of in life.lost.items() for i in of} == {("e/j", 0), ("e/j", 1)}
    machines["a"] = MachineRec("a", "a", {"region": "r"}, {"cpus": 4, "memory_mb": 4096})
    life.observe(job, {0: running(0), 1: running(1)}, machines, events, now + 6)
    assert life.lost == {}
    life.observe(job, {0: running(0, "b"), 1: running(1)}, machines, events, now + 600)  # moved later, for another reason
    assert metrics.failure_to_replacement._sum.get() == 0
