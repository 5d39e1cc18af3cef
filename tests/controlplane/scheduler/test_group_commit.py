"""Group commit: creates that reach a shard's leader while a transaction is in flight go together
into the next one. Each create in a batch is placed on the snapshot as the ones before it left it,
so a batch never gives two jobs the same room or a quota twice; a create that cannot be placed is
answered alone, and the rest of its batch lands."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from controlplane.store import Store
from controlplane.store.keys import Keys
from tests.controlplane.controld_proc import Controld
from tests.controlplane.simagents import SimAgents
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


def machine_revision(c: Controld, port: int, mid: str) -> int:
    """The mod revision of the machine's record in etcd (read there, not through the daemon)."""
    async def read() -> int:
        store = Store([("127.0.0.1", port)])
        try:
            return (await store.read(Keys(c.region).machine(mid))).mod_revision
        finally:
            await store.close()
    return asyncio.run(read())


def test_a_placement_guards_its_machines_and_rewrites_only_those_that_change_hands(tmp_path, etcd_server):
    """Issue #38: what a machine's tasks hold is theirs to say (RegionState.allocated sums it in
    every view); a placement on a machine its entitlement holds guards the machine's record and
    does not rewrite it. Taking a machine from the free pool, and giving it back, still does. The
    guard and the shard's one-commit-at-a-time keep the machine from being overfilled all the same."""
    c = Controld(tmp_path, etcd_server.port, heartbeat_timeout=600)
    agents = None
    try:
        c.start()
        creds = {mid: register(c, mid, f"dc{i}", f"msb{i}", cpus=4, memory_mb=4096) for i, mid in enumerate(("m0", "m1"))}
        agents = SimAgents(creds, [c.url], interval=0.3).__enter__()
        assert c.call("POST", "/v1/entitlements", {"name": "one", "machine_type": "generic", "quota": 1})[0] == 201
        assert c.call("POST", "/v1/jobs", {"entitlement": "one", "name": "a", "count": 1, "task": TASK})[0] == 201
        # running: its agent has reported the machine's profile for the entitlement (a report that
        # differs from the record rewrites it), so that what follows changes the record only if a
        # placement does
        a = c.wait_for("/v1/jobs/one/a", lambda j: j["summary"] == {"running": 1}, what="a running")
        mid = a["tasks"][0]["machine"]
        taken = machine_revision(c, etcd_server.port, mid)
        # the quota holds it to that machine: these go there too, its record left as it is
        assert [s for s, _ in create_all(c, [{"entitlement": "one", "name": n, "count": 1, "task": TASK}
                                             for n in ("b", "c")])] == [201, 201]
        assert machine_revision(c, etcd_server.port, mid) == taken, "placed on, not rewritten"
        m = c.call("GET", f"/v1/machines/{mid}")[1]
        assert (m["entitlement"], m["alloc"]) == ("one", {"tasks": 3, "cpus": 3.0, "memory_mb": 192}), m
        # full but for one cpu: two more do not fit (the quota keeps them off the other machine)
        status, body = c.call("POST", "/v1/jobs", {"entitlement": "one", "name": "d", "count": 2, "task": TASK})
        assert status == 422, body
        assert c.call("GET", f"/v1/machines/{mid}")[1]["alloc"]["tasks"] == 3
        # a restarted daemon sums the same from the tasks it reads
        c.close()
        c.start()
        assert c.call("GET", f"/v1/machines/{mid}")[1]["alloc"] == {"tasks": 3, "cpus": 3.0, "memory_mb": 192}
        for n in ("a", "b", "c"):
            assert c.call("DELETE", f"/v1/jobs/one/{n}")[0] == 202
            c.wait_for(f"/v1/jobs/one/{n}", lambda j: j["state"] == "stopped", what=f"{n} stopped")
        m = c.wait_for(f"/v1/machines/{mid}", lambda m: m["entitlement"] is None, what="back in the free pool")
        assert m["alloc"] == {"tasks": 0, "cpus": 0.0, "memory_mb": 0}, m
        assert machine_revision(c, etcd_server.port, mid) > taken, "given back: its record says so"
    finally:
        if agents is not None:
            agents.__exit__(None, None, None)
        c.close()
