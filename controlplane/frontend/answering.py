"""What the API shows of the records: a view is a record as an answer holds it (answers.py declares
each), made from the region's view and, for a job, its shard leader's work on it."""

from __future__ import annotations

from controlplane.broker.agents import AgentService
from controlplane.capacity.reclaim import Budget
from controlplane.rollouts.record import summary
from controlplane.store.jobsecrets import redact_task
from controlplane.store.records import JobRec, TaskRec
from controlplane.store.state import RegionState

NO_WORK = {"message": "", "operations": {"held": [], "waiting": [], "rate_limited": 0}, "taskcontrol": None}


def task_answer(state: RegionState, t: TaskRec) -> dict:
    m = state.machines.get(t.machine) if t.machine else None
    where = {k: m.labels[k] for k in ("dc", "msb", "rack")} if m else None
    out = {"job": t.job, "index": t.index, "spec_version": t.spec_version, "machine": t.machine, "where": where,
           "state": t.state, "reason": t.reason, "discovery": t.discovery, "since": t.since}
    if t.moving is not None:  # a ReBalancer move, make-before-break: its copy starting there
        out["moving"] = {"machine": t.moving.machine, "goal": t.moving.goal, "why": t.moving.why,
                         "since": t.moving.since}
    return out


def job_answer(state: RegionState, job: JobRec, work: dict | None) -> dict:
    """`work`: the job's status at the leader of its shard (Scheduler.status); None in a process
    that does not lead it."""
    tasks = sorted(state.tasks.get(job.handle, {}).values(), key=lambda t: t.index)
    summary: dict[str, int] = {}
    for t in tasks:
        summary[t.state] = summary.get(t.state, 0) + 1
    view = job.to_json()
    view["task"] = redact_task(view["task"])  # secret values go to the agent alone
    view["controller_token"] = None  # and the controller's token to the controller alone
    view["controller_token_set"] = job.controller_token is not None
    return {**view, "summary": summary, **(work or NO_WORK), "tasks": [task_answer(state, t) for t in tasks]}


def entitlement_answer(state: RegionState, name: str, detail: bool = False) -> dict:
    e = state.entitlements[name]
    machines = [m.id for m in state.machines_of(name)]
    out = {**e.to_json(), "held": len(machines)}
    if e.kind == "opportunistic":  # its disruption budget in force: what it set, the defaults for the rest
        b = Budget().of(e)
        out["reclaim"] = {"max_machines": b.machines, "max_percent": b.percent, "cooldown": b.cooldown}
    r = state.rollouts.get(name)
    out["rollout_state"] = summary(r) if r is not None else None
    if detail:
        out["machines"] = machines
        out["jobs"] = sorted(h for h, j in state.jobs.items() if j.entitlement == name)
    return out


def machine_answer(state: RegionState, agents: AgentService, mid: str, detail: bool = False) -> dict:
    m = state.machines[mid]
    n, cpus, mem = state.allocated(mid)
    out = {
        "id": m.id, "hostname": m.hostname, "labels": m.labels, "capacity": m.capacity, "entitlement": m.entitlement,
        "healthy": m.healthy, "health_reason": m.health_reason,
        "profile": {"desired": state.desired_profile(m), "applied": m.profile_applied, "hash": m.profile_hash,
                    "ok": m.profile_ok, "error": m.profile_error},
        "alloc": {"tasks": n, "cpus": cpus, "memory_mb": mem},
        "tombstones": [{"job": j, "index": i, "cpus": c, "memory_mb": mem, "since": at} for j, i, c, mem, at in m.tombstones],
        "agent": {"address": m.address, "version": m.agent_version, "error": agents.error_of(mid)},
        "last_heartbeat": agents.last_heartbeat(mid),
    }
    if detail:
        out["tasks"] = [task_answer(state, t) for t in state.tasks_on(mid)]
        out["desired_version"] = state.desired_for(mid, open_secrets=False)["version"]
    return out
