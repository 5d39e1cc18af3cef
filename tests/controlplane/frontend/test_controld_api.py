"""twine-controld's API against real etcd: authentication, bad input (a 4xx naming the field, and
nothing written), agent registration and the desired-state long poll, a restart that loses nothing.

Agents are played here by plain HTTP calls on the agent endpoints (the real agents are in the
end-to-end tests under tests/e2e)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from controlplane.store import Store
from controlplane.store.keys import Keys
from tests.controlplane.controld_proc import BOOTSTRAP_TOKEN, Controld

TASK = {"image": "twine/busybox:1", "command": ["sleep", "3600"], "cpus": 1, "memory_mb": 64}


@pytest.fixture
def controld(tmp_path, etcd_server):
    c = Controld(tmp_path, etcd_server.port).start()
    yield c
    c.close()


def etcd_revision(port: int) -> int:
    async def read() -> int:
        store = Store([("127.0.0.1", port)])
        try:
            return (await store.range("/twine/"))[1]
        finally:
            await store.close()

    return asyncio.run(read())


def register(c: Controld, mid: str, dc: str, msb: str, cpus: float = 2, memory_mb: int = 2048) -> str:
    status, body = c.call("POST", "/v1/agent/register", {
        "machine_id": mid, "hostname": mid, "address": f"10.0.0.{len(mid)}",
        "labels": {"region": c.region, "dc": dc, "msb": msb, "rack": f"rack-{mid}", "machine_type": "generic"},
        "capacity": {"cpus": cpus, "memory_mb": memory_mb}}, token=BOOTSTRAP_TOKEN)
    assert status == 200, body
    return body["credential"]


def test_every_request_needs_a_valid_token(controld):
    assert controld.call("GET", "/v1/machines", token=None)[0] == 401
    status, body = controld.call("GET", "/v1/jobs", token="wrong")
    assert status == 401 and body["error"] == "unauthorized"
    assert controld.call("GET", "/v1/agent/desired", token=BOOTSTRAP_TOKEN)[0] == 401
    status, doc = controld.call("GET", "/v1/openapi.json", token=None)
    assert status == 200 and doc["openapi"].startswith("3.")
    assert {"/v1/jobs", "/v1/entitlements", "/v1/agent/heartbeat"} <= set(doc["paths"])


def test_bad_input_is_a_4xx_naming_the_field_and_writes_nothing(controld, etcd_server):
    register(controld, "m1", "dc1", "msb1")
    register(controld, "m2", "dc1", "msb2")
    assert controld.call("POST", "/v1/entitlements", {"name": "web", "machine_type": "generic", "quota": 1})[0] == 201
    before = etcd_revision(etcd_server.port)
    job = {"entitlement": "web", "name": "api", "count": 1, "task": TASK}
    cases = [
        ("POST", "/v1/jobs", b"{not json", 400, "body"),
        ("POST", "/v1/jobs", {**job, "colour": "red"}, 400, "colour"),
        ("POST", "/v1/jobs", {**job, "task": {**TASK, "memory_mb": 1}}, 400, "task.memory_mb"),
        ("POST", "/v1/jobs", {**job, "task": {**TASK, "image": ""}}, 400, "task.image"),
        ("POST", "/v1/jobs", {**job, "count": -1}, 400, "count"),
        ("POST", "/v1/jobs", {**job, "entitlement": "nope"}, 404, "entitlement"),
        ("POST", "/v1/jobs", {**job, "count": 3}, 422, "count"),  # quota 1: m2 would fit, but the entitlement may not take it
        ("POST", "/v1/jobs", {**job, "task": {**TASK, "cpus": 64}}, 422, "cpus"),
        ("POST", "/v1/jobs", {**job, "requirements": {"dc": "dc9"}}, 422, "dc"),
        ("POST", "/v1/entitlements", {"name": "web", "machine_type": "generic", "quota": 1}, 409, "name"),
        ("POST", "/v1/entitlements", {"name": "db", "machine_type": "generic", "quota": 1, "profile": "nope"}, 422, "profile"),
        ("POST", "/v1/entitlements", {"name": "Bad Name", "machine_type": "generic", "quota": 1}, 400, "name"),
        ("PATCH", "/v1/entitlements/web", {"quota": "many"}, 400, "quota"),
        ("GET", "/v1/jobs/web/none", None, 404, "job"),
        ("POST", "/v1/maintenance", {"msb": "msb9", "start": time.time() + 60, "duration": 60}, 422, "msb"),
        ("POST", "/v1/maintenance", {"machines": ["m1"], "start": time.time() + 60, "duration": 60,
                                     "deadline": time.time() + 120}, 422, "deadline"),
        ("POST", "/v1/maintenance", {"machines": ["m1"], "start": "soon", "duration": 60}, 400, "start"),
        ("GET", "/v1/maintenance/maint-none", None, 404, "maintenance"),
        ("POST", "/v1/maintenance/maint-none/end", None, 404, "maintenance"),
    ]
    for method, path, body, want, field in cases:
        status, answer = controld.call(method, path, body)
        assert status == want, (path, body, answer)
        assert answer["field"] == field and answer["why"], answer
    _, quota = controld.call("POST", "/v1/jobs", {**job, "count": 3})
    assert "quota of 1" in quota["why"]
    _, nofit = controld.call("POST", "/v1/jobs", {**job, "task": {**TASK, "cpus": 64}})
    assert "cpu>=64 left 0" in nofit["why"]
    assert etcd_revision(etcd_server.port) == before, "a refused request wrote to etcd"


def test_registration_long_poll_and_heartbeat_reports(controld):
    cred = register(controld, "m1", "dc1", "msb1")
    assert controld.call("GET", "/v1/jobs", token=cred)[0] == 401  # a machine credential is not an API token
    status, empty = controld.call("GET", "/v1/agent/desired?version=&wait=5", token=cred)
    assert status == 200 and empty["tasks"] == [] and empty["profile"] is None

    t0 = time.monotonic()
    assert controld.call("GET", f"/v1/agent/desired?version={empty['version']}&wait=0.5", token=cred)[1] == empty
    assert time.monotonic() - t0 >= 0.45  # nothing changed: the poll waited

    answer: dict = {}

    def poll() -> None:
        answer.update(controld.call("GET", f"/v1/agent/desired?version={empty['version']}&wait=20", token=cred)[1])
        answer["after"] = time.monotonic()

    waiter = threading.Thread(target=poll)
    waiter.start()
    time.sleep(0.3)
    controld.call("POST", "/v1/entitlements", {"name": "web", "machine_type": "generic", "quota": 1})
    placed_at = time.monotonic()
    status, job = controld.call("POST", "/v1/jobs", {"entitlement": "web", "name": "api", "count": 1, "task": TASK})
    assert status == 201 and job["tasks"][0]["machine"] == "m1"
    controld.call("POST", "/v1/agent/heartbeat", {"machine_id": "m1", "digest": "a", "tasks": [],
                                                   "profile": {"name": None, "ok": True}}, token=cred)
    waiter.join(25)
    assert [t["job"] for t in answer["tasks"]] == ["web/api"] and answer["after"] - placed_at < 5

    status, hb = controld.call("POST", "/v1/agent/heartbeat", {"machine_id": "m1", "digest": "b", "tasks": [
        {"job": "web/api", "index": 0, "spec_version": 1, "state": "running"}]}, token=cred)
    assert status == 200 and hb["ok"]
    # the pace agents keep: every interval, and the silence after which the machine fails
    assert (hb["interval"], hb["timeout"]) == (1.0, controld.heartbeat_timeout), hb
    job = controld.wait_for("/v1/jobs/web/api", lambda j: j["tasks"][0]["state"] == "running", what="running")
    assert job["tasks"][0]["discovery"] is True
    status, disc = controld.call("GET", "/v1/discovery/web/api")
    assert disc["endpoints"][0]["enabled"] is True and disc["endpoints"][0]["machine"] == "m1"
    # the address m1 registered with (register()); the same as the record etcd holds for discovery's clients
    assert disc["endpoints"] == [{"job": "web/api", "index": 0, "machine": "m1", "address": "10.0.0.2",
                                  "enabled": True, "spec_version": 1}], disc

    async def records() -> list:
        store = Store([("127.0.0.1", controld.etcd_port)])
        try:
            return [v.value for v in (await store.range(Keys(controld.region).discovery("web/api")))[0]]
        finally:
            await store.close()

    assert asyncio.run(records()) == disc["endpoints"]
    # a digest the daemon has not seen, without tasks: it asks for the full report
    assert controld.call("POST", "/v1/agent/heartbeat", {"machine_id": "m1", "digest": "zzz"}, token=cred)[1]["resend"]


def test_restart_rebuilds_the_same_view_and_desired_state(controld, tmp_path, etcd_server):
    creds = {m: register(controld, m, dc, msb) for m, dc, msb in (("m1", "dc1", "msb1"), ("m2", "dc2", "msb2"))}
    controld.call("POST", "/v1/entitlements", {"name": "web", "machine_type": "generic", "quota": 2})
    status, job = controld.call("POST", "/v1/jobs", {"entitlement": "web", "name": "api", "count": 2, "task": TASK})
    assert status == 201
    job = controld.wait_for("/v1/jobs/web/api", lambda j: all(t["state"] == "starting" for t in j["tasks"]),
                            what="tasks in their machines' desired state")
    desired = {m: controld.call("GET", "/v1/agent/desired?wait=0", token=c)[1] for m, c in creds.items()}
    machines = controld.call("GET", "/v1/machines")[1]
    controld.kill()
    controld.start()
    again = controld.call("GET", "/v1/jobs/web/api")[1]
    assert [(t["index"], t["machine"], t["spec_version"]) for t in again["tasks"]] == \
        [(t["index"], t["machine"], t["spec_version"]) for t in job["tasks"]]
    assert {m: controld.call("GET", "/v1/agent/desired?wait=0", token=c)[1] for m, c in creds.items()} == desired
    after = controld.call("GET", "/v1/machines")[1]
    strip = lambda ms: [{k: v for k, v in m.items() if k != "last_heartbeat"} for m in ms["machines"]]
    assert strip(after) == strip(machines)


def test_machines_in_maintenance_take_no_new_tasks_until_it_ends(controld):
    register(controld, "m1", "dc1", "msb1", cpus=1)
    register(controld, "m2", "dc1", "msb2", cpus=1)
    assert controld.call("POST", "/v1/entitlements", {"name": "web", "machine_type": "generic", "quota": 2})[0] == 201
    status, event = controld.call("POST", "/v1/maintenance", {"msb": "msb1", "start": time.time() + 600,
                                                              "duration": 60, "reason": "switch"})
    assert status == 201 and event["machines"] == ["m1"] and event["phase"] == "scheduled", event
    assert event["policy"] == "move" and event["policy_default"] is True and event["scope"] == "msb=msb1"
    big = {**TASK, "cpus": 0.6}
    status, job = controld.call("POST", "/v1/jobs", {"entitlement": "web", "name": "a", "count": 1, "task": big})
    assert status == 201 and job["tasks"][0]["machine"] == "m2", "the machine in maintenance was left alone"
    status, refused = controld.call("POST", "/v1/jobs", {"entitlement": "web", "name": "b", "count": 1, "task": big})
    assert status == 422, refused
    status, ended = controld.call("POST", f"/v1/maintenance/{event['id']}/end")
    assert status == 200 and ended["phase"] == "over"
    assert controld.call("POST", f"/v1/maintenance/{event['id']}/end")[0] == 409
    assert controld.call("GET", "/v1/maintenance")[1]["maintenance"] == []
    assert [e["id"] for e in controld.call("GET", "/v1/maintenance?all=1")[1]["maintenance"]] == [event["id"]]
    status, job = controld.call("POST", "/v1/jobs", {"entitlement": "web", "name": "b", "count": 1, "task": big})
    assert status == 201 and job["tasks"][0]["machine"] == "m1", job


def test_a_large_job_commits_in_one_transaction(controld):
    """Job creation is one etcd transaction (tasks, discovery records, machines): etcd runs with
    room for it (--max-txn-ops, --max-request-bytes; see docs/api.md)."""
    for i in range(10):
        register(controld, f"m{i}", "dc1", f"msb{i % 3}", cpus=64, memory_mb=65536)
    assert controld.call("POST", "/v1/entitlements", {"name": "big", "machine_type": "generic", "quota": 10})[0] == 201
    status, job = controld.call("POST", "/v1/jobs", {"entitlement": "big", "name": "fleet", "count": 600,
                                                     "task": {**TASK, "cpus": 1, "memory_mb": 64}})
    assert status == 201, job
    assert len(job["tasks"]) == 600 and len({t["machine"] for t in job["tasks"]}) == 10


def test_a_usage_report_beyond_its_host_is_refused_and_counted(controld):
    """Issue #25: usage travels with heartbeats, checked by the schema (no negative figure) and
    against the host it describes (no more cores than it has); a bad one is refused, as the rest
    of a bad heartbeat is, and counted."""
    cred = register(controld, "m1", "dc1", "msb1")
    usage = {"window": 1.0, "cpus": 2, "cpu": 1.2, "memory_mb": 900.0, "memory_total_mb": 2048.0, "power_w": None,
             "tasks": [["web/api", 0, 1.01, 60.5]]}
    beat = {"machine_id": "m1", "digest": "a", "tasks": [], "profile": {"name": None, "ok": True}}
    assert controld.call("POST", "/v1/agent/heartbeat", {**beat, "usage": usage}, token=cred)[0] == 200
    # 400: what the schema refuses; 422: what it allows but the host it describes cannot have
    for bad, field, code in (({"cpu": -0.5}, "usage.cpu", 400), ({"tasks": [["web/api", 0, 2.5, 1.0]]}, "usage.tasks[0]", 422),
                             ({"memory_mb": 4096.0}, "usage.memory_mb", 422), ({"tasks": [["web/api", 0, 0.1]]}, "usage.tasks[0]", 400),
                             ({"cpus": 0}, "usage.cpus", 400), ({"tasks": [["web/api", 0, 0.1, 9999.0]]}, "usage.tasks[0]", 422)):
        status, answer = controld.call("POST", "/v1/agent/heartbeat", {**beat, "usage": {**usage, **bad}}, token=cred)
        assert status == code and answer["field"] == field, (bad, answer)
    metrics = controld.metrics()
    assert metrics["twine_agents_usage_refused_total"] == 3, {k: v for k, v in metrics.items() if "refused" in k}
    assert metrics["twine_agents_heartbeats_total"] == 1  # the refused ones were not heard


def test_usage_reported_shows_in_the_fleet_and_the_jobs_and_entitlements_usage(controld):
    """Issue #25: what heartbeats carry is summed per fleet cell, job and entitlement; the usage
    endpoints bound since and step (a 400 naming the field)."""
    cred = register(controld, "m1", "dc1", "msb1", cpus=4, memory_mb=4096)
    register(controld, "m2", "dc1", "msb2", cpus=4, memory_mb=4096)
    assert controld.call("POST", "/v1/entitlements", {"name": "web", "machine_type": "generic", "quota": 1})[0] == 201
    status, job = controld.call("POST", "/v1/jobs", {"entitlement": "web", "name": "api", "count": 2, "task": TASK})
    assert status == 201 and {t["machine"] for t in job["tasks"]} == {"m1"}, job
    usage = {"window": 1.0, "cpus": 4, "cpu": 2.5, "memory_mb": 1500.0, "memory_total_mb": 4096.0, "power_w": 80.5,
             "tasks": [["web/api", 0, 1.02, 60.6], ["web/api", 1, 0.004, 10.0], ["made/up", 0, 1.0, 1.0]]}
    beat = {"machine_id": "m1", "digest": "a", "tasks": [], "profile": {"name": None, "ok": True}, "usage": usage}
    assert controld.call("POST", "/v1/agent/heartbeat", beat, token=cred)[0] == 200

    status, fleet = controld.call("GET", "/v1/fleet")
    assert status == 200, fleet
    cells = {(c["dc"], c["msb"], c["entitlement"], c["type"]): c for c in fleet["cells"]}
    web = cells[("dc1", "msb1", "web", "generic")]
    assert (web["machines"], web["healthy"], web["cpus"], web["reserved"]) == (1, 1, 4, {"cpus": 2, "memory_mb": 128})
    assert web["used"] == {"cpus": 1.024, "memory_mb": 71, "machines_reporting": 1}  # made/up is no job here
    assert web["hosts_used"] == {"cpus": 2.5, "memory_mb": 1500, "power_w": 80.5, "machines_with_power": 1}
    pool = cells[("dc1", "msb2", "", "generic")]
    assert pool["used"]["machines_reporting"] == 0 and pool["reserved"]["cpus"] == 0
    assert fleet["free_pool"] == [{"type": "generic", "dc": "dc1", "machines": 1, "usable": 1}]
    # web holds its quota (1 machine) with 2 of 4 cores reserved: the largest task it can still take
    assert fleet["entitlements"]["web"]["largest_task"] == {"cpus": 2, "memory_mb": 4096 - 128}
    status, by_dc = controld.call("GET", "/v1/fleet?by=dc")
    assert [(c["dc"], c["machines"], c["used"]["cpus"]) for c in by_dc["cells"]] == [("dc1", 2, 1.024)]

    status, ju = controld.call("GET", "/v1/jobs/web/api/usage?since=21600&step=300")
    assert status == 200, ju
    assert ju["current"] == {"cpus": 1.024, "memory_mb": 71, "tasks_reporting": 2}
    assert ju["reserved"] == {"cpus": 2, "memory_mb": 128} and ju["step"] == 300 and ju["fields"][0] == "t"
    status, eu = controld.call("GET", "/v1/entitlements/web/usage")
    assert status == 200 and eu["current"] == {"cpus": 1.024, "memory_mb": 71, "tasks_reporting": 2}, eu
    # each out of its bounds: a 400 naming it; within them but not together: a 422 naming step
    for query, status_field in (("since=5443200", (400, "since")), ("since=10", (400, "since")),
                                ("since=6h", (400, "since")), ("since=21600&step=90", (400, "step")),
                                ("since=259200&step=300", (422, "step")), ("since=604800&step=60", (422, "step")),
                                ("since=604800&step=3600&x=1", (200, None)), ("since=1209600&step=3600", (200, None)),
                                ("since=3600&step=1209600", (400, "step"))):
        status, answer = controld.call("GET", f"/v1/jobs/web/api/usage?{query}")
        assert (status, answer.get("field")) == status_field, (query, answer)
    assert controld.call("GET", "/v1/fleet?by=colour")[1]["field"] == "by"
    # per job, entitlement, dc and type: no machine's or task's series; the machines' families are
    # those summed at the scrape before (a pass over the machines is no scrape's: usage/fleet.py)
    m = controld.wait_metrics(lambda m: m.get('twine_free_pool_machines{dc="dc1",machine_type="generic"}') == 1,
                              what="the free pool's family")
    assert m['twine_job_cpu_used_cores{entitlement="web",handle="web/api"}'] == 1.024
    assert m['twine_job_cpu_reserved_cores{entitlement="web",handle="web/api"}'] == 2
    assert m['twine_entitlement_memory_used_bytes{entitlement="web"}'] == 71 * 2**20
    assert m['twine_fleet_cpu_used_cores{dc="dc1",entitlement="web",machine_type="generic"}'] == 1.024
    assert m['twine_free_pool_machines{dc="dc1",machine_type="generic"}'] == 1
    assert not [k for k in m if "m1" in k or "index" in k]
    assert m["twine_usage_machines_reporting"] == 1  # m1's report, held here
    assert controld.call("GET", "/v1/jobs/web/nope/usage")[0] == 404
