"""TaskControl end to end: real controld, eight real agents in network namespaces, real containers,
and TaskControllers written with the SDK (the reference controllers are the same classes their
programs serve).

Machines have 1 cpu; a task of 0.6 cpu has a machine to itself, so a machine failure takes down
exactly one task. The daemon's rate limit on stops and moves is tight here (1 per second per
job, burst 2) so the rate-limit test can see it hold operations back."""

from __future__ import annotations

import json
import threading
import time

import pytest

from controlplane.devregion import AgentSpec, Region
from controlplane.taskcontrol.controllers.leader_last import LeaderLast
from controlplane.taskcontrol.controllers.replica_aware import ReplicaAware
from controlplane.taskcontrol.sdk import Background, Request, TaskController
from tests.conftest import parse_metrics
from tests.agent.agentproc import free_port
from tests.e2e.helpers import Api, job_spec, running_indices, running_region

pytestmark = pytest.mark.docker

AGENTS = [AgentSpec(f"m{i}", f"dc{1 + i // 5}", f"msb{1 + i // 3}", f"rack{i}", cpus=1.0, memory_mb=512)
          for i in range(8)]
HEARTBEAT_TIMEOUT = 2.0


@pytest.fixture(scope="module")
def region(tmp_path_factory, docker_client):
    yield from running_region(Region(tmp_path_factory.mktemp("tc-region"), AGENTS, heartbeat_timeout=HEARTBEAT_TIMEOUT,
                                   controld_args=("--rate-limits", "job=1:2", "--taskcontrol-interval", "0.5")))


def entitlement(api: Api, name: str) -> None:
    # the test's controllers run on this host's loopback, where controld calls no controller unless allowed
    api.ok("POST", "/v1/entitlements", {"name": name, "machine_type": "generic", "quota": 8, "allow_controller_networks": ["127.0.0.0/8"]})


def update(api: Api, ent: str, name: str, count: int, version: str, **kw) -> None:
    api.ok("PUT", f"/v1/jobs/{ent}/{name}", job_spec(ent, name, count, task={"env": {"V": version}}, **kw))


class Sampler:
    """Which task indices the daemon has down (not running), every 20 ms, in a thread."""

    def __init__(self, api: Api, handle: str):
        self.api, self.handle = api, handle
        self.samples: list[set[int]] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        while not self._done.is_set():
            job = self.api.job(self.handle)
            self.samples.append({t["index"] for t in job["tasks"] if t["state"] != "running"})
            time.sleep(0.02)

    def __enter__(self) -> "Sampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()


class OneAtATimeHighestFirst(TaskController):
    """Figure 8's controller: approves one update at a time, the highest index first."""

    def decide(self, request: Request) -> list[str]:
        if self.in_flight or not request.ops:
            return []
        return [max(request.ops, key=lambda op: op.index).id]


def test_figure8_calling_sequence_for_a_two_task_job(api):
    entitlement(api, "fig8")
    controller = OneAtATimeHighestFirst()
    with Background(controller) as url:
        api.ok("POST", "/v1/jobs", job_spec("fig8", "svc", 2, controller=url))
        api.wait_running("fig8/svc")
        update(api, "fig8", "svc", 2, "2", controller=url)
        job = api.wait_running("fig8/svc")
    assert job["spec_version"] == 2
    calls = [c for c in controller.calls if c["request"] or c["completed"]]
    t0, t1 = "restart/0/v2", "restart/1/v2"
    assert calls[0]["request"] == [t0, t1] and calls[0]["ack"] == [t1], calls
    finished_t1 = next(c for c in calls if t1 in c["completed"])
    assert finished_t1["request"] == [t0] and finished_t1["ack"] == [t0], calls
    acks = [a for c in calls for a in c["ack"]]
    assert acks == [t1, t0], "each update approved once, t1 first"
    seqs = [c["sequence"] for c in controller.calls]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), "sequenceNumber increases with every call"
    api.stop("fig8/svc")


def test_leader_last_updates_followers_first_and_the_leader_once(api, region):
    entitlement(api, "zk")
    leader = 2
    controller = LeaderLast(lambda: leader)
    with Background(controller) as url:
        api.ok("POST", "/v1/jobs", job_spec("zk", "ensemble", 5, controller=url))
        api.wait_running("zk/ensemble")
        before = {c["labels"]["twine.task-index"]: c["id"] for c in region.containers("zk/ensemble")}
        with Sampler(api, "zk/ensemble") as sampler:
            update(api, "zk", "ensemble", 5, "2", controller=url)
            api.wait_running("zk/ensemble", timeout=90)
    order = [int(a.split("/")[1]) for c in controller.calls for a in c["ack"]]
    assert order[-1] == leader and sorted(order) == [0, 1, 2, 3, 4], order
    assert max(len(s) for s in sampler.samples) <= 1, "one member at a time"
    after = {c["labels"]["twine.task-index"]: c for c in region.containers("zk/ensemble")}
    assert after[str(leader)]["id"] != before[str(leader)] and after[str(leader)]["labels"]["twine.generation"] == "1"
    assert len(after) == 5, "the leader was restarted once: one new container, no others"
    api.stop("zk/ensemble")


# Paper Figure 2: shards A-D over tasks 1-7 (task k is index k-1 here).
FIG2 = {"A": [1, 3], "B": [2, 5, 6], "C": [1, 4, 7], "D": [2, 3, 6]}
FIG2_BY_INDEX = {shard: {t - 1 for t in tasks} for shard, tasks in FIG2.items()}


def shards_down(down: set[int]) -> list[str]:
    return [s for s, replicas in FIG2_BY_INDEX.items() if len(down & replicas) > 1]


def test_figure2_replica_aware_rolling_update_and_machine_failure(api, region):
    entitlement(api, "fig2")
    controller = ReplicaAware(FIG2_BY_INDEX)
    with Background(controller) as url:
        api.ok("POST", "/v1/jobs", job_spec("fig2", "shards", 7, cpus=0.6, controller=url))
        job = api.wait_running("fig2/shards")
        assert len({t["machine"] for t in job["tasks"]}) == 7, "a machine per task"

        with Sampler(api, "fig2/shards") as sampler:
            update(api, "fig2", "shards", 7, "2", cpus=0.6, controller=url)
            api.wait_running("fig2/shards", timeout=90)
        assert all(not shards_down(s) for s in sampler.samples), [s for s in sampler.samples if shards_down(s)]
        assert not any({0, 2} <= s for s in sampler.samples), "tasks 1 and 3 were never restarted together"
        assert max(len(s) for s in sampler.samples) >= 2, "batches of more than one task were approved"

        # The one spare machine gets other work, so task 4 has nowhere to move. Task 4's machine
        # fails; then an update: neither task 1 nor task 7 may restart until task 4 is back.
        entitlement(api, "filler")
        api.ok("POST", "/v1/jobs", job_spec("filler", "svc", 1, cpus=0.6))
        api.wait_running("filler/svc")
        task4_machine = next(t["machine"] for t in api.job("fig2/shards")["tasks"] if t["index"] == 3)
        victim = next(a.name for a in AGENTS if region.machine_id(a.name) == task4_machine)
        region.kill_agent(victim)
        try:
            api.wait_job("fig2/shards", lambda j: j["tasks"][3]["state"] == "lost", 30, "task 4 lost")
            with Sampler(api, "fig2/shards") as sampler:
                update(api, "fig2", "shards", 7, "3", cpus=0.6, controller=url)
                api.wait_job("fig2/shards", lambda j: all(t["spec_version"] == 3 and t["state"] == "running"
                                                          for t in j["tasks"] if t["index"] not in (0, 3, 6)),
                             60, "the tasks that share no shard with task 4 updated")
                # tasks 1 and 7 stay untouched while task 4 is down: the controller was asked about
                # them in a call that said task 4 was down, and refused them (the sampler shows the rest)
                deadline = time.monotonic() + 30
                while not any({"restart/0/v3", "restart/6/v3"} <= set(c["request"]) and 3 in c["unhealthy"]
                              and not {"restart/0/v3", "restart/6/v3"} & set(c["ack"]) for c in list(controller.calls)):
                    assert time.monotonic() < deadline, list(controller.calls)[-5:]
                    time.sleep(0.05)
                region.start_agent(victim)
                api.wait_running("fig2/shards", timeout=120)
        finally:
            if region.agent_pid(victim) is None:
                region.start_agent(victim)
        while_4_down = [s for s in sampler.samples if 3 in s]
        assert while_4_down, "the sampler saw task 4 down"
        assert not any(s & {0, 6} for s in while_4_down), "task 1 or 7 restarted while task 4 was down"
        assert all(not shards_down(s - {3}) for s in sampler.samples), "no shard lost two replicas but for the failure"
        back = api.job("fig2/shards")["tasks"][3]
        assert back["machine"] == task4_machine and back["spec_version"] == 3
        requested = [r for c in controller.calls for r in c["request"]]
        assert f"move/3/{task4_machine}" in requested, "the move after the failure was put to the controller"
    api.stop("fig2/shards")
    api.stop("filler/svc")


def test_unreachable_controller_blocks_its_job_only(api, region):
    entitlement(api, "blocked")
    dead = f"http://127.0.0.1:{free_port()}/"  # nothing listens there
    api.ok("POST", "/v1/jobs", job_spec("blocked", "x", 2, controller=dead))
    api.ok("POST", "/v1/jobs", job_spec("blocked", "y", 2))
    api.wait_running("blocked/x")
    api.wait_running("blocked/y")
    x_before = {c["id"] for c in region.containers("blocked/x")}
    update(api, "blocked", "x", 2, "2", controller=dead)
    update(api, "blocked", "y", 2, "2")
    api.wait_running("blocked/y")
    # y is updated; x's calls have failed (twice: the first call and the one at the interval)
    x = api.wait_job("blocked/x", lambda j: j["taskcontrol"]["ok"] is False and j["taskcontrol"]["calls"] >= 2, 30,
                     "x's controller calls failed")
    assert x["spec_version"] == 2 and all(t["spec_version"] == 1 and t["state"] == "running" for t in x["tasks"])
    assert {c["id"] for c in region.containers("blocked/x")} == x_before, "no task of x was touched"
    assert "acks nothing" in x["message"] and x["taskcontrol"]["ok"] is False, x["message"]
    assert sorted(x["taskcontrol"]["pending"]) == ["restart/0/v2", "restart/1/v2"]
    api.stop("blocked/x")
    api.stop("blocked/y")


def test_a_controller_checks_the_jobs_token_and_the_api_never_shows_it(api, region):
    """A controller served with a token answers only calls that carry it (the job's
    controller_token); a job with another token gets 401s, acks nothing, and is held."""
    entitlement(api, "tok")
    with Background(OneAtATimeHighestFirst(), token="tc-secret-1") as url:
        api.ok("POST", "/v1/jobs", job_spec("tok", "good", 1, controller=url, controller_token="tc-secret-1"))
        api.ok("POST", "/v1/jobs", job_spec("tok", "bad", 1, controller=url, controller_token="not-it"))
        api.wait_running("tok/good")
        api.wait_running("tok/bad")
        shown = api.job("tok/good")
        assert shown["controller_token"] is None and shown["controller_token_set"] is True
        assert "tc-secret-1" not in json.dumps(shown) and "not-it" not in json.dumps(api.job("tok/bad"))
        # the job read back keeps its token (null keeps it)
        back = {k: shown[k] for k in ("entitlement", "name", "count", "task", "controller", "controller_token")}
        back["task"] = {**back["task"], "env": {"V": "2"}}
        api.ok("PUT", "/v1/jobs/tok/good", back)
        update(api, "tok", "bad", 1, "2", controller=url, controller_token="not-it")
        good = api.wait_running("tok/good")
        assert good["spec_version"] == 2 and all(t["spec_version"] == 2 for t in good["tasks"])
        bad = api.wait_job("tok/bad", lambda j: j["taskcontrol"] and j["taskcontrol"]["ok"] is False,
                           what="the controller's refusal")
        assert "401" in bad["taskcontrol"]["error"], bad["taskcontrol"]
        assert all(t["spec_version"] == 1 and t["state"] == "running" for t in bad["tasks"])
    api.stop("tok/good")
    api.stop("tok/bad")


def test_a_bug_that_moves_half_the_tasks_is_held_to_the_rate_limit(api, region):
    """Half of the job's machines "fail" at once (their agents stop heartbeating): the moves are
    paced by the job's token bucket (burst 2, then 1 per second) and the status says why."""
    entitlement(api, "limited")
    api.ok("POST", "/v1/jobs", job_spec("limited", "svc", 4, cpus=0.6))
    job = api.wait_running("limited/svc")
    victims = [next(a.name for a in AGENTS if region.machine_id(a.name) == t["machine"]) for t in job["tasks"]]
    seen_note = ""
    try:
        for v in victims:
            region.kill_agent(v)
        moved_at: dict[int, float] = {}
        deadline = time.monotonic() + 60
        while len(moved_at) < 4 and time.monotonic() < deadline:
            j = api.job("limited/svc")
            for t in j["tasks"]:
                if t["index"] not in moved_at and t["machine"] not in {region.machine_id(v) for v in victims}:
                    moved_at[t["index"]] = time.monotonic()
            if "rate limit" in j["message"]:
                seen_note = j["message"]
            time.sleep(0.05)
    finally:
        for v in victims:
            region.start_agent(v)
    times = sorted(moved_at.values())
    assert len(times) == 4, moved_at
    assert times[-1] - times[0] >= 1.5, f"4 moves with burst 2 at 1/s took {times[-1] - times[0]:.2f} s"
    assert "held by the job rate limit" in seen_note, seen_note
    metrics = region_metrics(api)
    assert metrics["twine_ratelimit_held_operations_total"] > 0
    api.wait_running("limited/svc")
    api.stop("limited/svc")


def region_metrics(api: Api) -> dict[str, float]:
    import urllib.request

    req = urllib.request.Request(api.region.url + "/v1/metrics",
                                 headers={"Authorization": f"Bearer {api.region.api_token}"})
    with urllib.request.urlopen(req, timeout=10, context=api.region.tls_context()) as r:
        return parse_metrics(r.read().decode())


# -- maintenance ---------------------------------------------------------------------------------


class Keeps(TaskController):
    """Keeps its tasks through maintenance (a short switch outage, say): acks no maintenance move."""

    def __init__(self) -> None:
        super().__init__()
        self.notices: list[dict] = []

    def decide(self, request: Request) -> list[str]:
        self.notices += [n.raw for n in request.notices]
        return [op.id for op in request.ops if op.reason != "maintenance"]


class MovesEarly(Keeps):
    """Moves its tasks off machines in maintenance as soon as it hears of it."""

    def decide(self, request: Request) -> list[str]:
        super().decide(request)
        return [op.id for op in request.ops]


def docker_sees(region, handle: str, index: int, machines: list[str] | None, timeout: float = 10) -> bool:
    """Whether Docker, within `timeout`, runs task `index` on exactly `machines` (None: nowhere)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if running_indices(region, handle).get(index) == machines:
            return True
        time.sleep(0.1)
    return False


def machines_of(api: Api, handle: str) -> dict[int, str]:
    return {t["index"]: t["machine"] for t in api.job(handle)["tasks"]}


def test_maintenance_notice_then_early_move_or_stop_at_the_deadline(api, region):
    entitlement(api, "maint")
    keeps, early = Keeps(), MovesEarly()
    with Background(keeps) as keep_url, Background(early) as early_url:
        api.ok("POST", "/v1/jobs", job_spec("maint", "keep", 2, cpus=0.6, controller=keep_url))
        api.ok("POST", "/v1/jobs", job_spec("maint", "early", 2, cpus=0.6, controller=early_url))
        api.wait_running("maint/keep")
        api.wait_running("maint/early")
        keep_m, early_m = machines_of(api, "maint/keep")[0], machines_of(api, "maint/early")[0]
        keep_container = next(c["id"] for c in region.containers("maint/keep") if c["labels"]["twine.task-index"] == "0")
        start = time.time() + 8
        event = api.ok("POST", "/v1/maintenance", {"machines": [keep_m, early_m], "start": start, "duration": 6,
                                                   "reason": "firmware"})
        assert event["phase"] == "scheduled" and event["deadline"] == start
        assert {(t["job"], t["index"]) for t in event["tasks"]} == {("maint/keep", 0), ("maint/early", 0)}

        # the early mover: task 0 leaves before the deadline, to a machine not in maintenance
        moved = api.wait_job("maint/early", lambda j: j["tasks"][0]["machine"] != early_m
                             and j["tasks"][0]["state"] == "running", 8, "early move")
        assert time.time() < start, "moved before the deadline"
        assert moved["tasks"][0]["machine"] != keep_m
        assert docker_sees(region, "maint/early", 0, [moved["tasks"][0]["machine"]]), "the old copy stopped"

        # the keeper heard of it, and keeps its task running until the deadline
        notice = next(n for n in keeps.notices if n["id"] == event["id"])
        assert notice["tasks"] == [0] and notice["machines"] == [keep_m] and notice["deadline"] == start
        assert notice["duration"] == 6 and notice["reason"] == "firmware"
        assert any(f"move/0/{keep_m}" in c["request"] and not c["ack"] for c in keeps.calls)
        while time.time() < start - 0.5:
            j = api.job("maint/keep")
            assert j["tasks"][0]["state"] == "running" and j["tasks"][0]["machine"] == keep_m
            time.sleep(0.1)
        # ... and is overridden at the deadline: stopped, discovery off, container gone
        j = api.wait_job("maint/keep", lambda j: j["tasks"][0]["state"] == "suspended", 5, "suspended at the deadline")
        assert time.time() >= start and not j["tasks"][0]["discovery"]
        assert docker_sees(region, "maint/keep", 0, None), "the container stopped at the deadline"
        assert api.ok("GET", f"/v1/maintenance/{event['id']}")["phase"] == "in progress"

        # the maintenance is over: the kept task starts again where it was, in a new container
        j = api.wait_job("maint/keep", lambda j: j["tasks"][0]["state"] == "running", 15, "back after maintenance")
        assert time.time() >= start + 6 and j["tasks"][0]["machine"] == keep_m
        assert docker_sees(region, "maint/keep", 0, [keep_m])
        assert next(c["id"] for c in region.containers("maint/keep")
                    if c["labels"]["twine.task-index"] == "0" and c["status"] == "running") != keep_container
        assert api.ok("GET", f"/v1/maintenance/{event['id']}")["phase"] == "over"
    api.stop("maint/keep")
    api.stop("maint/early")


def test_maintenance_without_a_controller_follows_the_default_policy(api, region, capsys):
    """Scheduled with twinectl, as an operator would: a job without a TaskController moves its task
    away before the deadline (the region default, policy move); with policy stop it keeps it there,
    stops it at the deadline, and it starts again on the same machine when the operator ends the
    maintenance early."""
    from controlplane.cli.twinectl import main as twinectl

    entitlement(api, "plain")
    api.ok("POST", "/v1/jobs", job_spec("plain", "svc", 2, cpus=0.6))
    api.wait_running("plain/svc")
    m0 = machines_of(api, "plain/svc")[0]
    cli = ["--url", region.url, "--ca", str(region.ca_file), "--token", region.api_token]
    assert twinectl([*cli, "maintenance", "schedule", "--machine", m0, "--start", "+8s", "--duration", "5s"]) == 0
    assert "(the region default)" in capsys.readouterr().out
    start = time.time() + 7.5
    j = api.wait_job("plain/svc", lambda j: j["tasks"][0]["machine"] != m0 and j["tasks"][0]["state"] == "running",
                     8, "moved by the default policy")
    assert time.time() < start

    m1 = j["tasks"][1]["machine"]
    assert twinectl([*cli, "maintenance", "schedule", "--machine", m1, "--start", "+4s", "--duration", "1h",
                     "--policy", "stop", "--reason", "disk swap"]) == 0
    capsys.readouterr()
    assert twinectl([*cli, "--json", "maintenance", "list"]) == 0
    listed = json.loads(capsys.readouterr().out)["maintenance"]
    stop_event = next(e for e in listed if e["machines"] == [m1])
    assert stop_event["policy"] == "stop" and not stop_event["policy_default"]
    # the scheduler has seen the maintenance and keeps the task where it is until the deadline
    api.wait_job("plain/svc", lambda j: any(w.startswith("#1: stays on") and "(policy stop)" in w
                                            for w in j["operations"]["waiting"]), 8, "the stay said")
    assert machines_of(api, "plain/svc")[1] == m1, "policy stop: not moved before the deadline"
    api.wait_job("plain/svc", lambda j: j["tasks"][1]["state"] == "suspended", 8, "stopped at the deadline")
    assert twinectl([*cli, "maintenance", "end", stop_event["id"]]) == 0
    j = api.wait_job("plain/svc", lambda j: j["tasks"][1]["state"] == "running", 15, "back when the operator ends it")
    assert j["tasks"][1]["machine"] == m1
    assert twinectl([*cli, "maintenance", "end", "maint-nope"]) == 1
    api.stop("plain/svc")
