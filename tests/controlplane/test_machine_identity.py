"""A bootstrap token registers machine ids that do not exist; an existing id is registered again
only with its current credential or after an admin's release (issue #11: the bootstrap token took
a live machine over, its desired state and task environment included). Labels and capacity do not
change under placed tasks."""

from __future__ import annotations

import json
import urllib.request

from tests.controlplane.controld_proc import API_TOKEN, BOOTSTRAP_TOKEN
from tests.controlplane.test_controld_api import controld, etcd_revision  # noqa: F401 - a fixture

TASK = {"image": "twine/busybox:1", "command": ["sleep", "3600"], "cpus": 0.5, "memory_mb": 16,
        "env": {"SECRETISH": "only-for-m1"}}


def register(c, mid: str, current: str | None = None, **changes) -> tuple[int, dict]:
    body = {"machine_id": mid, "hostname": mid, "address": "",
            "labels": {"region": c.region, "dc": "dc1", "msb": "msb1", "rack": "r1", "machine_type": "generic"},
            "capacity": {"cpus": 4, "memory_mb": 4096}, **changes}
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {BOOTSTRAP_TOKEN}"}
    if current:
        headers["X-Twine-Credential"] = current
    req = urllib.request.Request(c.url + "/v1/agent/register", method="POST", data=json.dumps(body).encode(),
                                 headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def desired(c, credential: str) -> tuple[int, dict]:
    return c.call("GET", "/v1/agent/desired?version=&wait=0", token=credential)


def test_a_bootstrap_token_cannot_take_a_registered_machine_over(controld, etcd_server):
    c = controld
    status, first = register(c, "m1")
    assert status == 200
    cred1 = first["credential"]
    assert c.call("POST", "/v1/entitlements", {"name": "web", "machine_type": "generic", "quota": 1})[0] == 201
    assert c.call("POST", "/v1/jobs", {"entitlement": "web", "name": "api", "count": 1, "task": TASK})[0] == 201
    assert desired(c, cred1)[1]["tasks"][0]["env"] == {"SECRETISH": "only-for-m1"}

    before = etcd_revision(etcd_server.port)
    status, refused = register(c, "m1")  # the bootstrap token alone: refused, nothing handed over
    assert status == 409 and refused["field"] == "machine_id" and "current credential" in refused["why"], refused
    assert "credential" not in refused and "SECRETISH" not in json.dumps(refused)
    status, refused = register(c, "m1", current="not-its-credential")
    assert status == 409, refused
    assert etcd_revision(etcd_server.port) == before, "a refused registration wrote to etcd"
    assert desired(c, cred1)[0] == 200, "the real agent keeps its credential"

    # its own credential: registered again (a new credential); labels do not move under its task
    status, refused = register(c, "m1", current=cred1, labels={"region": c.region, "dc": "dc2", "msb": "msb1",
                                                               "rack": "r1", "machine_type": "generic"})
    assert status == 409 and refused["field"] == "labels" and "1 task(s) placed" in refused["why"], refused
    status, refused = register(c, "m1", current=cred1, capacity={"cpus": 64, "memory_mb": 4096})
    assert status == 409 and refused["field"] == "capacity", refused
    status, again = register(c, "m1", current=cred1)
    assert status == 200 and again["credential"] != cred1
    assert desired(c, cred1)[0] == 401 and desired(c, again["credential"])[0] == 200

    # a reinstalled host that lost its credential: an admin releases the machine
    assert c.call("POST", "/v1/machines/m9/release")[0] == 404
    status, shown = c.call("POST", "/v1/machines/m1/release")
    assert status == 200 and shown["id"] == "m1", shown
    assert desired(c, again["credential"])[0] == 401, "a released machine's credential no longer holds"
    status, taken = register(c, "m1")
    assert status == 200 and desired(c, taken["credential"])[0] == 200
    assert c.call("POST", "/v1/machines/m1/release", token=BOOTSTRAP_TOKEN)[0] == 401
    assert c.call("GET", "/v1/machines/m1", token=API_TOKEN)[1]["alloc"]["tasks"] == 1, "its task stayed placed"
