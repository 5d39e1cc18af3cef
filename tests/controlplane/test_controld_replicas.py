"""Two twine-controld replicas on one region race to place jobs on the same machines: every
placement is one etcd transaction guarded by the machines' mod revisions, so the loser re-reads and
places again. No machine is ever given more than its capacity, and no quota is overrun."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from tests.controlplane.controld_proc import Controld
from tests.controlplane.test_controld_api import register

TASK = {"image": "twine/busybox:1", "command": ["sleep", "3600"], "cpus": 0.25, "memory_mb": 16}


def test_two_replicas_racing_never_overcommit_a_machine(tmp_path, etcd_server):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = Controld(tmp_path / "a", etcd_server.port, heartbeat_timeout=120).start()
    b = Controld(tmp_path / "b", etcd_server.port, heartbeat_timeout=120, region=a.region).start()
    try:
        for i in range(4):  # 4 machines x 1 cpu = 16 tasks of 0.25
            register(a, f"m{i}", f"dc{i % 2}", f"msb{i}", cpus=1, memory_mb=1024)
        assert a.call("POST", "/v1/entitlements", {"name": "web", "machine_type": "generic", "quota": 4})[0] == 201
        b.wait_for("/v1/entitlements/web", lambda e: e["name"] == "web")

        def create(i: int) -> int:
            replica = (a, b)[i % 2]
            return replica.call("POST", "/v1/jobs", {"entitlement": "web", "name": f"j{i}", "count": 1, "task": TASK})[0]

        with ThreadPoolExecutor(8) as pool:
            statuses = list(pool.map(create, range(24)))
        assert sorted(statuses) == [201] * 16 + [422] * 8, statuses
        machines = a.call("GET", "/v1/machines")[1]["machines"]
        assert all(m["alloc"]["cpus"] <= 1.0 for m in machines), [m["alloc"] for m in machines]
        assert sum(m["alloc"]["tasks"] for m in machines) == 16
        jobs = a.call("GET", "/v1/jobs")[1]["jobs"]
        per_machine: dict[str, int] = {}
        for j in jobs:
            for t in a.call("GET", f"/v1/jobs/{j['handle']}")[1]["tasks"]:
                per_machine[t["machine"]] = per_machine.get(t["machine"], 0) + 1
        assert sorted(per_machine.values()) == [4, 4, 4, 4]
        conflicts = int(sum(c.metric("twine_scheduler_conflicts_total") for c in (a, b)))
        print(f"\n24 racing job creations on two replicas: 16 placed, 8 refused, {conflicts} conflict(s) retried")
    finally:
        a.close()
        b.close()

