"""A job far larger than one etcd transaction at etcd's default limits (128 operations): created,
shrunk and stopped in bounded batches, with the job record as the recorded intent."""

from __future__ import annotations

import time

from controlplane.store.etcdproc import EtcdServer
from tests.controlplane.controld_proc import Controld
from tests.controlplane.simagents import SimAgents
from tests.controlplane.frontend.test_controld_api import register

TASK = {"image": "twine/busybox:1", "command": ["sleep", "3600"], "cpus": 0.25, "memory_mb": 16}


def test_a_300_task_job_on_an_etcd_with_default_limits(tmp_path):
    etcd = EtcdServer(raised_limits=False).start()
    c = Controld(tmp_path, etcd.port, heartbeat_timeout=600,  # the shrink's 290 stops, not paced here
                 extra=("--rate-limits", "job=1000:1000,shard=1000:1000,region=1000:1000"))
    try:
        c.start()
        creds = {f"m{i}": register(c, f"m{i}", f"dc{i % 2}", f"msb{i}", cpus=8, memory_mb=8192) for i in range(10)}
        agents = SimAgents(creds, [c.url], interval=0.3).__enter__()
        assert c.call("POST", "/v1/entitlements", {"name": "big", "machine_type": "generic", "quota": 10})[0] == 201
        t0 = time.monotonic()
        status, job = c.call("POST", "/v1/jobs", {"entitlement": "big", "name": "wide", "count": 300, "task": TASK})
        assert status == 201, job
        job = c.wait_for("/v1/jobs/big/wide", lambda j: len(j["tasks"]) == 300 and all(t["machine"] for t in j["tasks"]),
                         what="300 tasks placed")
        c.wait_for("/v1/jobs/big/wide", lambda j: j["summary"] == {"running": 300}, what="300 running (simulated agents)")
        print(f"\n300-task job committed in batches at etcd's default limits in {time.monotonic() - t0:.2f}s")
        machines = c.call("GET", "/v1/machines")[1]["machines"]
        assert sum(m["alloc"]["tasks"] for m in machines) == 300
        assert all(m["alloc"]["cpus"] <= 8 for m in machines)
        batches = c.metric("twine_scheduler_batches_total")
        assert batches >= 300 // 24, batches
        assert c.call("POST", "/v1/jobs/big/wide/resize", {"count": 10})[0] == 200
        c.wait_for("/v1/jobs/big/wide", lambda j: len(j["tasks"]) == 10, what="shrunk to 10")
        assert c.call("DELETE", "/v1/jobs/big/wide")[0] == 202
        c.wait_for("/v1/jobs/big/wide", lambda j: j["state"] == "stopped" and all(t["machine"] is None for t in j["tasks"]), what="stopped")
        machines = c.call("GET", "/v1/machines")[1]["machines"]
        assert all(m["alloc"]["tasks"] == 0 and m["entitlement"] is None for m in machines), machines
        agents.__exit__(None, None, None)
        assert agents.restarts() == {"started_again": {}, "on_two_machines": {}}
    finally:
        c.close()
        etcd.stop()
