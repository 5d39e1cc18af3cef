"""Bodies shaped as the daemon answers them (test_api_document.py checks them against the served
document's answer schemas): what the render tests print and what the ContractServer answers.
Times are seconds since the epoch, as the daemon gives them."""

from __future__ import annotations

import copy

T0 = 1714561200.0  # 2024-05-01T11:00:00Z

ENTITLEMENT = {
    "name": "web", "owner": "team-web", "machine_type": "c2.large", "quota": 10, "profile": "web",
    "spread": {"properties": ["dc", "msb"], "pinned_dc": None}, "shard": 3, "created_at": T0,
    "allow_host_network": False, "allow_controller_networks": [], "rollout": None, "held": 4,
    "kind": "guaranteed", "notice": 120.0,
}
ENTITLEMENT_DETAIL = dict(ENTITLEMENT, machines=["m-001", "m-002", "m-003", "m-004"], jobs=["web/frontend"])
ENTITLEMENTS = {"entitlements": [
    ENTITLEMENT,
    {"name": "batch-analytics", "owner": "", "machine_type": "m5.xlarge", "quota": 200, "profile": None,
     "spread": {"properties": ["msb"], "pinned_dc": "dc2"}, "shard": 0, "created_at": T0, "allow_host_network": False, "allow_controller_networks": [], "rollout": None,
     "held": 0, "kind": "opportunistic", "notice": 300.0},
]}


def task(index: int, state: str = "running", spec_version: int = 2, machine: str | None = "m-001",
         reason: str = "") -> dict:
    return {"job": "web/frontend", "index": index, "spec_version": spec_version, "machine": machine,
            "where": {"dc": "dc1", "msb": f"msb{index}", "rack": f"r{index}"} if machine else None,
            "state": state, "reason": reason, "discovery": state == "running", "since": T0 + 3600}


def job(tasks: list[dict] | None = None, state: str = "active", count: int = 3, spec_version: int = 2,
        message: str = "") -> dict:
    body = {
        "handle": "web/frontend", "entitlement": "web", "name": "frontend", "count": count,
        "task": {"image": "twine/busybox:1", "command": ["sh", "-c", "httpd -f -p 8080"], "env": {"GREETING": "hello"},
                 "cpus": 0.5, "memory_mb": 64, "pids": 256, "network_mode": "bridge"},
        "requirements": {"machine_type": None, "dc": None},
        "preferences": [{"property": "msb", "strategy": "spread", "weight": 1.0}],
        "update": {"max_unavailable": 1, "reprofile": "stop"}, "controller": None, "controller_token": None, "controller_token_set": False,
        "autoscale": None, "gaps": [],
        "spec_version": spec_version, "state": state, "created_at": T0, "updated_at": T0 + 3600,
        "summary": {"running": 0, "pending": 0}, "message": message,
        "operations": {"held": [], "waiting": [], "rate_limited": 0}, "taskcontrol": None,
    }
    if tasks is not None:
        body["tasks"] = tasks
        body["summary"] = {"running": sum(t["state"] == "running" for t in tasks),
                           "pending": sum(t["state"] == "pending" for t in tasks)}
    return body


JOB_RUNNING = job([task(0, machine="m-001"), task(1, machine="m-002"), task(2, machine="m-003")])
JOB_ROLLING = job([task(0, machine="m-001"), task(1, spec_version=1, machine="m-002"),
                   task(2, state="pending", machine=None, reason="no machine with 0.5 cpus free in msb2")],
                  message="rolling update to spec version 2")
JOBS = {"jobs": [job(count=3), dict(job(count=1, state="stopping"), handle="batch-analytics/etl")]}

MACHINE = {
    "id": "m-001", "hostname": "host-001.dc1",
    "labels": {"region": "eu", "dc": "dc1", "msb": "msb0", "rack": "r0", "machine_type": "c2.large"},
    "capacity": {"cpus": 8, "memory_mb": 16384, "disk_gb": 200, "hugepage_sizes_kb": [2048],
                 "cgroup_version": 2, "supports": ["hugepages", "sysctl"]},
    "entitlement": "web", "healthy": True, "health_reason": "",
    "profile": {"desired": "web", "applied": "web", "hash": "5e0f6c2d", "ok": True, "error": ""},
    "alloc": {"tasks": 2, "cpus": 1.5, "memory_mb": 128}, "tombstones": [],
    "agent": {"address": "10.0.0.1:7070", "version": "0.1.0", "error": ""}, "last_heartbeat": T0 + 3605,
}
MACHINES = {"machines": [
    MACHINE,
    dict(MACHINE, id="m-002", hostname="host-002.dc1", entitlement=None, healthy=False, health_reason="docker is down",
         profile={"desired": "web", "applied": None, "hash": None, "ok": False, "error": "sysctl: permission denied"},
         alloc={"tasks": 0, "cpus": 0, "memory_mb": 0}),
]}
MACHINE_DETAIL = dict(MACHINE, tasks=[task(0), task(3, state="starting")])

EVENTS = {"events": [
    {"id": "ev-1", "kind": "maintenance", "machines": ["m-001", "m-002", "m-003", "m-004", "m-005"],
     "start": T0 + 72000, "duration": 5400, "deadline": T0 + 68400, "end": None,
     "reason": "kernel upgrade", "scope": "msb dc1/msb0", "policy": None, "created": T0, "heir": None, "cause": ""},
    {"id": "ev-2", "kind": "failure", "machines": ["m-009"], "start": 1714550400, "duration": 30,
     "deadline": None, "end": 1714550430, "reason": "power supply", "scope": "", "policy": None,
     "created": 1714550400, "heir": None, "cause": ""},
    {"id": "reclaim-1714550500-a1b2c3", "kind": "reclaim", "machines": ["m-010"], "start": 1714550500,
     "duration": None, "deadline": 1714550620, "end": None, "reason": "web/api: 1 task(s) found no machine",
     "scope": "batch", "policy": None, "created": 1714550500, "heir": "web", "cause": "demand"},
]}

DISCOVERY = {"job": "web/frontend", "endpoints": [
    {"job": "web/frontend", "index": 1, "machine": "m-002", "address": "10.0.0.2:31001", "enabled": True,
     "spec_version": 2},
    {"job": "web/frontend", "index": 0, "machine": "m-001", "address": "10.0.0.1:31000", "enabled": False,
     "spec_version": 2},
]}


def error(kind: str, field: str | None, why: str) -> dict:
    return {"error": kind, "field": field, "why": why}


def fresh(body: dict) -> dict:
    return copy.deepcopy(body)
