"""Group commit: creates that reach a shard's leader while a transaction is in flight go together
into the next one. Each create in a batch is placed on the snapshot as the ones before it left it,
so a batch never gives two jobs the same room or a quota twice; a create that cannot be placed is
answered alone, and the rest of its batch lands."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from tests.controlplane.controld_proc import Controld
from tests.controlplane.frontend.test_controld_api import register

TASK = {"image": "twine/busybox:1", "command": ["sleep", "3600"], "cpus": 1, "memory_mb": 64}


def create_all(c: Controld, specs: list[dict]) -> list[tuple[int, dict]]:
    with ThreadPoolExecutor(len(specs)) as pool:
        return list(pool.map(lambda s: c.call("POST", "/v1/jobs", s), specs))


def test_concurrent_creates_share_transactions_and_never_overcommit(tmp_path, etcd_server):
    c = Controld(tmp_path, etcd_server.port).start()
    try:
        for i in range(6):
            register(c, f"m{i}", f"dc{i % 2}", f"msb{i}", cpus=4, memory_mb=4096)
        # "one" may hold one machine: 4 tasks of 1 cpu fit, the fifth and sixth are over its quota
        assert c.call("POST", "/v1/entitlements", {"name": "one", "machine_type": "generic", "quota": 1})[0] == 201
        assert c.call("POST", "/v1/entitlements", {"name": "many", "machine_type": "generic", "quota": 5})[0] == 201
        commits_before = c.metric("twine_scheduler_commits_total")

        specs = [{"entitlement": "one", "name": f"s{i}", "count": 1, "task": TASK} for i in range(6)]
        specs += [{"entitlement": "many", "name": f"w{i}", "count": 2, "task": TASK} for i in range(8)]
        specs += [{"entitlement": "many", "name": "twice", "count": 1, "task": TASK}] * 2
        answers = create_all(c, specs)

        ones = [status for (status, _), s in zip(answers, specs) if s["entitlement"] == "one"]
        assert sorted(ones) == [201] * 4 + [422] * 2, answers
        refused = [body for (status, body), s in zip(answers, specs) if s["entitlement"] == "one" and status != 201]
        assert all(b["error"] == "quota" and "quota of 1 machines" in b["why"] for b in refused), refused
        assert all(status == 201 for (status, _), s in zip(answers, specs) if s["name"].startswith("w")), answers
        # the same job twice at once: one create, one refusal, whichever batch each fell into
        twice = sorted(status for (status, _), s in zip(answers, specs) if s["name"] == "twice")
        assert twice == [201, 409], answers

        created = sum(1 for status, _ in answers if status == 201)
        commits = c.metric("twine_scheduler_commits_total") - commits_before
        assert commits < created, f"{created} creates in {commits:.0f} transactions: none shared one"

        # what etcd holds adds up: each machine's counters are the tasks on it, none overfull
        on: dict[str, int] = {}
        for j in c.call("GET", "/v1/jobs")[1]["jobs"]:
            for t in c.call("GET", f"/v1/jobs/{j['entitlement']}/{j['name']}")[1]["tasks"]:
                on[t["machine"]] = on.get(t["machine"], 0) + 1
        machines = {m["id"]: m for m in c.call("GET", "/v1/machines")[1]["machines"]}
        assert sum(on.values()) == 4 + 16 + 1
        for mid, m in machines.items():
            assert m["alloc"]["tasks"] == on.get(mid, 0), (mid, m["alloc"], on)
            assert m["alloc"]["cpus"] <= 4, m
        assert sum(1 for m in machines.values() if m["entitlement"] == "one") == 1
        assert all(machines[mid]["entitlement"] is not None for mid in on)
    finally:
        c.close()
