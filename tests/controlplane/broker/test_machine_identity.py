"""A bootstrap token registers machine ids that do not exist; an existing id is registered again
only with its current credential or after an admin's release (issue #11: the bootstrap token took
a live machine over, its desired state and task environment included). Labels and capacity do not
change under placed tasks."""

from __future__ import annotations

import json
import urllib.request

from tests.controlplane.controld_proc import API_TOKEN, BOOTSTRAP_TOKEN
from tests.controlplane.frontend.test_controld_api import controld, etcd_revision  # noqa: F401 - a fixture

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


def test_the_bootstrap_token_files_tokens_expire_and_a_new_file_is_read_without_a_restart(tmp_path, etcd_server):
    """Kubernetes' bootstrap tokens expire: those of --bootstrap-token-file now do too, a TTL after
    the file was written. An expired one registers nothing (and writes nothing); writing the file
    anew renews them without a restart; a file others may read admits nothing."""
    import os
    import time

    from tests.controlplane.controld_proc import Controld
    from tests.controlplane.frontend.test_controld_api import etcd_revision as revision

    c = Controld(tmp_path, etcd_server.port, extra=("--bootstrap-token-ttl", "600")).start()
    try:
        def reg(mid: str, token: str) -> tuple[int, dict]:
            return c.call("POST", "/v1/agent/register", {
                "machine_id": mid, "hostname": mid, "address": "",
                "labels": {"region": c.region, "dc": "dc1", "msb": "msb1", "rack": "r1", "machine_type": "generic"},
                "capacity": {"cpus": 4, "memory_mb": 4096}}, token=token)

        assert reg("m1", BOOTSTRAP_TOKEN)[0] == 200
        written = time.time() - 601  # the file as if written 601 s ago: past its TTL
        os.utime(c.boot_file, (written, written))
        before = revision(etcd_server.port)
        status, body = reg("m2", BOOTSTRAP_TOKEN)
        assert status == 401 and body["error"] == "unauthorized", body
        assert revision(etcd_server.port) == before, "an expired token writes nothing"
        log = c.log.read_text()
        assert "--bootstrap-token-file" in log and "expired at" in log and "write new tokens into it" in log

        c.boot_file.write_text("a-new-bootstrap-token\n")  # renewed: read again, no restart
        assert reg("m2", "a-new-bootstrap-token")[0] == 200
        assert reg("m3", BOOTSTRAP_TOKEN)[0] == 401, "the old token is gone with the old file"
        c.boot_file.chmod(0o644)
        assert reg("m3", "a-new-bootstrap-token")[0] == 401, "a file others may read admits nothing"
        assert "lets others than its owner read or write it" in c.log.read_text()
        c.boot_file.chmod(0o600)
        assert reg("m3", "a-new-bootstrap-token")[0] == 200
        assert {m["id"] for m in c.call("GET", "/v1/machines")[1]["machines"]} == {"m1", "m2", "m3"}
    finally:
        c.close()


def test_a_bootstrap_token_ttl_of_zero_never_expires_and_a_bad_one_is_refused(tmp_path, etcd_server):
    import os
    import subprocess
    import sys
    import time

    from tests.agent.agentproc import REPO
    from tests.controlplane.controld_proc import Controld

    c = Controld(tmp_path, etcd_server.port, extra=("--bootstrap-token-ttl", "0"))
    month = time.time() - 30 * 86400
    os.utime(c.boot_file, (month, month))
    c.start()
    try:
        status, _ = c.call("POST", "/v1/agent/register", {
            "machine_id": "m1", "hostname": "m1", "address": "",
            "labels": {"region": c.region, "dc": "dc1", "msb": "msb1", "rack": "r1", "machine_type": "generic"},
            "capacity": {"cpus": 4, "memory_mb": 4096}}, token=BOOTSTRAP_TOKEN)
        assert status == 200
    finally:
        c.close()
    for bad in ("-1", "soon", "inf"):
        r = subprocess.run([sys.executable, "-m", "controlplane.daemon", "--etcd", f"127.0.0.1:{etcd_server.port}",
                            "--api-token-file", str(c.api_file), "--bootstrap-token-ttl", bad],
                           capture_output=True, text=True, cwd=REPO, timeout=30)
        assert r.returncode == 2 and "--bootstrap-token-ttl" in r.stderr and repr(bad) in r.stderr, (bad, r.stderr)
