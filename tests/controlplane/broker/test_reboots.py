"""A reboot announced by a machine's agent is planned unavailability on real etcd: no failure
event while it is away, its task waits for it (suspended in place), and its first heartbeat after
the notice brings the task back on the same machine."""

from __future__ import annotations

import time

import pytest

from tests.controlplane.controld_proc import Controld
from tests.controlplane.frontend.test_controld_api import TASK, register


@pytest.fixture
def controld(tmp_path, etcd_server):
    c = Controld(tmp_path, etcd_server.port, heartbeat_timeout=1.0).start()
    yield c
    c.close()


def beat(c: Controld, mid: str, cred: str, tasks: list[dict], profile=None) -> None:
    status, body = c.call("POST", "/v1/agent/heartbeat", {
        "machine_id": mid, "digest": str(time.monotonic()), "tasks": tasks,
        "profile": {"name": profile, "ok": True}}, token=cred)
    assert status == 200, body


def test_an_announced_reboot_is_no_failure_and_the_task_comes_back_on_the_same_machine(controld):
    creds = {m: register(controld, m, "dc1", f"msb-{m}") for m in ("m1", "m2")}
    assert controld.call("POST", "/v1/entitlements", {"name": "web", "machine_type": "generic", "quota": 2})[0] == 201
    status, job = controld.call("POST", "/v1/jobs", {"entitlement": "web", "name": "api", "count": 1, "task": TASK})
    assert status == 201
    mid = job["tasks"][0]["machine"]
    other = "m2" if mid == "m1" else "m1"
    running = [{"job": "web/api", "index": 0, "spec_version": 1, "state": "running"}]
    beat(controld, mid, creds[mid], running)
    beat(controld, other, creds[other], [])
    controld.wait_for("/v1/jobs/web/api", lambda j: j["tasks"][0]["state"] == "running", what="running")

    assert controld.call("POST", "/v1/agent/shutdown", {"reason": "halt"}, token=creds[mid])[0] == 400
    status, notice = controld.call("POST", "/v1/agent/shutdown", {"reason": "reboot"}, token=creds[mid])
    assert status == 200 and notice["maintenance"].startswith(f"reboot-{mid}-"), notice
    # silent for several heartbeat timeouts (the other machine keeps beating): suspended, not lost
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline:
        beat(controld, other, creds[other], [])
        time.sleep(0.3)
    job = controld.call("GET", "/v1/jobs/web/api")[1]
    assert [(t["machine"], t["state"]) for t in job["tasks"]] == [(mid, "suspended")], job
    events = controld.call("GET", "/v1/events")[1]["events"]
    assert not [e for e in events if e["kind"] == "failure"], events
    machine = controld.call("GET", f"/v1/machines/{mid}")[1]
    assert machine["healthy"] is False  # down, and known to be: it takes no new tasks

    beat(controld, mid, creds[mid], [])  # back after the reboot, its container gone with it
    job = controld.wait_for("/v1/jobs/web/api", lambda j: j["tasks"][0]["state"] in ("starting", "allocated"),
                            what="the task back on its machine")
    assert job["tasks"][0]["machine"] == mid
    m = controld.call("GET", "/v1/maintenance?all=1")[1]["maintenance"]
    assert [(e["id"], e["phase"]) for e in m] == [(notice["maintenance"], "over")]
    desired = controld.call("GET", "/v1/agent/desired?wait=0", token=creds[mid])[1]
    assert [t["job"] for t in desired["tasks"]] == ["web/api"]
    assert not [e for e in controld.call("GET", "/v1/events")[1]["events"] if e["kind"] == "failure"]
