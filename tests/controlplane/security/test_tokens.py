"""API tokens with roles (issue #11): admins make, list and revoke them; an owner changes only
the jobs of its entitlements, a reader nothing; every refusal is a 403 naming what is missing;
etcd keeps no secret; every change is in the audit log."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

from controlplane.store import Store
from tests.controlplane.controld_proc import Controld
from tests.controlplane.frontend.test_controld_api import controld, etcd_revision, register  # noqa: F401 - a fixture

TASK = {"image": "twine/busybox:1", "command": ["sleep", "3600"], "cpus": 0.1, "memory_mb": 16}


def etcd_values(port: int, prefix: str) -> list:
    async def go():
        store = Store([("127.0.0.1", port)])
        try:
            return [v.value for v in (await store.range(prefix))[0]]
        finally:
            await store.close()

    return asyncio.run(go())


def test_roles_scope_what_a_token_may_do(tmp_path, etcd_server):
    # machines without agents, kept healthy through the test: a fresh-clone run failed it when the
    # health check failed them (a 2 s timeout's 7 s grace) while the refusals were sent, a write of
    # its own that the test took for one of a refused request's
    c = Controld(tmp_path, etcd_server.port, heartbeat_timeout=120).start()
    try:
        roles_scope(c, etcd_server)
    finally:
        c.close()


def roles_scope(c: Controld, etcd_server) -> None:
    register(c, "m1", "dc1", "msb1", cpus=8)
    register(c, "m2", "dc1", "msb2", cpus=8)
    for name in ("web", "db"):
        assert c.call("POST", "/v1/entitlements", {"name": name, "machine_type": "generic", "quota": 1})[0] == 201
    status, owner = c.call("POST", "/v1/tokens", {"role": "owner", "entitlements": ["web"], "description": "web team"})
    assert status == 201 and owner["token"].startswith(owner["id"] + "."), owner
    reader = c.call("POST", "/v1/tokens", {"role": "reader"})[1]
    short = c.call("POST", "/v1/tokens", {"role": "reader", "expires_in": 1})[1]

    # etcd holds hashes, never a secret; the list shows neither
    stored = json.dumps(etcd_values(etcd_server.port, f"/twine/{c.region}/tokens/"))
    assert owner["token"].split(".")[1] not in stored and "sha256" in stored
    listed = c.call("GET", "/v1/tokens")[1]["tokens"]
    assert {t["id"] for t in listed} == {owner["id"], reader["id"], short["id"]}
    assert all("token" not in t and "sha256" not in t for t in listed)

    job = {"entitlement": "web", "name": "api", "count": 1, "task": TASK}
    assert c.call("POST", "/v1/jobs", job, token=owner["token"])[0] == 201
    theirs = {**job, "entitlement": "db", "name": "theirs"}
    assert c.call("POST", "/v1/jobs", theirs)[0] == 201  # an admin's, in an entitlement the owner does not own
    assert c.call("POST", "/v1/jobs/web/api/resize", {"count": 2}, token=owner["token"])[0] == 200
    before = etcd_revision(etcd_server.port)
    refusals = [
        (owner, "POST", "/v1/jobs", {**job, "entitlement": "db"}, "owner of entitlement db"),
        (owner, "POST", "/v1/entitlements", {"name": "x", "machine_type": "generic", "quota": 1}, "needs admin"),
        (owner, "POST", "/v1/tokens", {"role": "admin"}, "needs admin"),
        (owner, "POST", "/v1/machines/m1/release", None, "needs admin"),
        (owner, "PUT", "/v1/jobs/db/theirs", theirs, "owner of entitlement db"),
        (owner, "POST", "/v1/jobs/db/theirs/resize", {"count": 0}, "owner of entitlement db"),
        (owner, "DELETE", "/v1/jobs/db/theirs", None, "owner of entitlement db"),
        (owner, "PATCH", "/v1/entitlements/web", {"quota": 5}, "needs admin"),
        (owner, "POST", "/v1/entitlements/web/move", {"shard": 0}, "needs admin"),
        (owner, "POST", "/v1/maintenance", {"machines": ["m1"], "start": time.time() + 60, "duration": 60},
         "needs admin"),
        (owner, "POST", "/v1/machines/m1/clean", None, "needs admin"),
        (owner, "POST", "/v1/internal/relay", {"from": "x"}, "needs admin"),
        (reader, "DELETE", "/v1/jobs/web/api", None, "needs owner or admin"),
        (reader, "POST", "/v1/maintenance", {"machines": ["m1"], "start": time.time() + 60, "duration": 60},
         "needs admin"),
        (reader, "POST", "/v1/entitlements", {"name": "x", "machine_type": "generic", "quota": 1}, "needs admin"),
        (reader, "POST", "/v1/tokens", {"role": "admin"}, "needs admin"),
    ]
    for who, method, path, body, needs in refusals:
        status, answer = c.call(method, path, body, token=who["token"])
        assert status == 403 and answer["error"] == "forbidden" and needs in answer["why"], (path, answer)
        assert f"token {who['id']}" in answer["why"]
    assert etcd_revision(etcd_server.port) == before, "a refused request wrote to etcd"
    for who in (owner, reader):
        assert c.call("GET", "/v1/jobs/web/api", token=who["token"])[0] == 200
        assert c.call("GET", "/v1/machines", token=who["token"])[0] == 200

    # expired, revoked, forged: 401
    time.sleep(1.2)
    assert c.call("GET", "/v1/jobs", token=short["token"])[0] == 401
    assert c.call("GET", "/v1/jobs", token=owner["id"] + ".forged")[0] == 401
    assert c.call("DELETE", f"/v1/tokens/{owner['id']}", token=reader["token"])[0] == 403
    assert c.call("DELETE", f"/v1/tokens/{owner['id']}")[0] == 200
    assert c.call("GET", "/v1/jobs", token=owner["token"])[0] == 401
    assert c.call("DELETE", "/v1/tokens/000000000000")[0] == 404

    bad = [({"role": "root"}, 400, "role"), ({"role": "owner"}, 422, "entitlements"),
           ({"role": "reader", "entitlements": ["web"]}, 422, "entitlements"),
           ({"role": "reader", "expires_in": -5}, 400, "expires_in"), ({"role": "reader", "x": 1}, 400, "x")]
    for spec, code, field in bad:
        status, answer = c.call("POST", "/v1/tokens", spec)
        assert status == code and answer["field"] == field, answer

    audit = [line for line in c.log.read_text().splitlines() if "twine.audit" in line]
    assert any(f"token {owner['id']} POST /v1/jobs -> 201" in line for line in audit), audit
    assert any(f"token {owner['id']} POST /v1/entitlements -> 403" in line for line in audit), audit
    assert any("api-token-file DELETE /v1/tokens/" in line and "-> 200" in line for line in audit), audit
    assert not any("/v1/agent/heartbeat" in line for line in audit)


def test_twinectl_makes_lists_and_revokes_tokens(controld):
    c = controld
    base = [sys.executable, "-m", "controlplane.cli.twinectl", "--url", c.url, "--token"]

    def ctl(token: str, *argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([*base, token, *argv], capture_output=True, text=True, timeout=60)

    from tests.controlplane.controld_proc import API_TOKEN
    made = ctl(API_TOKEN, "token", "create", "--role", "reader", "--expires", "1h", "--description", "dashboards")
    assert made.returncode == 0, made.stderr
    secret = made.stdout.splitlines()[1]
    token_id = secret.split(".")[0]
    assert "shown this once" in made.stdout
    listed = ctl(API_TOKEN, "token", "list")
    assert token_id in listed.stdout and "reader" in listed.stdout and secret not in listed.stdout
    assert ctl(secret, "job", "list").returncode == 0
    denied = ctl(secret, "token", "list")
    assert denied.returncode == 4 and "needs admin" in denied.stderr, denied
    assert ctl(API_TOKEN, "token", "revoke", token_id).returncode == 0
    assert ctl(secret, "job", "list").returncode == 4


def test_bootstrap_tokens_made_by_an_admin_register_machines_only_and_expire(controld, etcd_server):
    c = controld

    def reg(mid: str, token: str) -> tuple[int, dict]:
        return c.call("POST", "/v1/agent/register", {
            "machine_id": mid, "hostname": mid, "address": "10.0.0.9",
            "labels": {"region": c.region, "dc": "dc1", "msb": "msb1", "rack": "r1", "machine_type": "generic"},
            "capacity": {"cpus": 2, "memory_mb": 2048}}, token=token)

    status, day = c.call("POST", "/v1/tokens", {"role": "bootstrap", "description": "rack 7 install"})
    assert status == 201 and day["role"] == "bootstrap", day
    assert 86400 - 60 < day["expires"] - day["created_at"] <= 86400  # expires though nobody said when
    short = c.call("POST", "/v1/tokens", {"role": "bootstrap", "expires_in": 1})[1]
    reader = c.call("POST", "/v1/tokens", {"role": "reader"})[1]

    status, answer = reg("m7", day["token"])
    assert status == 200 and answer["credential"], answer
    assert c.call("GET", "/v1/machines/m7")[1]["id"] == "m7"
    # nothing else: not even a read
    before = etcd_revision(etcd_server.port)
    for method, path, body in (("GET", "/v1/machines", None), ("POST", "/v1/tokens", {"role": "admin"}),
                               ("POST", "/v1/entitlements", {"name": "x", "machine_type": "generic", "quota": 1})):
        status, answer = c.call(method, path, body, token=day["token"])
        assert status == 403 and "a bootstrap token only registers machines" in answer["why"], (path, answer)
    # an API token of another role does not register machines
    assert reg("m8", reader["token"])[0] == 401
    assert etcd_revision(etcd_server.port) == before
    time.sleep(1.2)
    assert reg("m9", short["token"])[0] == 401, "an expired bootstrap token"
    assert c.call("DELETE", f"/v1/tokens/{day['id']}")[0] == 200
    assert reg("m10", day["token"])[0] == 401, "a revoked bootstrap token"
    assert "m9" not in {m["id"] for m in c.call("GET", "/v1/machines")[1]["machines"]}
    # the audit log names the token that registered a machine, and says who was refused
    audit = [line for line in c.log.read_text().splitlines() if "twine.audit" in line]
    assert any(f"token {day['id']} POST /v1/agent/register -> 200" in line for line in audit), audit
    assert any("unauthenticated POST /v1/agent/register -> 401" in line for line in audit), audit


def test_the_hosts_network_is_for_entitlements_an_admin_allowed_it(controld, etcd_server):
    c = controld
    register(c, "m1", "dc1", "msb1", cpus=8)
    assert c.call("POST", "/v1/entitlements", {"name": "web", "machine_type": "generic", "quota": 1})[0] == 201
    owner = c.call("POST", "/v1/tokens", {"role": "owner", "entitlements": ["web"]})[1]
    host = {"entitlement": "web", "name": "lb", "count": 1, "task": {**TASK, "network_mode": "host"}}
    before = etcd_revision(etcd_server.port)
    status, answer = c.call("POST", "/v1/jobs", host, token=owner["token"])
    assert status == 403 and answer["field"] == "task.network_mode" and "allow_host_network" in answer["why"], answer
    # the owner may not give itself the policy; an admin may
    assert c.call("PATCH", "/v1/entitlements/web", {"allow_host_network": True}, token=owner["token"])[0] == 403
    assert etcd_revision(etcd_server.port) == before
    status, ent = c.call("PATCH", "/v1/entitlements/web", {"allow_host_network": True})
    assert status == 200 and ent["allow_host_network"] is True, ent
    status, job = c.call("POST", "/v1/jobs", host, token=owner["token"])
    assert status == 201 and job["task"]["network_mode"] == "host", job
