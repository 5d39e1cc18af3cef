"""A machine is clean before it is free (issue #12): real etcd, a real twine-controld, simulated
agents (named so: no containers; tests/e2e/test_region.py has the same with real agents and
Docker). A machine cut off while its tasks move keeps them as tombstones: it stays in its
entitlement, unhealthy, granted to nobody, until its agent reports the old copies gone."""

from __future__ import annotations

import time

import pytest

from controlplane.health.check import NO_HEARTBEAT, cleared
from controlplane.broker.pool import back_to_pool
from controlplane.store.records import MachineRec
from controlplane.health.tombstones import STALE, gone
from tests.controlplane.controld_proc import Controld, daemon_with_sim_agents
from tests.controlplane.simagents import SimAgents

SMALL = {"image": "twine/busybox:1", "command": ["sleep", "3600"], "cpus": 1.0, "memory_mb": 64}
WHOLE = {**SMALL, "cpus": 4.0}  # a whole machine: a task of it needs a machine of its own


@pytest.fixture
def region(tmp_path, etcd_server):
    with daemon_with_sim_agents(tmp_path, etcd_server.port, ("x1", "x2", "x3"), heartbeat_timeout=1.0) as (c, agents):
        yield c, agents


def machine(c: Controld, mid: str) -> dict:
    status, m = c.call("GET", f"/v1/machines/{mid}")
    assert status == 200, m
    return m


def cut_off_while_its_task_moves(c: Controld, agents: SimAgents) -> tuple[str, str]:
    """Entitlement a's one task runs on a machine; that machine is cut off until the task runs on
    another. Returns (the cut machine, where the task runs now)."""
    assert c.call("POST", "/v1/entitlements", {"name": "a", "machine_type": "generic", "quota": 2})[0] == 201
    assert c.call("POST", "/v1/jobs", {"entitlement": "a", "name": "svc", "count": 1, "task": SMALL})[0] == 201
    job = c.wait_for("/v1/jobs/a/svc", lambda j: j["summary"] == {"running": 1}, what="a/svc running")
    victim = job["tasks"][0]["machine"]
    agents.cut.add(victim)
    job = c.wait_for("/v1/jobs/a/svc", lambda j: j["tasks"][0]["machine"] not in (None, victim)
                     and j["summary"] == {"running": 1}, what="a/svc running on another machine")
    return victim, job["tasks"][0]["machine"]


def test_a_machine_back_with_stale_copies_is_granted_to_nobody_until_they_are_gone(region):
    c, agents = region
    agents.stop_delay = 3.0  # the stale copy takes 3 s to stop once its agent knows
    victim, now_on = cut_off_while_its_task_moves(c, agents)
    m = machine(c, victim)
    assert [{k: v for k, v in t.items() if k != "since"} for t in m["tombstones"]] == \
        [{"job": "a/svc", "index": 0, "cpus": 1.0, "memory_mb": 64}]
    assert m["entitlement"] == "a" and m["alloc"] == {"tasks": 1, "cpus": 1.0, "memory_mb": 64}
    assert not m["healthy"]

    # the third machine is taken whole by c: the victim is the only one b could be granted
    for name in ("b", "c"):
        assert c.call("POST", "/v1/entitlements", {"name": name, "machine_type": "generic", "quota": 1})[0] == 201
    assert c.call("POST", "/v1/jobs", {"entitlement": "c", "name": "big", "count": 1, "task": WHOLE})[0] == 201
    c.wait_for("/v1/jobs/c/big", lambda j: j["summary"] == {"running": 1}, what="c/big running")
    b_job = {"entitlement": "b", "name": "big", "count": 1, "task": WHOLE}
    assert c.call("POST", "/v1/jobs", b_job)[1]["error"] == "no_placement"

    agents.cut.discard(victim)  # the partition heals: the agent reports its stale copy while it stops it
    deadline = time.monotonic() + 20
    refused_while_stale = looked_while_stale = said_stale = 0
    while time.monotonic() < deadline:
        # each answer is read before the agent's stale copies: a copy still reported after the
        # answer was there all the while the daemon made it
        status, body = c.call("POST", "/v1/jobs", b_job)
        stale = dict(agents.stale[victim])
        if status == 201:
            assert not stale, f"b was granted {victim} while its stale copy of a/svc still ran: {stale}"
            break
        assert body["error"] == "no_placement", body
        refused_while_stale += bool(stale)
        m = machine(c, victim)
        if agents.stale[victim]:
            looked_while_stale += 1
            assert m["entitlement"] == "a" and m["tombstones"] and not m["healthy"], m
            # "no heartbeat" until its first heartbeat after the heal is judged, then "stale tasks"
            assert m["health_reason"].startswith(("stale tasks", "no heartbeat")), m
            said_stale += m["health_reason"].startswith("stale tasks")
        time.sleep(0.1)
    assert refused_while_stale >= 5 and looked_while_stale >= 5, "the stale copy was seen for a while (3 s) after the heal"
    assert said_stale >= 3, "back and heard from, the machine said why it was still unhealthy"
    job = c.wait_for("/v1/jobs/b/big", lambda j: j["summary"] == {"running": 1}, what="b/big running")
    assert job["tasks"][0]["machine"] == victim
    m = machine(c, victim)
    assert m["healthy"] and m["tombstones"] == [] and m["entitlement"] == "b", m
    assert m["alloc"] == {"tasks": 1, "cpus": 4.0, "memory_mb": 64}, "the tombstone's resources were freed"
    events = c.call("GET", "/v1/events")[1]["events"]
    failures = [e for e in events if e["kind"] == "failure" and victim in e["machines"]]
    assert len(failures) == 1 and failures[0]["end"] is not None, failures
    assert c.call("GET", "/v1/jobs/a/svc")[1]["tasks"][0]["machine"] == now_on, "a's task stayed where it moved"


def test_an_admin_cleans_a_machine_gone_for_good(region):
    c, agents = region
    victim, _ = cut_off_while_its_task_moves(c, agents)
    assert machine(c, victim)["entitlement"] == "a"
    # an owner may not say so; an admin may
    status, body = c.call("POST", "/v1/tokens", {"role": "owner", "entitlements": ["a"]})
    assert status == 201, body
    assert c.call("POST", f"/v1/machines/{victim}/clean", token=body["token"])[0] == 403
    status, m = c.call("POST", f"/v1/machines/{victim}/clean")
    assert status == 200, m
    assert m["tombstones"] == [] and m["entitlement"] is None and m["alloc"]["tasks"] == 0, m
    assert not m["healthy"] and m["health_reason"].startswith("no heartbeat"), "still silent: still unhealthy"
    assert c.call("POST", "/v1/machines/nope/clean")[0] == 404


# -- the rules themselves, without a daemon ----------------------------------------------------

def machine_with(tombstones: list, reason: str = f"{NO_HEARTBEAT} for 3.0s") -> MachineRec:
    return MachineRec("m", "m", {}, {"cpus": 4, "memory_mb": 4096}, entitlement="a", healthy=False, health_reason=reason,
                      tombstones=tuple(tuple(t) for t in tombstones))


def test_only_a_report_newer_than_a_tombstone_speaks_for_it():
    rec = machine_with([("a/svc", 0, 1.0, 64, 100.0), ("a/svc", 1, 1.0, 64, 200.0)])
    assert gone(rec, None, 300.0) == () and gone(rec, {}, None) == ()
    assert gone(rec, {}, 150.0) == (("a/svc", 0, 1.0, 64, 100.0),), "a report from before the outage says nothing"
    assert gone(rec, {("a/svc", 1): {}}, 300.0) == (("a/svc", 0, 1.0, 64, 100.0),), "a listed copy is still there"
    assert len(gone(rec, {}, 300.0)) == 2


def test_a_machine_heard_from_is_healthy_only_once_its_tombstones_are_gone():
    rec = machine_with([("a/svc", 0, 1.0, 64, 100.0)])  # one task still placed there, one tombstone
    back = cleared(rec, {("a/svc", 0): {}}, 300.0, tasks=1)
    assert not back.healthy and back.health_reason.startswith(STALE) and back.tombstones == rec.tombstones
    clean = cleared(back, {}, 300.0, tasks=1)
    assert clean.healthy and clean.health_reason == "" and clean.tombstones == ()
    assert clean.entitlement == "a", "the task still placed there keeps the machine in its entitlement"
    only = machine_with([("a/svc", 0, 1.0, 64, 100.0)])
    freed = cleared(only, {}, 300.0, tasks=0)
    assert freed.healthy and freed.entitlement is None, "back to the pool"
    # an admin's clean of a silent machine frees it, but it stays unhealthy until it is heard from
    forgotten = cleared(only, None, None, tasks=0, forget=True)
    assert forgotten.tombstones == () and forgotten.entitlement is None and not forgotten.healthy
    assert cleared(machine_with([], reason="profile failed"), {}, 300.0, tasks=1).health_reason == "profile failed", \
        "only silence and tombstones are ended by a report"


def test_a_machine_leaves_its_entitlement_only_holding_nothing():
    assert back_to_pool({"entitlement": "a", "tombstones": [["a/svc", 0, 1.0, 64, 1.0]]}, 0) is None
    assert back_to_pool({"entitlement": "a", "tombstones": []}, 1) is None
    assert back_to_pool({"entitlement": None}, 0) is None
    m = {"entitlement": "a", "tombstones": []}
    assert back_to_pool(m, 0) == "a" and m["entitlement"] is None
