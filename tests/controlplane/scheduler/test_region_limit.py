"""The region's rate limit holds across shards (issue #24): the region bucket is one etcd record,
read and written in the transaction of the destructive change it pays for, guarded by the
revision it was read at. Two shards led by two processes stop tasks; the stops they make together
never exceed the region's burst (before, each spent from the bucket as it was at its election:
8 stops on a burst of 4)."""

from __future__ import annotations

import time

from tests.controlplane.controld_proc import wait
from tests.controlplane.coordination.test_replicas_chaos import TASK, member, replicas, tasks_at, updated
from tests.controlplane.frontend.test_controld_api import register
from tests.controlplane.simagents import SimAgents

BURST = 4
# the region bucket barely refills (one token in 1000 s); job and shard buckets never bind
LIMITS = ("--rate-limits", f"job=1000:1000,shard=1000:1000,region=0.001:{BURST}")


def stopped(c, handle: str, count: int) -> int:
    """Tasks of the job beyond `count` that are stopping, stopped or gone."""
    present = [t for t in tasks_at(c, handle) if t["index"] >= count and t["state"] not in ("stopping", "stopped")]
    return 6 - count - len(present)


def test_two_shards_in_two_processes_share_the_region_bucket(tmp_path, etcd_server):
    cs = replicas(tmp_path, etcd_server.port, 2, ("--shard-count", "2", "--shards", "0", *LIMITS),
                  ("--shards", "1", *LIMITS))
    try:
        a, b = cs[0].start(wait_led=False), cs[1].start()
        wait(lambda: [s["leader"] for s in a.cluster()["shards"]] == [member(a), member(b)], 10, "one shard each")
        creds = {f"m{i}": register(a, f"m{i}", "dc1", f"msb{i}", cpus=2, memory_mb=2048) for i in range(6)}
        with SimAgents(creds, [a.url, b.url], interval=0.2):
            for name in ("east", "west"):
                status, ent = a.call("POST", "/v1/entitlements", {"name": name, "machine_type": "generic", "quota": 3})
                assert status == 201, ent
            shards = {name: a.call("GET", f"/v1/entitlements/{name}")[1]["shard"] for name in ("east", "west")}
            if shards["east"] == shards["west"]:  # one in each shard
                assert a.call("POST", "/v1/entitlements/west/move", {"shard": 1 - shards["east"]})[0] == 200
            for name in ("east", "west"):
                spec = {"entitlement": name, "name": "api", "count": 6, "task": TASK}
                assert a.call("POST", "/v1/jobs", spec)[0] == 201
            wait(lambda: updated(a, "east/api", 1, 6) and updated(a, "west/api", 1, 6), 30, "12 tasks running")
            # east spends the region's burst; then west, whose leader read the region's bucket full
            # when it was elected, asks for as many stops: they are held, not done
            assert a.call("POST", "/v1/jobs/east/api/resize", {"count": 1})[0] == 200
            wait(lambda: stopped(a, "east/api", 1) >= BURST, 20, "the burst spent by east")
            assert a.call("POST", "/v1/jobs/west/api/resize", {"count": 1})[0] == 200
            time.sleep(3.0)  # both shards keep trying: any stop past the burst would happen now
            done = {name: stopped(a, f"{name}/api", 1) for name in ("east", "west")}
            print(f"\nstops done with a region burst of {BURST}: {done}")
            assert done == {"east": BURST, "west": 0}, done
            for name in ("east", "west"):
                _, job = a.call("GET", f"/v1/jobs/{name}/api")  # answered by the leader of its shard
                assert "held by the region rate limit" in job["message"], (name, job["message"])
    finally:
        for c in cs:
            c.close()
