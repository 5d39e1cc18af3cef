"""Each task's usage (issue #35): a job's usage answer with ?tasks=1 lists every task with its own
cores and memory as the heartbeats carried them, against real controld on real etcd. Agents are
played by plain HTTP calls on the agent endpoints (as in test_controld_api.py); with two replicas,
each machine's heartbeats reach another replica, and either replica's answer lists both tasks."""

from __future__ import annotations

import time

from tests.controlplane.controld_proc import Controld, member, wait
from tests.controlplane.frontend.test_controld_api import controld, register  # noqa: F401 - the fixture

TASK = {"image": "twine/busybox:1", "command": ["sleep", "3600"], "cpus": 1.5, "memory_mb": 512}


def usage(tasks: list) -> dict:
    """A heartbeat's usage: the host's figures, and [job, index, cores, MiB] per task."""
    return {"window": 1.0, "cpus": 2, "cpu": 1.9, "memory_mb": 1500.0, "memory_total_mb": 2048.0, "tasks": tasks}


def heartbeat(c: Controld, mid: str, cred: str, tasks: list) -> None:
    beat = {"machine_id": mid, "digest": "a", "tasks": [], "profile": {"name": None, "ok": True}, "usage": usage(tasks)}
    status, answer = c.call("POST", "/v1/agent/heartbeat", beat, token=cred)
    assert status == 200, answer


def one_task_a_machine(c: Controld) -> dict[int, str]:
    """web/api, two tasks of 1.5 cores on machines of 2: one a machine. Index -> machine."""
    assert c.call("POST", "/v1/entitlements", {"name": "web", "machine_type": "generic", "quota": 2})[0] == 201
    status, job = c.call("POST", "/v1/jobs", {"entitlement": "web", "name": "api", "count": 2, "task": TASK})
    assert status == 201, job
    where = {t["index"]: t["machine"] for t in job["tasks"]}
    assert sorted(where.values()) == ["m1", "m2"], job["tasks"]
    return where


def test_a_jobs_usage_lists_each_tasks_cores_and_memory_from_the_heartbeats(controld):
    creds = {m: register(controld, m, "dc1", "msb1") for m in ("m1", "m2")}
    where = one_task_a_machine(controld)
    on = {m: i for i, m in where.items()}
    before = time.time()
    heartbeat(controld, "m1", creds["m1"], [["web/api", on["m1"], 1.25, 300.4]])
    # m2's report names m1's task too (a copy starting there, say): m1's task's figure is m1's
    heartbeat(controld, "m2", creds["m2"], [["web/api", on["m2"], 0.05, 20.0], ["web/api", on["m1"], 0.9, 50.0]])
    after = time.time()

    status, ju = controld.call("GET", "/v1/jobs/web/api/usage?tasks=1")
    assert status == 200, ju
    assert ju["current"]["tasks_reporting"] == 3  # the job's sum counts every figure reported
    tasks = {t["index"]: t for t in ju["tasks"]}
    assert sorted(tasks) == [0, 1]
    assert {k: tasks[on["m1"]][k] for k in ("machine", "cpus", "memory_mb")} == {"machine": "m1", "cpus": 1.25,
                                                                                "memory_mb": 300}
    assert {k: tasks[on["m2"]][k] for k in ("machine", "cpus", "memory_mb")} == {"machine": "m2", "cpus": 0.05,
                                                                                "memory_mb": 20}
    assert all(before - 1 <= t["measured_at"] <= after + 1 for t in ju["tasks"]), ju["tasks"]

    # a newer heartbeat replaces its machine's figures; a machine silent about a task leaves it unmeasured
    heartbeat(controld, "m1", creds["m1"], [])
    tasks = {t["index"]: t for t in controld.call("GET", "/v1/jobs/web/api/usage?tasks=true")[1]["tasks"]}
    assert (tasks[on["m1"]]["cpus"], tasks[on["m1"]]["memory_mb"], tasks[on["m1"]]["measured_at"]) == (None, None, None)
    assert tasks[on["m2"]]["cpus"] == 0.05

    assert "tasks" not in controld.call("GET", "/v1/jobs/web/api/usage")[1]  # asked for only
    status, answer = controld.call("GET", "/v1/jobs/web/api/usage?tasks=yes")
    assert (status, answer["field"]) == (400, "tasks")
    # what this replica's book holds, as another replica asks for it
    status, held = controld.call("GET", "/v1/internal/usage/tasks?job=web/api")
    assert status == 200 and [t[:5] for t in held["tasks"]] == [["web/api", on["m2"], "m2", 50, 20],
                                                                ["web/api", on["m1"], "m2", 900, 50]], held
    assert controld.call("GET", "/v1/internal/usage/tasks?entitlement=db")[1] == {"tasks": []}
    assert controld.call("GET", "/v1/internal/usage/tasks?job=web")[1]["field"] == "job"


def test_either_replica_lists_the_tasks_whose_heartbeats_reached_the_other(tmp_path, etcd_server):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = Controld(tmp_path / "a", etcd_server.port, heartbeat_timeout=120)
    b = Controld(tmp_path / "b", etcd_server.port, heartbeat_timeout=120, region=a.region)
    try:
        a.start()
        b.start(wait_led=False)
        wait(lambda: {m["id"] for m in a.cluster()["members"]} >= {member(a), member(b)}, 20, "two members")
        creds = {m: register(a, m, "dc1", "msb1") for m in ("m1", "m2")}
        where = one_task_a_machine(a)
        on = {m: i for i, m in where.items()}

        def both_measured(c: Controld) -> dict | None:
            """Heartbeats as agents send them, again each time: the first may reach b before its view
            has the job (its book takes no figure of a job it does not know yet)."""
            heartbeat(a, "m1", creds["m1"], [["web/api", on["m1"], 1.25, 300.0]])  # m1's report stays with a
            heartbeat(b, "m2", creds["m2"], [["web/api", on["m2"], 0.05, 20.0]])  # m2's with b
            status, u = c.call("GET", "/v1/jobs/web/api/usage?tasks=1")
            return u if status == 200 and all(t["cpus"] is not None for t in u["tasks"]) else None

        for c in (a, b):  # (b forwards the request to a, the shard's leader, which asks b)
            u = wait(lambda c=c: both_measured(c), 20, f"both tasks measured, asked of {c.url}", interval=0.2)
            assert {t["index"]: (t["machine"], t["cpus"], t["memory_mb"]) for t in u["tasks"]} == \
                {on["m1"]: ("m1", 1.25, 300), on["m2"]: ("m2", 0.05, 20)}, u["tasks"]
        assert a.metric("twine_usage_peer_asks_total") >= 1 and a.metric("twine_usage_peer_ask_failures_total") == 0
    finally:
        a.close()
        b.close()
