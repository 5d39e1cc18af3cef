"""Requests that once took the control plane down or gave a 500 (issue #11): each is a 4xx naming
what is wrong, writes nothing to etcd, and the daemon goes on answering."""

from __future__ import annotations

import json
import urllib.request

from controlplane.store.etcdproc import EtcdServer
from tests.controlplane.controld_proc import API_TOKEN, BOOTSTRAP_TOKEN, Controld
from tests.controlplane.frontend.test_controld_api import controld, etcd_revision, register  # noqa: F401 - a fixture

TASK = {"image": "twine/busybox:1", "command": ["sleep", "3600"], "cpus": 0.1, "memory_mb": 16}


def raw_call(c, method: str, path: str, data: bytes, token: str = API_TOKEN, headers: dict | None = None):
    req = urllib.request.Request(c.url + path, method=method, data=data,
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}",
                                          **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read()), r.headers
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read()), e.headers


def test_oversized_and_malformed_requests_are_refused_naming_the_field(controld, etcd_server):
    c = controld
    register(c, "m1", "dc1", "msb1")
    assert c.call("POST", "/v1/entitlements", {"name": "web", "machine_type": "generic", "quota": 1})[0] == 201
    before = etcd_revision(etcd_server.port)
    job = {"entitlement": "web", "name": "big", "count": 1, "task": TASK}
    reg = {"machine_id": "m9", "hostname": "m9", "labels": {"region": c.region, "dc": "dc1", "msb": "msb1",
           "rack": "r1", "machine_type": "generic"}, "capacity": {"cpus": 2, "memory_mb": 2048}}
    cases = [
        # a 3 MB environment value: past the body limit, before it is read whole
        ("POST", "/v1/jobs", json.dumps({**job, "task": {**TASK, "env": {"X": "x" * 3_000_000}}}).encode(),
         API_TOKEN, 413, "body"),
        # under the body limit, over a task's environment limit
        ("POST", "/v1/jobs", json.dumps({**job, "task": {**TASK, "env": {"X": "x" * 900_000}}}).encode(),
         API_TOKEN, 400, "task.env"),
        ("POST", "/v1/jobs", json.dumps({**job, "task": {**TASK, "command": ["a"] * 2000}}).encode(),
         API_TOKEN, 400, "task.command"),
        ("POST", "/v1/jobs", json.dumps({**job, "count": 10_001}).encode(), API_TOKEN, 400, "count"),
        # a task on the host's network would reach the region's etcd: not unless the entitlement allows it
        ("POST", "/v1/jobs", json.dumps({**job, "task": {**TASK, "network_mode": "host"}}).encode(), API_TOKEN, 403,
         "task.network_mode"),
        # each task's record carries the template: 2,000 x 60 KB would put 120 MB in the store
        ("POST", "/v1/jobs", json.dumps({**job, "count": 2000, "task": {**TASK, "env": {"X": "x" * 60_000}}}).encode(),
         API_TOKEN, 422, "count"),
        ("POST", "/v1/jobs", b"[" * 100_000 + b"]" * 100_000, API_TOKEN, 400, "body"),
        ("POST", "/v1/jobs", b'{"entitlement": "web", "name": "n", "count": ' + b"9" * 5000 + b"}", API_TOKEN, 400, "body"),
        ("POST", "/v1/entitlements", json.dumps({"name": "own", "machine_type": "generic", "quota": 1,
                                                 "owner": "o" * 1_500_000}).encode(), API_TOKEN, 413, "body"),
        ("POST", "/v1/entitlements", json.dumps({"name": "own", "machine_type": "generic", "quota": 1,
                                                 "owner": "o" * 300}).encode(), API_TOKEN, 400, "owner"),
        # a profile is a name, never a path: no file on the daemon's host is looked at
        ("POST", "/v1/entitlements", json.dumps({"name": "p", "machine_type": "generic", "quota": 1,
                                                 "profile": "/bin/true"}).encode(), API_TOKEN, 400, "profile"),
        ("POST", "/v1/agent/register", json.dumps(reg).replace('"cpus": 2', '"cpus": Infinity').encode(),
         BOOTSTRAP_TOKEN, 400, "body"),
        ("POST", "/v1/agent/register", json.dumps({**reg, "capacity": {"cpus": 1e9, "memory_mb": 2048}}).encode(),
         BOOTSTRAP_TOKEN, 400, "capacity.cpus"),
        ("POST", "/v1/agent/register", json.dumps({**reg, "capacity": {"cpus": 2, "memory_mb": 2048, "gpus": "x" * 1000}}).encode(),
         BOOTSTRAP_TOKEN, 400, "capacity.gpus"),
        ("POST", "/v1/agent/register", json.dumps({**reg, "hostname": "h" * 1000}).encode(), BOOTSTRAP_TOKEN, 400, "hostname"),
        ("POST", "/v1/agent/register", json.dumps({**reg, "labels": {**reg["labels"], "rack": "r" * 1000}}).encode(),
         BOOTSTRAP_TOKEN, 400, "labels.rack"),
        # a name or an image with a newline at its end ($ in Python's regular expressions allows one)
        ("POST", "/v1/entitlements", json.dumps({"name": "nl\n", "machine_type": "generic", "quota": 1}).encode(),
         API_TOKEN, 400, "name"),
        ("POST", "/v1/jobs", json.dumps({**job, "name": "nl\n"}).encode(), API_TOKEN, 400, "name"),
        ("POST", "/v1/jobs", json.dumps({**job, "task": {**TASK, "image": "busybox\n"}}).encode(), API_TOKEN, 400,
         "task.image"),
        ("POST", "/v1/jobs", json.dumps({**job, "task": {**TASK, "env": {"NL\n": "x"}}}).encode(), API_TOKEN, 400,
         "task.env.NL\n"),
        ("POST", "/v1/agent/register", json.dumps({**reg, "machine_id": "m9\n"}).encode(), BOOTSTRAP_TOKEN, 400,
         "machine_id"),
        # a replica's relay is decoded straight into its schema: a wrong shape is named, not a 500
        ("POST", "/v1/internal/relay", json.dumps({"from": "b", "seen": "m1"}).encode(), API_TOKEN, 400, "seen"),
        ("POST", "/v1/internal/relay", json.dumps({"from": "b", "reports": {"m1": {"tasks": 5}}}).encode(), API_TOKEN,
         400, "reports[...].tasks"),
        # a token with characters beyond ASCII: refused as any wrong token, before authentication decides
        ("GET", "/v1/jobs", None, "t\u00f6ken", 401, None),
        ("POST", "/v1/agent/heartbeat", b"{}", "cr\u00e9dential", 401, None),
    ]
    for method, path, data, token, want, field in cases:
        status, answer, _ = raw_call(c, method, path, data, token)
        assert status == want, (path, (data or b"")[:100], answer)
        assert answer["field"] == field and answer["why"], answer
        assert len(json.dumps(answer)) < 2000, "an error does not echo a huge value back"
    status, answer, headers = raw_call(c, "DELETE", "/v1/cluster", None)
    assert status == 405 and headers["Allow"] == "GET", (answer, dict(headers))
    assert etcd_revision(etcd_server.port) == before, "a refused request wrote to etcd"
    assert c.call("GET", "/healthz", token=None)[0] == 200
    assert c.call("POST", "/v1/jobs", {**job, "task": {**TASK, "env": {"X": "x" * 60_000}}})[0] == 201, \
        "a task within the limits is taken"


def test_a_job_of_large_tasks_is_committed_in_batches_that_fit_etcds_default_request_size(tmp_path):
    """30 tasks with a 60 KB environment and a 60 KB command each: 3.6 MB of task records, and the
    24 tasks a batch of etcd's default 128 operations holds are 2.9 MB, more than its default
    1.5 MiB a request: batches are bounded by bytes as well as by operations."""
    etcd = EtcdServer(raised_limits=False).start()
    c = Controld(tmp_path, etcd.port)
    try:
        c.start()
        for i in range(4):
            register(c, f"m{i}", f"dc{i % 2}", f"msb{i}", cpus=16, memory_mb=16384)
        assert c.call("POST", "/v1/entitlements", {"name": "big", "machine_type": "generic", "quota": 4})[0] == 201
        status, answer = c.call("POST", "/v1/jobs", {"entitlement": "big", "name": "env", "count": 30,
                                                    "task": {**TASK, "env": {"X": "x" * 60_000},
                                                             "command": ["echo", "y" * 60_000]}})
        assert status == 201, answer
        job = c.wait_for("/v1/jobs/big/env", lambda j: len(j["tasks"]) == 30 and all(t["machine"] for t in j["tasks"]),
                         what="30 tasks placed")
        assert len(job["tasks"]) == 30
        assert c.metric("twine_scheduler_batches_total") >= 2
    finally:
        c.close()
        etcd.stop()


def test_bodies_that_are_not_utf8_are_a_400_naming_the_body(controld, etcd_server):
    """JSON is UTF-8 (RFC 8259): a body in another encoding, whatever charset its Content-Type
    claims, is malformed JSON, not a 500 (issue #24: UnicodeDecodeError in controld's log)."""
    c = controld
    cred = register(c, "m1", "dc1", "msb1")
    assert c.call("POST", "/v1/entitlements", {"name": "web", "machine_type": "generic", "quota": 1})[0] == 201
    before = etcd_revision(etcd_server.port)
    job = json.dumps({"entitlement": "web", "name": "caf\u00e9", "count": 1, "task": TASK}, ensure_ascii=False)
    latin1 = {"Content-Type": "application/json; charset=latin-1"}
    cases = [
        ("POST", "/v1/jobs", job.encode("latin-1"), API_TOKEN, {}),
        ("POST", "/v1/jobs", job.encode("latin-1"), API_TOKEN, latin1),
        ("POST", "/v1/jobs", b'{"entitlement": "web", "name": "\xff\xfe", "count": 1}', API_TOKEN, {}),
        ("POST", "/v1/tokens", '{"role": "reader", "description": "\u00e9t\u00e9"}'.encode("utf-16"), API_TOKEN, {}),
        ("POST", "/v1/entitlements", '{"name": "w", "owner": "J\u00fcrgen"}'.encode("latin-1"), API_TOKEN, latin1),
        ("POST", "/v1/agent/heartbeat", '{"machine_id": "m\u00e9"}'.encode("latin-1"), cred, latin1),
    ]
    for method, path, data, token, headers in cases:
        status, answer, _ = raw_call(c, method, path, data, token, headers)
        assert (status, answer["error"], answer["field"]) == (400, "invalid", "body"), (path, data[:60], answer)
    assert etcd_revision(etcd_server.port) == before, "a refused request wrote to etcd"
    log = c.log.read_text()
    assert "UnicodeDecodeError" not in log and "Traceback" not in log, log[-2000:]
